"""One replica on a SimPy clock: the engine loop, the paged KV cache, the scheduling policies, and
speculative decoding and LoRA at run time."""
