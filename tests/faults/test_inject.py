"""The generic driver, with small in-test fault families registered for the test only."""

from typing import Any, ClassVar

import pytest

from faults.base import Evidence, Fault, FaultParams
from faults.ledger import Ledger, read_ledger_lines
from faults.registry import REGISTRY
from harness.errors import ExperimentError, FaultError
from harness.timeline import read_timeline


class FlagParams(FaultParams):
    name: str
    fail_inject: bool = False
    fail_clear: bool = False
    fail_evidence: bool = False


class Flag(Fault):
    """Sets FLAGS[name] while injected; can be told to fail at each step."""

    kind: ClassVar[str] = "test-flag"
    Params: ClassVar[type[FaultParams]] = FlagParams
    FLAGS: ClassVar[dict[str, bool]] = {}
    SEEN_ON_DISK: ClassVar[list[list[dict[str, Any]]]] = []

    def describe_target(self, ctx):
        return f"flag/{self.params.name}"

    def inject(self, ctx):
        # What was on disk when the fault was about to act?
        Flag.SEEN_ON_DISK.append(read_ledger_lines(ctx.ledger.path))
        if self.params.fail_inject:
            Flag.FLAGS[self.params.name] = True  # half-acted, then fails
            raise RuntimeError("device busy")
        Flag.FLAGS[self.params.name] = True
        return {"previous": False, "t": "not-a-timeline-field"}

    def evidence(self, ctx, timeout_s):
        if self.params.fail_evidence:
            raise FaultError("cannot measure", hint="check the probe")
        return Evidence(Flag.FLAGS.get(self.params.name, False), {"flag": Flag.FLAGS.get(self.params.name)}, "flag set")

    def clear(self, ctx):
        if self.params.fail_clear:
            raise RuntimeError("clear broke")
        Flag.FLAGS[self.params.name] = False


@pytest.fixture(autouse=True)
def flag_family(monkeypatch):
    monkeypatch.setitem(REGISTRY, Flag.kind, Flag)
    Flag.FLAGS.clear()
    Flag.SEEN_ON_DISK.clear()


def test_ledger_intent_is_on_disk_before_the_fault_acts(make_injector, tmp_path):
    inj = make_injector()
    with pytest.raises(FaultError) as ei:
        inj.inject("test-flag", {"name": "a", "fail_inject": True}, where="exp.yaml: method[0]")
    assert "device busy" in ei.value.message and ei.value.where == "exp.yaml: method[0]"
    (seen,) = Flag.SEEN_ON_DISK
    assert [(x["event"], x["kind"], x["target"]) for x in seen] == [("intended", "test-flag", "flag/a")]
    lines = read_ledger_lines(tmp_path / "ledger.jsonl")
    assert [x["event"] for x in lines] == ["intended", "failed", "cleared"]
    assert "RuntimeError: device busy" in lines[1]["error"]
    assert Flag.FLAGS["a"] is False, "the half-acted fault was rolled back"
    assert read_timeline(tmp_path / "timeline.jsonl") == [], "a failed injection is not announced"


def test_failed_injection_whose_rollback_fails_stays_open(make_injector, tmp_path):
    inj = make_injector()
    with pytest.raises(FaultError):
        inj.inject("test-flag", {"name": "a", "fail_inject": True, "fail_clear": True})
    (e,) = Ledger(tmp_path / "ledger.jsonl").open_faults()
    assert e["state"] == "failed" and "clear failed" in e["error"]
    assert inj.clear_all() == [{"fault_id": e["fault_id"], "error": "RuntimeError: clear broke"}]


def test_invalid_arguments_record_nothing(make_injector, tmp_path):
    inj = make_injector()
    with pytest.raises(ExperimentError) as ei:
        inj.inject("test-flag", {}, where="x.yaml: method[0].provider")
    assert ei.value.where == "x.yaml: method[0].provider.arguments.name"
    with pytest.raises(ExperimentError):
        inj.inject("nope", {})
    assert not (tmp_path / "ledger.jsonl").exists() and inj.summary() == []


def test_inject_evidence_clear_cycle(make_injector, tmp_path):
    inj = make_injector()
    h = inj.inject("test-flag", {"name": "a"})
    assert Flag.FLAGS["a"] and h.facts == {"previous": False, "t": "not-a-timeline-field"}
    ev = inj.collect_evidence(h, 1)
    assert ev.acted
    inj.clear(h)
    inj.clear(h)
    assert Flag.FLAGS["a"] is False
    tl = read_timeline(tmp_path / "timeline.jsonl")
    assert [e["event"] for e in tl] == ["fault_injected", "fault_evidence", "fault_cleared"]
    assert tl[0]["t"] == h.injected_at and tl[0]["previous"] is False  # facts ride along, reserved keys do not
    assert tl[1] == {"t": tl[1]["t"], "source": "fault", "event": "fault_evidence", "fault_id": h.fault_id,
                     "acted": True, "evidence": {"acted": True, "observations": {"flag": True}, "detail": "flag set"}}
    assert tl[2]["fault_id"] == h.fault_id and tl[2]["t"] == h.cleared_at
    (s,) = inj.summary()
    assert s == {"fault_id": h.fault_id, "kind": "test-flag", "target": "flag/a", "injected_at": h.injected_at,
                 "cleared_at": h.cleared_at, "acted": True,
                 "evidence": {"acted": True, "observations": {"flag": True}, "detail": "flag set"}}


def test_evidence_error_means_not_acted(make_injector, tmp_path):
    inj = make_injector()
    h = inj.inject("test-flag", {"name": "a", "fail_evidence": True})
    ev = inj.collect_evidence(h, 1)
    assert ev.acted is False and "cannot measure" in ev.detail
    assert Ledger(tmp_path / "ledger.jsonl").entries()[0]["evidence"]["acted"] is False


def test_clear_all_clears_everything_even_if_one_clear_raises(make_injector, tmp_path):
    inj = make_injector()
    a = inj.inject("test-flag", {"name": "a"})
    b = inj.inject("test-flag", {"name": "b", "fail_clear": True})
    c = inj.inject("test-flag", {"name": "c"})
    inj.clear(a)
    failures = inj.clear_all()
    assert failures == [{"fault_id": b.fault_id, "error": "RuntimeError: clear broke"}]
    assert Flag.FLAGS == {"a": False, "b": True, "c": False}
    led = Ledger(tmp_path / "ledger.jsonl")
    assert [e["fault_id"] for e in led.open_faults()] == [b.fault_id]
    assert {e["fault_id"]: e["state"] for e in led.entries()} == {
        a.fault_id: "cleared", b.fault_id: "failed", c.fault_id: "cleared"}
    cleared = [e["fault_id"] for e in read_timeline(tmp_path / "timeline.jsonl") if e["event"] == "fault_cleared"]
    assert cleared == [a.fault_id, c.fault_id]


def test_context_manager_clears_on_exception(make_injector):
    with pytest.raises(KeyboardInterrupt):
        with make_injector() as inj:
            inj.inject("test-flag", {"name": "a"})
            raise KeyboardInterrupt
    assert Flag.FLAGS["a"] is False and inj.summary()[0]["cleared_at"] is not None
