"""The realistic bounds of telemetry record fields: past one, a record is no measurement.

:func:`governor_telemetry.records.validate_record` (and the column checks of
:mod:`controllers.record_columns`) dead-letter a record with a field past its
bound, naming the field.  The bounds keep one record, and the sums of a
window of records, far from the 64-bit limits: one valid ``prompt_tokens =
2**63 - 1`` overflowed its window, which the control agent then refused
(issue #31).  A field without a bound here is bounded by its type: an int by
int64, a number by being finite (and some by their own rule, such as
``gpu_util`` in [0, 1]).

>>> MAXIMA["request"]["e2e_ms"], MAXIMA["gpu"]["queue_len"] == MAX_COUNT
(604800000, True)
"""

from __future__ import annotations

import sys

__all__ = ["FLOAT_MAX", "MAXIMA", "MAX_BYTES", "MAX_COUNT", "MAX_DURATION_MS", "MAX_TOKENS", "MAX_TS_MS"]

FLOAT_MAX = sys.float_info.max  # a number without a bound: finite
MAX_TS_MS = 2**53  # a time stamp (the year 287,396), exact in float64
MAX_DURATION_MS = 7 * 86_400_000  # a latency or duration: one week
MAX_TOKENS = 2**31  # tokens of one request, KV blocks it hit
MAX_COUNT = 2**31  # queue length, running requests, KV blocks of one replica
MAX_BYTES = 2**53  # bytes of one replica (8 PiB), and the allocator's layout generation
_DURATIONS = ("queue_ms", "network_ms", "preprocess_ms", "ttft_ms", "itl_ms", "decode_ms", "e2e_ms")
MAXIMA: dict[str, dict[str, float]] = {
    "request": {
        "ts_ms": MAX_TS_MS,
        "arrival_ms": MAX_TS_MS,
        **dict.fromkeys(_DURATIONS, MAX_DURATION_MS),
        **dict.fromkeys(("prompt_tokens", "output_tokens", "kv_hit_blocks"), MAX_TOKENS),
    },
    "gpu": {
        "ts_ms": MAX_TS_MS,
        **dict.fromkeys(("kv_blocks_used", "kv_blocks_total", "queue_len", "running"), MAX_COUNT),
        **dict.fromkeys(
            ("mem_used_bytes", "mem_total_bytes", "largest_free_block_bytes", "kv_free_bytes", "kv_waiting_bytes"),
            MAX_BYTES,
        ),
        "kv_generation": MAX_BYTES,
    },
}
