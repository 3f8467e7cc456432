"""What a step costs and what fits in memory: the engine's roofline, the kernel-level model of `sim step` and
its fit, KV capacity, and what LoRA adapters and speculative proposers add."""
