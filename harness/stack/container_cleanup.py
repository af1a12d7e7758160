"""``specchaos cleanup`` for the Docker launcher: remove the containers crashed runs left.

Two ways to find them, both restricted to containers this harness started:

1. by id: every container a crashed run registered in its state file
   (``containers``: ``[{"id", "name", "engine"}]``, :meth:`harness.state.RunState.register_container`),
   on the engine it was created on;
2. by label, on the engine ``$DOCKER_HOST`` names (when one answers): containers labelled
   by the launcher (:func:`harness.stack.container.owner_labels`) with this state
   directory, whose owning harness process (pid and create time) is gone — or every one of
   them with ``force``. This finds a container of a pooled stack that outlived the run
   that created it, and one created just before the harness was killed.

Removing a container (forced) ends every process in it, lifts its CPU and memory limits
and ends a ``docker pause``: nothing of it is left. A container without the launcher's
labels and this state directory is never touched, whatever its name.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import docker
import docker.errors
import psutil

from harness.stack.procs import CREATE_TIME_TOLERANCE_S

__all__ = ["remove_registered", "remove_orphaned", "LABEL_PREFIX"]

log = logging.getLogger(__name__)

#: The launcher's label prefix (as :data:`harness.stack.container.LABEL_PREFIX`).
LABEL_PREFIX = "io.specchaos"
_ERRORS = (docker.errors.DockerException, OSError)


def engine_address() -> str:
    """The address of the engine ``$DOCKER_HOST`` names (the SDK's default socket when unset),
    as recorded in run state and ledger facts (the SDK's own ``base_url`` of a unix socket,
    ``http+docker://localhost``, cannot be reached again)."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _client(engine: str | None) -> docker.DockerClient | None:
    """A client of ``engine`` (None: ``$DOCKER_HOST``) that answers a ping, or None."""
    if engine is None and not os.environ.get("DOCKER_HOST"):
        return None
    try:
        client = docker.DockerClient(base_url=engine, timeout=10) if engine else docker.from_env(timeout=10)
        client.ping()
        return client
    except _ERRORS:
        return None


def _owner_alive(labels: dict[str, str]) -> bool:
    try:
        pid, ct = int(labels[f"{LABEL_PREFIX}.owner_pid"]), float(labels[f"{LABEL_PREFIX}.owner_create_time"])
        return abs(psutil.Process(pid).create_time() - ct) <= CREATE_TIME_TOLERANCE_S
    except (KeyError, ValueError, psutil.Error):
        return False


def remove_registered(containers: list[dict[str, Any]], result: dict[str, Any]) -> list[str]:
    """Remove the registered ``containers`` (``[{"id", "name", "engine"}]``) that still
    exist; their names are appended to ``result["containers_removed"]``.

    Returns:
        Problems in words (an engine that does not answer while a container is
        registered on it, a removal refused), for the state file to be kept.
    """
    errors = []
    for entry in containers:
        client = _client(entry.get("engine"))
        if client is None:
            errors.append(f"container {entry.get('name')}: engine {entry.get('engine')} does not answer, not removed")
            continue
        try:
            client.containers.get(entry["id"]).remove(force=True)
            result.setdefault("containers_removed", []).append(entry.get("name") or entry["id"][:12])
        except docker.errors.NotFound:
            pass
        except _ERRORS as exc:
            errors.append(f"container {entry.get('name')}: not removed ({exc})")
        finally:
            with contextlib.suppress(Exception):
                client.close()
    return errors


def remove_orphaned(state_dir: Path, force: bool, result: dict[str, Any]) -> list[str]:
    """Remove, on ``$DOCKER_HOST``'s engine, the launcher's containers of ``state_dir``
    whose owner is gone (every one of them with ``force``); names appended to
    ``result["containers_removed"]``. No engine answering: nothing to do.

    Returns:
        Problems in words (a removal refused).
    """
    client = _client(None)
    if client is None:
        return []
    errors = []
    try:
        found = client.containers.list(all=True, filters={
            "label": [f"{LABEL_PREFIX}.launcher=docker", f"{LABEL_PREFIX}.state_dir={Path(state_dir).resolve()}"]})
        for c in found:
            if not force and _owner_alive(c.labels):
                continue
            try:
                c.remove(force=True)
                result.setdefault("containers_removed", []).append(c.name)
                log.info("removed container %s (its harness is gone)", c.name)
            except docker.errors.NotFound:
                pass
            except _ERRORS as exc:
                errors.append(f"container {c.name}: not removed ({exc})")
    except _ERRORS as exc:
        errors.append(f"listing the launcher's containers failed ({exc})")
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return errors
