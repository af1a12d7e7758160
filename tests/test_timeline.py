"""The timeline keeps its file open: every event is on disk as soon as emit returns, and
a closed timeline opens the file again at the next event."""

from __future__ import annotations

import threading

from harness.timeline import Timeline, read_timeline


def test_each_event_is_in_the_file_when_emit_returns(tmp_path):
    path = tmp_path / "timeline.jsonl"
    tl = Timeline(path)
    tl.emit("health", "health", t=2.0, server="spec", status=None, via="tcp")
    assert [e["event"] for e in read_timeline(path)] == ["health"]
    tl.emit("runner", "load_started", t=1.0)
    assert [e["event"] for e in read_timeline(path)] == ["load_started", "health"]
    tl.close()
    tl.close()
    tl.emit("runner", "load_stopped", t=3.0)
    assert [e["event"] for e in read_timeline(path)] == ["load_started", "health", "load_stopped"]


def test_threads_write_whole_lines(tmp_path):
    path = tmp_path / "timeline.jsonl"
    tl = Timeline(path)

    def burst(k: int) -> None:
        for i in range(200):
            tl.emit("health", "health", server=f"s{k}", i=i, pad="x" * 300)
    threads = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(read_timeline(path)) == 800 == len(path.read_text().splitlines())
