"""Synthetic load and health for the hang and liveness-truth checks: users sending
streaming requests back to back, optionally through a freeze (every chunk due inside
it arrives when it ends) or a kill (in-flight requests fail, then connections are
refused until the server is back)."""

from __future__ import annotations

from harness.load.records import RequestRecord
from tests.factories import ev, fail, make_record

CHUNKS = 8
TTFT_S = 0.1
GAP_S = 0.05


def users(start: float, stop: float, n: int = 4, freeze: tuple[float, float] | None = None,
          down: tuple[float, float] | None = None) -> list[RequestRecord]:
    """``n`` users from ``start`` to ``stop`` (epoch s), each request sent 0.01 s after the
    previous one ended, staggered by 0.03 s. ``freeze=(f0, f1)``: chunks due after ``f0``
    arrive ``f1 − f0`` later (nothing arrives inside the freeze, requests wait).
    ``down=(d0, d1)``: requests in flight at ``d0`` fail 0.3 s later; requests sent
    before ``d1`` are refused at once (``connect``, 1 ms), 0.1 s apart."""
    out = []
    for u in range(n):
        t = start + 0.03 * u
        while t < stop:
            if down and down[0] <= t < down[1]:
                out.append(fail(send_time=t, after_s=0.001, status=None, error="connect", user_id=u))
                t += 0.1
                continue
            offsets = [TTFT_S + GAP_S * i for i in range(CHUNKS)]
            if freeze and t < freeze[1]:     # the engine stands still from f0 to f1
                f0, f1 = freeze
                offsets = [o + (f1 - max(f0, t)) if t + o > f0 else o for o in offsets]
            if down and t < down[0] < t + offsets[-1]:
                kept = [o for o in offsets if t + o <= down[0]]
                out.append(fail(send_time=t, after_s=down[0] - t + 0.3, error="stream_error", status=200,
                                user_id=u, chunk_offsets_s=kept, chunk_tokens=[1] * len(kept),
                                ttft_s=kept[0] if kept else None))
                t = down[0] + 0.31
                continue
            r = make_record(send_time=t, ttft=offsets[0], gaps=[b - a for a, b in zip(offsets, offsets[1:])],
                            user_id=u)
            out.append(r)
            t = r.end_time + 0.01
    return out


def health(start: float, stop: float, status=200, every_s: float = 0.25, server: str = "spec") -> list[dict]:
    """``health`` samples of ``server`` every ``every_s`` from ``start`` to ``stop``;
    ``status`` is a value or a function of the sample time."""
    out, t = [], start
    while t < stop:
        out.append(ev(t, "health", source="health", server=server,
                      status=status(t) if callable(status) else status, latency_s=0.001))
        t = round(t + every_s, 6)
    return out
