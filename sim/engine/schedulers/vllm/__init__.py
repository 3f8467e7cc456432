"""The `vllm` and `sarathi` policies: vLLM v1's scheduler over the paged KV cache (scheduler.py holds the
scheduler and maps its parts), with speculative decoding as a variant (spec.py).

Importing the package registers both policies and the variant, as the policy registry expects of a module.
"""

from sim.engine.schedulers.vllm import scheduler, spec

__all__ = ["scheduler", "spec"]
