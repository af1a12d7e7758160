"""The Docker engine and the image the Docker launcher (:mod:`harness.stack.container`) uses.

* :func:`engine_client`: the engine ``$DOCKER_HOST`` names (the Docker SDK's environment
  rules), pinged; ``ci/docker-engine.sh start`` starts a private one.
* :func:`ensure_image`: the tiny **host-root** image, built locally when missing (no
  registry is asked): a root file system of a few empty directories and links —
  usr-merged ``bin``/``lib``/``lib64``/``sbin`` links into ``/usr``, ``/sbin/ldconfig``,
  root-only ``/etc/passwd`` and ``/etc/group``, mount points — imported from a tar
  written in memory. Run with :func:`host_mounts` (``/usr``, the Python installation, the
  venv, the checkout, the models, read-only at the same paths), it runs the very Python and
  vLLM installed on this machine (same glibc). Measured here: a few hundred bytes, built
  in well under a second.
* :func:`host_mounts`: those read-only bind mounts, each path once.

GPU hosts use an image of their own instead (``stack.docker.image``, e.g. the official
``vllm/vllm-openai``), with only the models mounted.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

import docker
import docker.errors
from docker.types import Mount

from harness.errors import StackError

__all__ = ["DEFAULT_IMAGE", "IMAGE_LABEL", "ENGINE_HINT", "engine_client", "host_root_tar", "ensure_image",
           "host_mounts", "python_roots", "outermost"]

#: The repository of the host-root image; its tag is a hash of the recipe (:func:`host_root_tar`).
DEFAULT_IMAGE = "specchaos/host-root"
#: The label every image built here carries.
IMAGE_LABEL = "io.specchaos.image"
#: What to do when no engine answers.
ENGINE_HINT = 'start one: export "$(ci/docker-engine.sh start)" (a private engine), or set DOCKER_HOST'

# (path, kind, target) of the host root: kind "dir" or "link"
_ROOT: tuple[tuple[str, str, str], ...] = (
    ("usr", "dir", ""), ("bin", "link", "usr/bin"), ("lib", "link", "usr/lib"), ("lib64", "link", "usr/lib64"),
    ("sbin", "dir", ""), ("sbin/ldconfig", "link", "/usr/sbin/ldconfig"),
    ("etc", "dir", ""), ("tmp", "dir", ""), ("root", "dir", ""), ("proc", "dir", ""), ("sys", "dir", ""),
    ("dev", "dir", ""), ("run", "dir", ""), ("var", "dir", ""), ("var/tmp", "dir", ""),
)
_FILES = {"etc/passwd": b"root:x:0:0:root:/root:/bin/sh\n", "etc/group": b"root:x:0:\n",
          "etc/hosts": b"127.0.0.1 localhost\n::1 localhost\n", "etc/nsswitch.conf": b"hosts: files dns\n"}


def engine_client(timeout_s: float = 60.0) -> docker.DockerClient:
    """A client of the engine ``$DOCKER_HOST`` names (default: the system socket), pinged.

    Args:
        timeout_s: the client's timeout for each engine API call, seconds.

    Raises:
        StackError: no engine answers (one line naming the address and :data:`ENGINE_HINT`).
    """
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
        return client
    except (docker.errors.DockerException, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StackError(f"no Docker engine answers at {where} ({reason[:160]})", where="$DOCKER_HOST",
                         hint=ENGINE_HINT) from None


def host_root_tar() -> tuple[bytes, str]:
    """The host root file system as an uncompressed tar, and the recipe's hash (12 hex
    digits; it tags the image, so a changed recipe builds a new one)."""
    buf = io.BytesIO()
    digest = hashlib.sha256()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, kind, target in _ROOT:
            info = tarfile.TarInfo(path)
            info.mtime = 0
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if path in ("tmp", "var/tmp") else 0o755
            else:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
            digest.update(f"{path}:{kind}:{target};".encode())
        for path, data in _FILES.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
            digest.update(path.encode() + data)
    return buf.getvalue(), digest.hexdigest()[:12]


def ensure_image(client: docker.DockerClient, repository: str = DEFAULT_IMAGE) -> str:
    """The host-root image's tag (``repository:<recipe hash>``), imported when the engine
    does not have it; a second call finds it and builds nothing.

    Raises:
        StackError: the engine refused the import.
    """
    data, tag = host_root_tar()
    ref = f"{repository}:{tag}"
    try:
        client.images.get(ref)
        return ref
    except docker.errors.ImageNotFound:
        pass
    try:
        client.api.import_image_from_data(data, repository=repository, tag=tag,
                                          changes=[f"LABEL {IMAGE_LABEL}=host-root", "WORKDIR /"])
        client.images.get(ref)
    except (docker.errors.DockerException, OSError) as exc:
        raise StackError(f"the Docker engine did not import the host-root image {ref}: {exc}", where="$DOCKER_HOST",
                         hint="read the engine's log (ci/docker-engine.sh: $SPECCHAOS_DOCKER_DIR/dockerd.log)") from None
    return ref


def python_roots() -> list[Path]:
    """What the running interpreter needs, resolved: the venv (``sys.prefix``) and the
    installation behind it (``sys.base_prefix``, and the directory of the interpreter the
    venv's ``python`` links to)."""
    roots = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
    real = Path(sys.executable).resolve()
    roots.append(real.parent.parent if real.parent.name == "bin" else real.parent)
    return roots


def outermost(paths: Iterable[Path]) -> list[Path]:
    """``paths`` (resolved) without any inside another one of them, shortest first."""
    out: list[Path] = []
    for p in sorted({Path(x).resolve() for x in paths}, key=lambda q: (len(q.parts), str(q))):
        if p == Path("/"):
            continue
        if not any(p == q or q in p.parents for q in out):
            out.append(p)
    return out


def host_mounts(checkout: Path | None, extra: Iterable[Path] = (), *, interpreter: bool = True) -> list[Mount]:
    """Read-only bind mounts at the same paths: ``/usr`` and :func:`python_roots` (with
    ``interpreter``; an image with its own Python needs neither), the ``checkout`` (None:
    not mounted) and ``extra`` (e.g. the models), each once (a path inside another mounted
    one is not mounted again; ``/`` never).

    Raises:
        StackError: a path to mount does not exist.
    """
    wanted = [*([Path("/usr"), *python_roots()] if interpreter else []), *([checkout] if checkout is not None else []), *extra]
    for p in wanted:
        if not Path(p).exists():
            raise StackError(f"{p} does not exist: it cannot be mounted into the container", where=str(p))
    return [Mount(str(p), str(p), type="bind", read_only=True) for p in outermost(wanted)]
