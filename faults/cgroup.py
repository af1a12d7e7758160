"""Put a server's process tree into a cgroup of its own and set limits there — what the
cgroup mechanisms (:mod:`faults.mechanisms.cgroup_cpu`, :mod:`faults.mechanisms.cgroup_memory`) share.

Generic over the controller: a mechanism names the controller (``"cpu"``, ``"memory"``) and
the files it writes (``{"cpu.cfs_quota_us": "30000"}``); this module knows cgroups, not
faults.

Layouts (detected from ``/proc/self/mountinfo``):

* **v1** (per-controller hierarchies, e.g. ``/sys/fs/cgroup/cpu``, ``/sys/fs/cgroup/memory``):
  the child is created under the harness's own cgroup of that controller, e.g.
  ``/sys/fs/cgroup/memory/<own>/specchaos-<fault id>``;
* **v2** (unified, ``/sys/fs/cgroup`` of type cgroup2 with the controller listed in its
  ``cgroup.controllers``): the same under the own cgroup; the controller must be enabled
  in the parent's ``cgroup.subtree_control`` (v2's no-internal-process rule usually
  forbids that for a cgroup that holds processes, so v2 mostly fails the writability
  check — measured only on this v1 host).

A v1 mount of the controller wins over a v2 mount (hybrid hosts like this one mount an
empty cgroup2 at ``/sys/fs/cgroup/unified``).

Safety: only the cgroup this module created (named ``specchaos-<fault id>``) is ever
written to or removed; the only write to another cgroup is moving a pid of ours back
(into the cgroup it came from, or the parent of ours for processes forked inside ours).
A pid is moved only if it still is the recorded process (pid + create_time + command line,
checked with a pidfd held across the write; the microsecond window of an exit, reap and pid
reuse between that check and the write is logged, not undone).

Revert (:meth:`TreeCgroup.revert` live, :func:`revert` from ledger facts after a crash,
:func:`find_cgroups` when the crash came before the facts were written): write the
``lift`` values (the limits off, so nothing stays limited even if a later step fails),
move every recorded pid still in our cgroup back to its original cgroup, move any other
process still inside to the parent, then ``rmdir`` our cgroup.

Environment: ``SPECCHAOS_CGROUP_ROOT`` replaces ``/sys/fs/cgroup`` as the root under which
hierarchies are looked for (tests point it at a cgroup that cannot be written).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import Any

from harness.stack.procs import Recorded, same_process
from harness.errors import FaultError

log = logging.getLogger(__name__)

#: Name prefix of every cgroup this module creates (``specchaos-<fault id>``).
PREFIX = "specchaos-"
ROOT_ENV = "SPECCHAOS_CGROUP_ROOT"
DEFAULT_ROOT = "/sys/fs/cgroup"
#: Seconds :func:`revert` retries ``rmdir`` while a process that just left (or died) is
#: still accounted in the cgroup.
RMDIR_TIMEOUT_S = 3.0

__all__ = ["PREFIX", "Hierarchy", "TreeCgroup", "hierarchy", "cgroup_of", "check_writable",
           "revert", "find_cgroups", "read_values", "recover", "counters"]


@dataclass(frozen=True)
class Hierarchy:
    """Where one controller lives. ``version``: 1 or 2; ``mount``: the hierarchy's mount
    point (``/sys/fs/cgroup/cpu`` in v1, ``/sys/fs/cgroup`` in v2)."""

    controller: str
    version: int
    mount: Path


def _root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def _mounts() -> list[tuple[Path, str, set[str]]]:
    """``(mount point, fstype, super options)`` of every cgroup/cgroup2 mount."""
    out: list[tuple[Path, str, set[str]]] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((Path(fields[4].replace("\\040", " ")), rfields[0], set(rfields[2].split(","))))
    return out


def hierarchy(controller: str) -> Hierarchy:
    """The hierarchy holding ``controller`` (``"cpu"``, ``"memory"``...).

    Under ``$SPECCHAOS_CGROUP_ROOT`` (if set): v1 when ``<root>/<controller>`` is a
    directory, v2 when ``<root>/cgroup.controllers`` lists the controller.

    Raises:
        FaultError: no hierarchy with that controller on this host.
    """
    override = os.environ.get(ROOT_ENV)
    if override:
        root = Path(override)
        if (root / controller).is_dir():
            return Hierarchy(controller, 1, root / controller)
        try:
            if controller in (root / "cgroup.controllers").read_text().split():
                return Hierarchy(controller, 2, root)
        except OSError:
            pass
    else:
        mounts = _mounts()
        for mount, fstype, opts in mounts:
            if fstype == "cgroup" and controller in opts:
                return Hierarchy(controller, 1, mount)
        for mount, fstype, _ in mounts:
            try:
                if fstype == "cgroup2" and controller in (mount / "cgroup.controllers").read_text().split():
                    return Hierarchy(controller, 2, mount)
            except OSError:
                continue
    raise FaultError(f"no cgroup hierarchy with the {controller} controller on this host",
                     where=str(_root()), hint="cgroup faults need Linux cgroups (v1 or v2) mounted")


def cgroup_of(pid: int | str, h: Hierarchy) -> Path:
    """The directory of ``pid``'s cgroup (``"self"`` for this process) in ``h``, from
    ``/proc/<pid>/cgroup``.

    Raises:
        ProcessLookupError: the process is gone.
        FaultError: the process has no cgroup in that hierarchy.
    """
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    for line in text.splitlines():
        _, ctrls, path = line.split(":", 2)
        if (h.version == 2 and ctrls == "") or (h.version == 1 and h.controller in ctrls.split(",")):
            return h.mount / path.strip().lstrip("/")
    raise FaultError(f"pid {pid} has no {h.controller} cgroup (v{h.version})", where=f"/proc/{pid}/cgroup")


def check_writable(controller: str) -> Path:
    """Prove that a child cgroup can be made for ``controller`` under this process's own
    cgroup: create ``specchaos-probe-<pid>`` there and remove it again (v2: and the
    controller is enabled in the parent's ``cgroup.subtree_control``).

    Returns:
        The parent directory the faults will create their cgroups in.

    Raises:
        FaultError: ``"cgroup <path> not writable (<why>)"``, or no such hierarchy.
    """
    h = hierarchy(controller)
    parent = cgroup_of("self", h)
    hint = "cgroup faults need root and a writable cgroup hierarchy; use mechanism: duty_cycle where one exists"
    if h.version == 2:
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
        except OSError as exc:
            raise FaultError(f"cgroup {parent} not writable ({exc.strerror or exc})", hint=hint) from None
        if controller not in enabled:
            raise FaultError(f"cgroup {parent} not writable (cgroup v2: {controller} not enabled in its "
                             f"cgroup.subtree_control)", hint=hint)
    probe = parent / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
    except FileExistsError:
        pass
    except OSError as exc:
        raise FaultError(f"cgroup {parent} not writable ({exc.strerror or exc})", hint=hint) from None
    try:
        probe.rmdir()
    except OSError as exc:
        raise FaultError(f"cgroup {parent} not writable (could not remove the probe {probe}: {exc.strerror or exc})",
                         hint=hint) from None
    return parent


def read_values(path: str | os.PathLike, names: list[str]) -> dict[str, str | None]:
    """``{file: stripped content}`` of the cgroup ``path``'s files; None for one that
    cannot be read (the cgroup is gone, or the kernel lacks the file)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = (Path(path) / name).read_text().strip()
        except OSError:
            out[name] = None
    return out


def _procs(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _exited(fd: int | None) -> bool:
    """Whether the process behind a pidfd has exited (its pidfd polls readable)."""
    if fd is None:
        return False
    return bool(select.select([fd], [], [], 0)[0])


def _move(pid: int, create_time: float | None, cmdline: list[str] | None, dest: Path,
          inside: Path | None = None) -> bool:
    """Write ``pid`` into ``dest/cgroup.procs`` if it still is the recorded process (or,
    with ``create_time`` None, if it still sits in the cgroup ``inside``). The identity is
    checked with a pidfd held across the write: if the pidfd still shows the process alive
    after the write, the pid named it throughout. The one window left — the process exits,
    is reaped and its pid is reused between the check and the write — is only logged (a
    warning), not undone.

    Returns:
        True if moved; False if the process is gone or is not the recorded one.

    Raises:
        OSError: the write failed for another reason than the process being gone.
    """
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        fd = None
    try:
        if create_time is not None and not same_process(pid, create_time, cmdline):
            return False
        try:
            before = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        if inside is not None and not any(line.rstrip().endswith(f"/{inside.name}") for line in before.splitlines()):
            return False
        try:
            (dest / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return False
            raise
        if _exited(fd) and create_time is not None and not same_process(pid, create_time, cmdline):
            log.warning("pid %d exited while being moved; its pid may name another process now", pid)
        return True
    finally:
        if fd is not None:
            os.close(fd)


def revert(facts: dict[str, Any]) -> dict[str, Any]:
    """Undo a :class:`TreeCgroup` from its facts (:meth:`TreeCgroup.facts`; also what the
    ledger holds): lift the limits, move the recorded pids still inside back to their
    original cgroups, move any other process inside to the parent, remove the cgroup.
    Idempotent (a cgroup already gone is a no-op).

    Returns:
        ``{"path", "lifted": {file: value}, "moved_back": [pid], "to_parent": [pid],
        "removed": bool}``.

    Raises:
        FaultError: the cgroup could not be removed within :data:`RMDIR_TIMEOUT_S`
            (pids still inside are named).
    """
    path, parent = Path(facts["path"]), Path(facts["parent"])
    out: dict[str, Any] = {"path": str(path), "lifted": {}, "moved_back": [], "to_parent": [], "removed": False}
    if not path.name.startswith(PREFIX):
        raise FaultError(f"refusing to revert {path}: not a cgroup specchaos created", where=str(path))
    if not path.is_dir():
        out["removed"] = True
        return out
    for name, value in (facts.get("lift") or {}).items():
        try:
            (path / name).write_text(str(value))
            out["lifted"][name] = value
        except OSError as exc:
            log.warning("could not lift %s of %s: %s", name, path, exc)
    inside = set(_procs(path))
    for m in facts.get("moved") or []:
        pid = int(m["pid"])
        if pid not in inside:
            continue
        origin = Path(m.get("origin") or parent)
        dest = origin if origin.is_dir() else parent
        try:
            if _move(pid, float(m["create_time"]), m.get("cmdline"), dest):
                out["moved_back"].append(pid)
        except OSError as exc:
            log.error("could not move pid %d back to %s: %s", pid, dest, exc)
    deadline = time.monotonic() + RMDIR_TIMEOUT_S
    while True:
        for pid in _procs(path):   # forked inside ours, or not recorded: ours, to the parent
            try:
                if _move(pid, None, None, parent, inside=path):
                    out["to_parent"].append(pid)
            except OSError as exc:
                log.error("could not move pid %d to %s: %s", pid, parent, exc)
        try:
            path.rmdir()
            out["removed"] = True
            return out
        except FileNotFoundError:
            out["removed"] = True
            return out
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise FaultError(f"could not remove cgroup {path} ({exc.strerror or exc}); pids inside: "
                                 f"{_procs(path)}", where=str(path),
                                 hint="run `specchaos cleanup`, or move them out and rmdir it by hand") from None
        time.sleep(0.05)


def recover(facts: dict[str, Any] | None, fault_id: str, controller: str,
            lift: Callable[[Path], dict[str, str]]) -> None:
    """After a crash: :func:`revert` the cgroup of ``facts`` (:meth:`TreeCgroup.facts`), or
    with none, every one :func:`find_cgroups` finds for ``fault_id`` (its limits lifted by
    ``lift(path)``).

    Raises:
        FaultError: one or more could not be reverted (each in the message).
    """
    found = [facts] if facts else [{"path": str(p), "parent": str(p.parent), "lift": lift(p)}
                                   for p in find_cgroups(fault_id, controller)]
    errors = []
    for cg_facts in found:
        try:
            revert(cg_facts)
        except FaultError as exc:
            errors.append(exc.one_line())
    if errors:
        raise FaultError("; ".join(errors))


def counters(text: str | None) -> dict[str, int]:
    """``name value`` lines (``cpu.stat``, ``memory.events``, ``memory.oom_control``) as numbers."""
    out = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


def find_cgroups(fault_id: str, controller: str, max_depth: int = 8) -> list[Path]:
    """Every directory named ``specchaos-<fault_id>`` in the hierarchy of ``controller``
    (for a crash between creating the cgroup and writing the ledger's facts). Empty when
    the hierarchy does not exist."""
    try:
        h = hierarchy(controller)
    except FaultError:
        return []
    name, found = f"{PREFIX}{fault_id}", []
    base_depth = len(h.mount.parts)
    for dirpath, dirnames, _ in os.walk(h.mount):
        if name in dirnames:
            found.append(Path(dirpath) / name)
        if len(Path(dirpath).parts) - base_depth >= max_depth:
            dirnames.clear()
        else:
            dirnames[:] = [d for d in dirnames if d != name]
    return found


class TreeCgroup:
    """One child cgroup ``specchaos-<fault_id>`` of ``controller``, under this process's
    own cgroup, holding a server's processes.

    Usage::

        cg = TreeCgroup("cpu", fault_id, lift={"cpu.cfs_quota_us": "-1"})
        cg.create()
        cg.write({"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "30000"})   # read back
        cg.move_in(recorded)          # [(pid, create_time, cmdline)]
        ... cg.facts() into the ledger ...
        cg.revert()

    Args:
        controller: ``"cpu"``, ``"memory"``...
        fault_id: the ledger's id of the fault (names the cgroup).
        lift: files and values that take the limits off, written first on revert.

    Raises:
        FaultError: no such hierarchy on this host.
    """

    def __init__(self, controller: str, fault_id: str, lift: dict[str, str] | None = None):
        self.h = hierarchy(controller)
        self.parent = cgroup_of("self", self.h)
        self.path = self.parent / f"{PREFIX}{fault_id}"
        self.lift = dict(lift or {})
        self.moved: list[dict[str, Any]] = []
        self.written: dict[str, str] = {}

    def facts(self) -> dict[str, Any]:
        """JSON facts for the ledger and :func:`revert`: ``{"controller", "version", "mount",
        "path", "parent", "moved": [{"pid", "create_time", "cmdline", "origin"}],
        "written": {file: value}, "lift": {file: value}}``."""
        return {"controller": self.h.controller, "version": self.h.version, "mount": str(self.h.mount),
                "path": str(self.path), "parent": str(self.parent), "moved": [dict(m) for m in self.moved],
                "written": dict(self.written), "lift": dict(self.lift)}

    def create(self) -> Path:
        """Make the cgroup directory (an existing one of the same name is reused).

        Raises:
            FaultError: ``"cgroup <parent> not writable (...)"``.
        """
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as exc:
            raise FaultError(f"cgroup {self.parent} not writable ({exc.strerror or exc})",
                             hint="cgroup faults need root and a writable cgroup hierarchy") from None
        return self.path

    def write(self, values: Mapping[str, str | int]) -> dict[str, str | None]:
        """Write each file in order, then read them all back.

        Returns:
            ``{file: value read back}`` (the kernel's rounding shows, e.g. page-aligned bytes).

        Raises:
            FaultError: a write was refused (names the file and value).
        """
        for name, value in values.items():
            try:
                (self.path / name).write_text(str(value))
            except OSError as exc:
                raise FaultError(f"cgroup {self.path}: writing {value} to {name} failed ({exc.strerror or exc})",
                                 where=str(self.path / name)) from None
            self.written[name] = str(value)
        return read_values(self.path, list(values))

    def read(self, names: list[str]) -> dict[str, str | None]:
        """Current contents of the cgroup's files (see :func:`read_values`)."""
        return read_values(self.path, names)

    def procs(self) -> list[int]:
        """Pids in the cgroup now (``cgroup.procs``)."""
        return _procs(self.path)

    def move_in(self, recorded: list[Recorded]) -> list[int]:
        """Move every recorded process that still is itself into the cgroup, remembering
        its original cgroup first (so a crash leaves enough in :meth:`facts` to move it back).

        Returns:
            The pids moved (a process gone meanwhile is skipped).

        Raises:
            FaultError: a write was refused for another reason.
        """
        done = []
        for pid, ct, cmd in recorded:
            try:
                origin = cgroup_of(pid, self.h)
            except (ProcessLookupError, FaultError):
                continue
            entry = {"pid": pid, "create_time": ct, "cmdline": cmd, "origin": str(origin)}
            self.moved.append(entry)
            try:
                ok = _move(pid, ct, cmd, self.path)
            except OSError as exc:
                raise FaultError(f"cgroup {self.path}: moving pid {pid} in failed ({exc.strerror or exc})",
                                 where=str(self.path / "cgroup.procs")) from None
            if ok:
                done.append(pid)
            else:
                self.moved.remove(entry)
        return done

    def revert(self) -> dict[str, Any]:
        """:func:`revert` with this cgroup's facts. Idempotent."""
        return revert(self.facts())

