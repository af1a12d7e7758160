import json
import threading

from faults.base import Evidence
from faults.ledger import Ledger


def test_transitions_fold_by_id(tmp_path):
    led = Ledger(tmp_path / "sub" / "ledger.jsonl")
    a = led.intend("process-kill", "spec/worker", {"signal": "SIGKILL"})
    b = led.intend("process-kill", "ref/engine", {"signal": "SIGTERM"})
    assert a != b and a.startswith("process-kill-")
    led.injected(a, {"pids": [1]})
    led.evidence(a, Evidence(True, {"gone_after_s": 0.1}, "gone"))
    led.cleared(a)
    led.failed(b, "FaultError: boom")

    by_id = {e["fault_id"]: e for e in led.entries()}
    ea, eb = by_id[a], by_id[b]
    assert ea["kind"] == "process-kill" and ea["target"] == "spec/worker"
    assert ea["params"] == {"signal": "SIGKILL"} and ea["facts"] == {"pids": [1]}
    assert ea["state"] == "cleared"
    assert ea["intended_at"] <= ea["injected_at"] <= ea["cleared_at"]
    assert ea["evidence"] == {"acted": True, "observations": {"gone_after_s": 0.1}, "detail": "gone"}
    assert eb["state"] == "failed" and eb["error"] == "FaultError: boom" and eb["injected_at"] is None
    assert [e["fault_id"] for e in led.open_faults()] == [b]


def test_intent_is_on_disk_at_once_and_evidence_keeps_state(tmp_path):
    path = tmp_path / "ledger.jsonl"
    led = Ledger(path)
    fid = led.intend("k", "t", {})
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [{"t": lines[0]["t"], "fault_id": fid, "event": "intended", "kind": "k", "target": "t", "params": {},
                     "system": {}}]
    led.injected(fid, {})
    led.evidence(fid, Evidence(False))
    assert led.entries()[0]["state"] == "injected"
    assert Ledger(path).open_faults()[0]["fault_id"] == fid  # a fresh reader sees the same


def test_torn_last_line_and_missing_file(tmp_path):
    path = tmp_path / "ledger.jsonl"
    assert Ledger(path).entries() == []
    led = Ledger(path)
    fid = led.intend("k", "t", {})
    with path.open("a") as fh:
        fh.write('{"t": 1, "fault_id": "x", "ev')  # a crash mid-write
    assert [e["fault_id"] for e in Ledger(path).entries()] == [fid]


def test_concurrent_writers_do_not_interleave(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")

    def work():
        for _ in range(20):
            led.cleared(led.intend("k", "t", {"x": "y" * 200}))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = led.entries()
    assert len(entries) == 80 and led.open_faults() == []
    assert len(led.raw()) == 160
