"""The records' schema: a request's final states, the request and step columns, the chunk size."""

from __future__ import annotations

FINISHED, REJECTED, IN_FLIGHT = "finished", "rejected", "in_flight"


QUEUE_FULL = "queue full"  # the reject reason of admission control: load turned away, not a request too big


LATENCY_METRICS = ("queue_wait", "ttft", "itl", "tpot", "e2e")


QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


REQUEST_FLOAT_COLUMNS = (
    "arrival", "scheduled_at", "first_token_at", "finished_at", "queue_wait", "ttft", "e2e", "tpot",
    "itl_mean", "itl_p50", "itl_p99", "itl_max", "normalized_latency",
)  # fmt: skip


REQUEST_INT_COLUMNS = (
    "id", "prompt_len", "output_len", "max_tokens", "n", "generated_tokens", "preemptions", "prefix_group",
    "prefix_hit_tokens", "prefix_query_tokens",
)  # fmt: skip


STEP_INT_COLUMNS = (
    "batch_size", "prefill_tokens", "decode_tokens", "kv_used", "kv_allocated", "kv_capacity", "preempted",
    "compute_bound",
)  # fmt: skip


# What is stored per request (derived columns are computed in bulk by `requests_frame`).
REQ_STORED_FLOATS = ("arrival", "scheduled_at", "first_token_at", "last_token_at", "finished_at",
                      "itl_p50", "itl_p99", "itl_max")  # fmt: skip


REQ_STORED_INTS = ("prompt_len", "output_len", "max_tokens", "n", "num_generated", "preemptions",
                    "prefix_group", "prefix_hit_tokens", "prefix_query_tokens")  # fmt: skip


STEP_STORED_INTS = ("batch_size", "prefill_tokens", "decode_tokens", "kv_used", "kv_allocated",
                     "preempted", "waiting")  # fmt: skip


WAITING_INDEX = STEP_STORED_INTS.index("waiting")


STATES = (FINISHED, REJECTED, IN_FLIGHT)


STATE_CODE = {name: i for i, name in enumerate(STATES)}


CHUNK_ROWS = 1 << 16  # rows per chunk of records handed to the sink
