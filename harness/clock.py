"""One clock for the whole harness.

Every instant recorded anywhere (request send times, fault injection, stack restarts,
health samples, phase boundaries) is wall-clock seconds since the epoch from
:func:`now`, so records written by the separate locust process line up with the
runner's timeline. Durations *inside* one process (TTFT, ITL...) are measured with
:func:`time.perf_counter` and stored in seconds.
"""

from __future__ import annotations

import time


def now() -> float:
    """Seconds since the epoch (float), the harness-wide timestamp."""
    return time.time()
