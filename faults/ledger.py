"""The fault ledger: an on-disk, append-only record of what every fault did.

One JSON object per line in ``OUT/ledger.jsonl``, written and ``fsync``'ed before the
call returns, so a run that crashes (or is SIGKILLed) still leaves what it injected
on disk for ``specchaos cleanup``. Each line is one state transition of one fault::

    {"t": <epoch s>, "fault_id": str, "event": "intended", "kind": str, "target": str, "params": {...},
     "system": {"launcher": str, "vllm_version": str, "server_vllm_version": str}}
    {"t": ..., "fault_id": ..., "event": "injected", "facts": {...}}
    {"t": ..., "fault_id": ..., "event": "evidence", "evidence": {"acted": bool, "observations": {...}, "detail": str}}
    {"t": ..., "fault_id": ..., "event": "failed", "error": str}
    {"t": ..., "fault_id": ..., "event": "cleared"}

``intended`` is always written *before* the fault acts; its ``system`` names what the
fault targets (the stack's launcher and the vLLM version it runs: ``"local"`` and a real
version for the embedded stack, ``"fake"`` for the test suite's fake vLLM; empty when the
fault has no stack; ``server_vllm_version``: what the spec server answered on ``GET /version``,
absent when it did not), so a ledger says whether a fault acted against a real vLLM. A fault's state is its last
transition among intended, injected, failed and cleared (``evidence`` does not change
it). A fault is *open* until it is cleared: ``failed`` stays open because a fault that
raised half-way may have partly acted.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from faults.base import Evidence
from harness.clock import now

STATES = ("intended", "injected", "failed", "cleared")


class Ledger:
    """Append-only JSONL ledger of fault state transitions (thread-safe, fsync'ed per entry).

    Args:
        path: the ledger file (e.g. ``OUT/ledger.jsonl``); created with its parent
            directories on the first write. An existing file is appended to.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.RLock()

    # -- writing ---------------------------------------------------------------------------

    def _append(self, fault_id: str, event: str, **data: Any) -> dict[str, Any]:
        entry = {"t": now(), "fault_id": fault_id, "event": event, **data}
        line = json.dumps(entry, default=str) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        return entry

    def intend(self, kind: str, target: str, params: dict[str, Any],
               system: dict[str, str] | None = None) -> str:
        """Record the intent to inject, before anything acts; ``system``: the targeted stack's
        ``{"launcher", "vllm_version"}`` (see the module doc). Returns the new fault id
        (``"<kind>-<8 hex>"``)."""
        fault_id = f"{kind}-{uuid.uuid4().hex[:8]}"
        self._append(fault_id, "intended", kind=kind, target=target, params=params, system=system or {})
        return fault_id

    def injected(self, fault_id: str, facts: dict[str, Any]) -> dict[str, Any]:
        """Record that the fault acted, with the facts needed to revert or judge it.
        Returns the written entry (its ``t`` is the injection time, epoch s)."""
        return self._append(fault_id, "injected", facts=facts)

    def evidence(self, fault_id: str, ev: Evidence) -> dict[str, Any]:
        """Record the evidence gathered for the fault (does not change its state)."""
        return self._append(fault_id, "evidence", evidence=asdict(ev))

    def cleared(self, fault_id: str) -> dict[str, Any]:
        """Record that the fault was reverted (or needed no revert). Closes it."""
        return self._append(fault_id, "cleared")

    def failed(self, fault_id: str, error: str) -> dict[str, Any]:
        """Record that injecting (or clearing) the fault raised ``error``. Keeps it open."""
        return self._append(fault_id, "failed", error=error)

    # -- reading ---------------------------------------------------------------------------

    def raw(self) -> list[dict[str, Any]]:
        """Every line of the ledger in file order (a torn last line is skipped)."""
        return read_ledger_lines(self.path)

    def entries(self) -> list[dict[str, Any]]:
        """One folded dict per fault id, in order of intent::

            {"fault_id", "kind", "target", "params", "state", "facts", "intended_at",
             "injected_at", "cleared_at", "error", "evidence"}

        ``state`` is one of :data:`STATES`; times are epoch seconds or None;
        ``evidence`` is the last evidence dict or None; ``error`` the last failure or None.
        """
        return fold(self.raw())

    def open_faults(self) -> list[dict[str, Any]]:
        """Folded entries not yet cleared (intended, injected or failed)."""
        return [e for e in self.entries() if e["state"] != "cleared"]


def read_ledger_lines(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The raw lines of a ledger file; missing file → ``[]``, undecodable lines skipped."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and "fault_id" in item:
            out.append(item)
    return out


def fold(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold raw ledger lines into one entry per fault id (see :meth:`Ledger.entries`)."""
    by_id: dict[str, dict[str, Any]] = {}
    for line in lines:
        fid = line["fault_id"]
        e = by_id.setdefault(
            fid,
            {
                "fault_id": fid, "kind": None, "target": None, "params": {}, "state": "intended",
                "facts": {}, "intended_at": None, "injected_at": None, "cleared_at": None,
                "error": None, "evidence": None,
            },
        )
        ev, t = line.get("event"), line.get("t")
        if ev == "intended":
            e.update(kind=line.get("kind"), target=line.get("target"), params=line.get("params") or {},
                     intended_at=t, state="intended")
        elif ev == "injected":
            e.update(facts=line.get("facts") or {}, injected_at=t, state="injected")
        elif ev == "evidence":
            e["evidence"] = line.get("evidence")
        elif ev == "failed":
            e.update(error=line.get("error"), state="failed")
        elif ev == "cleared":
            e.update(cleared_at=t, state="cleared")
    return list(by_id.values())
