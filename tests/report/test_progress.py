"""The progress display: plain lines (sparse, one per phase change or interval), the
terminal/CI choice, the rich bar, and the monitor reading records files incrementally."""

from __future__ import annotations

import io
import logging
import sys

from rich.console import Console

from harness.load.records import append_record, worker_records_path
from harness.metrics.progress import LiveState, fold, snapshot
from harness.report.progress import (PhaseStatus, PlainRenderer, ProgressMonitor, RichRenderer, format_line,
                                     make_renderer, wants_plain)
from tests.factories import fail, make_record


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def snap(phase="baseline", elapsed=12.0, planned=30.0, limit=False, recs=(), now=100.0):
    st = fold(LiveState(started_at=0.0), list(recs), now=now)
    return snapshot(st, phase=phase, elapsed_s=elapsed, planned_s=planned, planned_is_limit=limit, now=now)


def test_format_line_names_every_figure():
    recs = [make_record(send_time=99.0, ttft=0.104, chunk_tokens=[1] * 8, tail_s=0.0), fail(send_time=99.5)]
    line = format_line(snap(recs=recs))
    assert line == "baseline 12/30 s · 2 requests · 1 errors · p95 TTFT 104 ms (n=1, last 10 s) · 1 tok/s"
    assert format_line(snap("fault", 3, 120, True)).startswith("fault 3/≤120 s · 0 requests")
    assert "p95 TTFT — (n=0" in format_line(snap("start-up", 4, None))
    assert format_line(snap("start-up", 4, None)).startswith("start-up 4 s ·")


def test_plain_renderer_is_sparse():
    out, clock = io.StringIO(), Clock()
    r = PlainRenderer(out, interval_s=30.0, clock=clock)
    for i in range(100):              # 25 s of updates 4 per second in one phase: one line
        clock.t = i * 0.25
        r.update(snap("baseline", elapsed=clock.t))
    assert len(out.getvalue().splitlines()) == 1
    clock.t = 31.0                    # a long phase: one more line per interval
    r.update(snap("baseline", elapsed=31))
    clock.t = 31.5                    # each phase change: a line at once
    r.update(snap("fault", elapsed=0))
    r.update(snap("fault", elapsed=0.5))
    clock.t = 32.0
    r.update(snap("recovery", elapsed=0))
    clock.t = 40.0
    r.close(snap("recovery", elapsed=8))   # a last line with the final figures
    lines = out.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == ["baseline", "baseline", "fault", "recovery", "recovery"]
    assert lines[2].endswith("(baseline: 0 requests, 0 errors in 31 s)")   # the phase that ended
    assert lines[3].endswith("(fault: 0 requests, 0 errors in 0 s)") and lines[0].endswith("tok/s")
    assert all(ln.startswith("progress: ") for ln in lines)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_when_not_a_terminal_or_under_ci():
    assert wants_plain(io.StringIO(), {})
    assert not wants_plain(FakeTTY(), {})
    assert wants_plain(FakeTTY(), {"CI": "true"})
    assert wants_plain(FakeTTY(), {"TERM": "dumb"})
    assert not wants_plain(FakeTTY(), {"CI": "false"})
    assert isinstance(make_renderer(io.StringIO(), {}), PlainRenderer)
    assert isinstance(make_renderer(FakeTTY(), {"CI": "1"}), PlainRenderer)


def test_rich_renderer_draws_and_restores_stderr_logging():
    buf = io.StringIO()
    r = RichRenderer(Console(file=buf, force_terminal=True, width=160))
    handler = logging.StreamHandler(sys.__stderr__)
    logging.getLogger().addHandler(handler)
    try:
        r.update(snap("baseline", 3, 30))
        assert handler.stream is not sys.__stderr__     # log lines go through rich while it draws
        r.update(snap("fault", 1, 120, True))
        r.close(snap("fault", 2, 120, True))
        assert handler.stream is sys.__stderr__
    finally:
        logging.getLogger().removeHandler(handler)
    text = buf.getvalue()
    assert "baseline" in text and "fault" in text and "2/≤120 s" in text and "tok/s" in text


def test_monitor_reads_new_records_of_every_file(tmp_path):
    path = tmp_path / "records.jsonl"
    out = io.StringIO()
    status = {"now": PhaseStatus("warm-up", 5.0)}
    mon = ProgressMonitor(path, lambda: status["now"], PlainRenderer(out, interval_s=1e9))
    assert mon.look().requests == 0                     # no file yet: nothing, no error
    append_record(path, make_record(send_time=mon.state.started_at))
    append_record(worker_records_path(path, 1), fail(send_time=mon.state.started_at))
    s1 = mon.look()
    assert (s1.phase, s1.requests, s1.errors) == ("warm-up", 2, 1)
    with open(worker_records_path(path, 0), "w") as fh:   # a line still being written
        fh.write(make_record().to_json()[:30])
    append_record(path, make_record(send_time=mon.state.started_at - 1.0))   # ended just before the change
    status["now"] = PhaseStatus("baseline", 30.0)
    s2 = mon.look()
    assert (s2.phase, s2.requests, s2.total_requests) == ("baseline", 0, 3)
    assert "(warm-up: 3 requests, 1 errors in" in out.getvalue()   # it counts for the phase that ended
    with open(worker_records_path(path, 0), "a") as fh:   # ... finished now: read once
        fh.write(make_record().to_json()[30:] + "\n")
    assert mon.look().requests == 1 and mon.look().requests == 1
    t = mon.state.started_at   # a phase whose start is known: each record goes by when it ended
    append_record(path, make_record(send_time=t + 1.0, ttft=0.1, tail_s=0.0))    # ended at t+1.25: baseline
    append_record(path, fail(send_time=t + 2.0, after_s=0.5))                      # ended at t+2.5: fault
    status["now"] = PhaseStatus("fault", 120.0, True, started_at=t + 2.0)
    s3 = mon.look()
    assert (s3.phase, s3.requests, s3.errors) == ("fault", 1, 1)
    assert "(baseline: 2 requests, 0 errors in" in out.getvalue()
    status["now"] = None                                  # nothing to show: nothing rendered
    assert mon.look() is None
    mon.start()
    mon.stop()
    mon.stop()
    phases = [ln.split()[1] for ln in out.getvalue().splitlines()]
    assert phases[:3] == ["warm-up", "baseline", "fault"] and phases[3:] in ([], ["fault"])   # + close's last line
