"""A minimal harness for the SIGKILL tests of the cgroup families: it writes a run state
file naming its ledger (as ``specchaos run`` does), injects one fault through the real
:class:`~faults.inject.FaultInjector` on a plain process tree, prints ``injected`` and
waits to be killed. Usage::

    python -m tests.faults.cgroup_driver OUT_DIR PID KIND PARAMS_JSON
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil

from faults.inject import FaultInjector, InjectionContext
from faults.ledger import Ledger
from harness.state import RunState, set_current
from harness.timeline import Timeline
from tests.faults.cgroups import PlainServer
from tests.faults.conftest import ServersStack


def main(out: Path, pid: int, kind: str, params: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = RunState(out, ledger=out / "ledger.jsonl")
    set_current(state)
    stack = ServersStack(spec=PlainServer(psutil.Process(pid)))
    inj = FaultInjector(InjectionContext(stack, Timeline(out / "timeline.jsonl"), Ledger(out / "ledger.jsonl")))
    handle = inj.inject(kind, params)
    print("injected", handle.fault_id, flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))
