"""What the simulator can represent: bounds on every number a scenario, trace or model config may hold.

Values past these bounds are refused with a clear error rather than overflowing int64 token arithmetic,
losing float precision on the clock, or running until memory is gone. `sim.studies.run_size` uses the run
limits to refuse, unless `--force`, a run whose estimated size is larger than they allow.
"""

from __future__ import annotations

MAX_TOKENS = 2**24  # tokens in one request: prompt, output, max_tokens, max_model_len, prefix_len
MAX_SECONDS = 1e8  # any time in seconds: durations, think times, trace arrivals (about three years)
MAX_RATE = 1e6  # requests per second
MAX_COUNT = 10**7  # users, prefix groups, queue limits, parallel samples
MAX_ID = 2**53 - 1  # integer ids read from files: every larger one reads as 2**53 or more in float64
MAX_REQUESTS_CAP = 10**12  # horizon.max_requests: a cap, so far above what a run may actually hold
MAX_KV_BLOCKS = 2**22  # KV blocks of one replica (each is an object in memory)
MAX_BLOCK_SIZE = 4096  # tokens per KV block
MAX_MODEL_DIM = 2**24  # any width, count or size field of a model config.json

# A run larger than this is refused unless `--force`: about 2 GB of records and a minute of CPU time
# per million requests on one core.
RUN_MAX_REQUESTS = 1_000_000
RUN_MAX_TOKENS = 10**9  # prompt + output tokens of all requests
RUN_MAX_KV_BLOCKS = 2**24  # KV blocks of the replicas a fleet's requests reach (about 200 bytes each)
MAX_PARALLEL_SAMPLES = 1024  # workload.n: sequences generated per request
