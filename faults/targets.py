"""The targets of the process-level fault families, found pid-safe: a server of the stack by
name, the live processes of one of its roles recorded with their identity, and signals sent
only to processes that still are the recorded ones.

Below the fault families (every family that signals, freezes, throttles or limits a role
uses it; none imports another family). The identity checks themselves are
:func:`harness.stack.procs.same_process` and :func:`harness.stack.procs.send_signal_exact`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

import psutil

from faults.base import FaultContext
from harness.errors import FaultError
from harness.stack.base import Server
from harness.stack.procs import Recorded, cmdline_of, same_process, send_signal_exact

log = logging.getLogger(__name__)


def server_of(ctx: FaultContext, server: str, target: str) -> Server:
    """The stack's server ``server``.

    Raises:
        FaultError: no such server (``where`` = ``target``; the hint lists the servers).
    """
    if server not in ctx.servers:
        raise FaultError(f"no server {server!r} in the stack", where=target,
                         hint=f"set arguments.server to one of: {', '.join(ctx.servers) or '(none started)'}")
    return ctx.servers[server]


def record_role(srv: Server, server: str, role: str, target: str, verb: str = "signalled") -> tuple[int, list[Recorded]]:
    """Find every live process of ``role`` in ``srv`` and record its identity, refusing
    before anything acts if the server restarted meanwhile or a pid changed hands.

    Returns:
        ``(incarnation, [(pid, create_time, cmdline)])``.

    Raises:
        FaultError: no process of the role (server down), a restart during discovery, a
            process that vanished, or a pid that now belongs to another process.
    """
    incarnation = int(getattr(srv, "incarnation", 0))
    procs = list((srv.roles() or {}).get(role) or [])
    if not procs:
        raise FaultError(f"no {role} process found in server {server} (is it up?)", where=target,
                         hint="start the stack and wait until it is ready before injecting")
    if int(getattr(srv, "incarnation", 0)) != incarnation:  # the processes may be of either
        raise FaultError(f"server {server} restarted while its {role} was being found", where=target,
                         hint="inject once the server is ready")
    recorded: list[Recorded] = []
    for proc in procs:
        try:
            recorded.append((proc.pid, proc.create_time(), cmdline_of(proc)))
        except psutil.Error as exc:
            raise FaultError(f"{role} process {proc.pid} of server {server} vanished before it could be {verb}",
                             where=target, hint="the server may be restarting; inject once it is ready") from exc
    for pid, ct, cmd in recorded:  # refuse before acting at all if any pid changed hands
        if not same_process(pid, ct, cmd):
            raise FaultError(f"pid {pid} is no longer the {role} process that was found "
                             f"(gone, or its pid was reused); refusing to signal",
                             where=target, hint="the server may be restarting; inject once it is ready")
    return incarnation, recorded


def signal_recorded(recorded: list[Recorded], signum: int, target: str,
                    into: list[Recorded] | None = None) -> list[Recorded]:
    """Send ``signum`` to each recorded process that still is itself; the ones signalled,
    appended to ``into`` as they are (so a fault that must undo its signals, e.g. a freeze,
    knows every process it reached even when a later one raises).

    Raises:
        FaultError: not permitted to signal one of them.
    """
    done = into if into is not None else []
    for pid, ct, cmd in recorded:
        try:
            ok = send_signal_exact(pid, ct, signum, cmd)
        except PermissionError as exc:
            raise FaultError(f"not permitted to signal pid {pid}", where=target,
                             hint="run the harness as the user that started the stack") from exc
        if ok:
            done.append((pid, ct, cmd))
        else:  # went away after the first signal (e.g. a sibling worker torn down with it)
            log.info("%s pid %d went away before its own signal", target, pid)
    return done


def record_tree(srv: Server, server: str, roles: Sequence[str] | None, target: str) -> tuple[int, list[Recorded]]:
    """The processes to put in the cgroup, recorded (pid, create_time, cmdline): with
    ``roles`` None the whole tree (the API process and every descendant, the resource
    tracker included), else every process of each named role.

    Returns:
        ``(incarnation, recorded)``.

    Raises:
        FaultError: the server is down or restarted meanwhile, or a process vanished.
    """
    if roles:
        incarnation, out = -1, cast("list[Recorded]", [])
        for role in dict.fromkeys(roles):
            inc, rec = record_role(srv, server, role, target, verb="moved")
            if incarnation not in (-1, inc):
                raise FaultError(f"server {server} restarted while its processes were being found", where=target,
                                 hint="inject once the server is ready")
            incarnation = inc
            out += [r for r in rec if r[0] not in {o[0] for o in out}]
        return incarnation, out
    incarnation, api = record_role(srv, server, "api", target, verb="moved")
    out = list(api)
    for pid, _, _ in api:
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    out.append((child.pid, child.create_time(), cmdline_of(child)))
            except psutil.Error:
                continue   # exited meanwhile: nothing to move
    if int(getattr(srv, "incarnation", 0)) != incarnation:
        raise FaultError(f"server {server} restarted while its process tree was being found", where=target,
                         hint="inject once the server is ready")
    return incarnation, out
