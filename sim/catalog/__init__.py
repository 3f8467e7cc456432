"""What the simulator knows about hardware and models: GPUs, links, number and weight formats, model specs
read from Hugging Face config.json files, and the data files beside them."""
