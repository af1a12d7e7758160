"""``specchaos cleanup``: tear down what crashed runs left behind.

For every run state file (format in :mod:`harness.state`) whose owner process is gone
— its pid is not running, or now belongs to a process with another create_time — or
every file with ``force``:

1. open faults in the run's ledger are reverted with ``REGISTRY[kind].recover(entry)``
   (a family's recover undoes through the mechanism its facts name,
   :func:`faults.mechanisms.recover`) and marked cleared there (first, because e.g. a frozen cgroup must be thawed before
   its processes can die);
2. every registered process tree is ended: the registered pid only if its create_time
   still matches (pid-reuse safe), with its descendants as found by psutil; SIGTERM,
   then SIGKILL to whatever is left after ``grace_s``;
3. every container the run registered (launcher docker) is removed, forced: its processes
   end, its limits and a pause go with it (:func:`harness.stack.container_cleanup.remove_registered`);
4. the state file is deleted (kept if something could not be reverted or ended, so a
   later cleanup retries).

Then, on the engine ``$DOCKER_HOST`` names, the Docker launcher's containers of this state
directory whose owning harness is gone (every one with ``force``) are removed
(:func:`harness.stack.container_cleanup.remove_orphaned`): a pooled stack's containers, or
one created just before a crash.

Nothing that is not a registered process or a descendant of one is ever signalled, and no
container without the launcher's labels and this state directory is ever touched (an
external launcher's servers register nothing: never touched).
"""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Any

import psutil

from faults.ledger import Ledger
from faults.registry import REGISTRY
from harness import state as run_state
from harness.stack import container_cleanup
from harness.stack.procs import descendants, recorded_process, same_process, signal_process, wait_gone

log = logging.getLogger(__name__)


def cleanup(state_dir: Path | None = None, force: bool = False, grace_s: float = 5.0) -> dict[str, Any]:
    """Clean up after runs whose owner died (or all runs with ``force``).

    Args:
        state_dir: the state directory holding ``runs/*.json``; default
            :func:`harness.state.state_dir` (``$SPECCHAOS_STATE_DIR``).
        force: also clean runs whose owner is still alive.
        grace_s: seconds between SIGTERM and SIGKILL.

    Returns:
        ``{"runs": int (runs cleaned), "killed": [pid], "faults_reverted": [fault_id],
        "containers_removed": [name], "skipped_live_runs": [{"run_id", "owner_pid", "owner_cwd",
        "out_dir"}], "errors": [str]}`` — a skipped run says whose it is: the live owner's pid
        and working directory (its checkout; recorded by :class:`harness.state.RunState`, or
        read from the live process for an older state file; None when neither) and its
        output directory.
    """
    base = Path(state_dir) if state_dir is not None else run_state.state_dir()
    result: dict[str, Any] = {"runs": 0, "killed": [], "faults_reverted": [], "containers_removed": [],
                              "skipped_live_runs": [], "errors": []}
    for path in sorted((base / "runs").glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            result["errors"].append(f"{path}: unreadable state file ({exc})")
            continue
        run_id = data.get("run_id") or path.stem
        owner_pid, owner_ct = data.get("owner_pid"), data.get("owner_create_time")
        if not force and owner_pid is not None and owner_ct is not None and same_process(int(owner_pid), float(owner_ct)):
            log.info("run %s: owner pid %s is alive, skipped", run_id, owner_pid)
            result["skipped_live_runs"].append({"run_id": run_id, "owner_pid": int(owner_pid),
                                                "owner_cwd": data.get("owner_cwd") or _cwd_of(int(owner_pid)),
                                                "out_dir": data.get("out_dir")})
            continue
        errors = _revert_faults(data.get("ledger"), result)
        errors += _kill_registered(data.get("processes") or [], grace_s, result)
        errors += container_cleanup.remove_registered(data.get("containers") or [], result)
        result["runs"] += 1
        if errors:
            result["errors"] += [f"run {run_id}: {e}" for e in errors]
            log.warning("run %s: state file kept (%d problem(s))", run_id, len(errors))
        else:
            path.unlink(missing_ok=True)
            log.info("run %s cleaned up", run_id)
    result["errors"] += container_cleanup.remove_orphaned(base, force, result)
    return result


def _cwd_of(pid: int) -> str | None:
    """The working directory of the live process ``pid``, or None (gone, or not ours to read)."""
    try:
        return psutil.Process(pid).cwd()
    except (psutil.Error, OSError):
        return None


def _revert_faults(ledger_path: str | None, result: dict[str, Any]) -> list[str]:
    if not ledger_path:
        return []
    ledger = Ledger(ledger_path)
    errors = []
    for entry in ledger.open_faults():
        cls = REGISTRY.get(entry.get("kind") or "")
        if cls is None:
            errors.append(f"fault {entry['fault_id']}: unknown kind {entry.get('kind')!r}, not reverted")
            continue
        try:
            cls.recover(entry)
        except Exception as exc:  # noqa: BLE001 - keep reverting the others
            log.error("reverting fault %s failed: %s", entry["fault_id"], exc)
            errors.append(f"fault {entry['fault_id']}: recover failed ({type(exc).__name__}: {exc})")
            continue
        ledger.cleared(entry["fault_id"])
        result["faults_reverted"].append(entry["fault_id"])
    return errors


def _kill_registered(processes: list[dict[str, Any]], grace_s: float, result: dict[str, Any]) -> list[str]:
    """End every registered tree whose root is still the registered process (SIGTERM, then
    SIGKILL after ``grace_s`` seconds to what is left and what it forked meanwhile)."""
    tree: dict[int, psutil.Process] = {}
    for reg in processes:
        try:
            pid, ct = int(reg["pid"]), float(reg["create_time"])
        except (KeyError, TypeError, ValueError):
            continue
        root = recorded_process(pid, ct)
        if root is None:
            log.info("registered pid %s (%s) is gone or was reused: not touched", reg.get("pid"), reg.get("role"))
            continue
        tree[pid] = root
        tree.update((c.pid, c) for c in descendants(root))
    if not tree:
        return []
    for proc in tree.values():
        signal_process(proc, signal.SIGTERM)
    left = wait_gone(tree.values(), grace_s)
    if left:
        for proc in list(left):   # children forked during the grace period are part of the tree
            late = [c for c in descendants(proc) if c.pid not in tree]
            left += late
            tree.update((c.pid, c) for c in late)
        for proc in left:
            signal_process(proc, signal.SIGKILL)
        left = wait_gone(left, 5.0)
    # Ended by cleanup: found running in a registered tree, gone now (signalled, or
    # taken down with its parent).
    still = {proc.pid for proc in left}
    result["killed"] += [pid for pid in tree if pid not in still]
    return [f"pid {pid} still running after SIGKILL" for pid in sorted(still)]
