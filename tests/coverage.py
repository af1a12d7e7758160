"""Real-stack coverage of the fault families: which families of ``specchaos faults`` acted
against a real vLLM server during a test run, read from the fault ledgers the run wrote
(never from a list in the code).

A family counts when a ledger holds an ``intended`` entry of that kind whose ``system`` is a
real vLLM, in the server's own word: a launcher of :data:`REAL_LAUNCHERS` (an allow-list: a new
fake, whatever its name, never counts) and the vLLM version the answering server reported on
``GET /version`` at run time (``server_vllm_version``, :func:`faults.inject.reported_vllm_version`;
the installed package's version says nothing about the server that answered), and an
``evidence`` entry of the same fault with ``acted`` true. ``make test`` runs its real-stack
group with ``--real-stack-coverage``: the run ends with the line
``real-stack coverage: FAMILY FAMILY ...`` and fails when a registered family is missing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from harness.errors import SpecchaosError
from harness.gpu import NO_GPU

#: The launchers of specchaos that run or attach to a real vLLM (harness/stack/): only their
#: faults can count.
REAL_LAUNCHERS = frozenset({"local", "docker", "external"})


def real_vllm(system: dict | None) -> bool:
    """Whether a ledger ``system`` (``{"launcher", "vllm_version", "server_vllm_version"}``) is a
    real vLLM server: a launcher of :data:`REAL_LAUNCHERS` and a version the server reported."""
    system = system or {}
    version = str(system.get("server_vllm_version") or "")
    return system.get("launcher") in REAL_LAUNCHERS and version not in ("", "fake", "unknown")


def families_acted(ledgers: Iterable[Path]) -> Counter:
    """Family → number of faults that acted against a real vLLM, over ``ledgers``
    (``ledger.jsonl`` files; unreadable lines are skipped: a run killed mid-write)."""
    acted: Counter = Counter()
    for path in ledgers:
        kinds: dict[str, str] = {}
        seen: set[str] = set()
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            fid = e.get("fault_id")
            if e.get("event") == "intended" and real_vllm(e.get("system")):
                kinds[fid] = e.get("kind")
            elif e.get("event") == "evidence" and fid in kinds and fid not in seen \
                    and (e.get("evidence") or {}).get("acted") is True:
                seen.add(fid)
                acted[kinds[fid]] += 1
    return acted


def ledgers_under(*roots: Path | None) -> list[Path]:
    """Every ``ledger.jsonl`` under ``roots`` (missing roots are skipped), each once."""
    found: set[Path] = set()
    for root in roots:
        if root is not None and Path(root).is_dir():
            found.update(p.resolve() for p in Path(root).rglob("ledger.jsonl"))
    return sorted(found)


def gpu_only_families(registry: dict[str, type]) -> dict[str, str]:
    """Family → why this host cannot run it, for the families that need an NVIDIA GPU on a
    host without one: their :meth:`~faults.base.Fault.check_host` (parameters at their
    defaults, unvalidated) refuses with a line starting "no NVIDIA GPU". They cannot act
    against the real vLLM here, so the coverage line names them apart instead of failing."""
    out = {}
    for kind, cls in registry.items():
        try:
            cls(cls.Params.model_construct()).check_host()
        except SpecchaosError as exc:
            if exc.message.startswith(NO_GPU):
                out[kind] = exc.message
        except Exception:  # noqa: BLE001 - a family that cannot be asked so is one to cover
            continue
    return out


def coverage_line(acted: Counter, families: Iterable[str]) -> tuple[str, list[str]]:
    """(the line ``real-stack coverage: ...`` naming the families in ``families`` that acted,
    the families that did not)."""
    families = sorted(families)
    return ("real-stack coverage: " + (" ".join(f for f in families if acted[f]) or "(none)"),
            [f for f in families if not acted[f]])
