"""Running the fake vLLM (:mod:`tests.fakes.fake_vllm`) in tests.

Two ways:

* :class:`FakeProcess` (or the :func:`run_fake` context manager): one fake as a plain
  subprocess on a free loopback port, for parser, client and fault tests. Its own
  session (process group); ``stop()`` kills the whole tree and group, pid-reuse safe.
* :class:`FakeServer`: the harness's real supervisor (:class:`harness.stack.local.LocalServer`:
  readiness, restarts, roles, tree teardown) around the fake instead of vLLM. Only the
  command changes: ``LocalServer.command()`` with its leading
  ``python -m vllm.entrypoints.openai.api_server`` replaced by ``python fake_vllm.py``,
  and the fake-only flags appended.

Pytest fixtures built on these live in ``tests/conftest.py`` (``fake_vllm``, ``fake_server``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness.proc import die_with_parent
from harness.stack import procs
from harness.stack.local import LocalServer
from harness.ports import free_ports

__all__ = ["FAKE_PATH", "VLLM_HEAD", "FakeProcess", "FakeServer", "http_client", "run_fake"]

#: The fake's script; run it as ``python FAKE_PATH ...`` (it imports nothing of the harness).
FAKE_PATH = Path(__file__).resolve().with_name("fake_vllm.py")
#: How ``LocalServer.command()`` starts vLLM; :class:`FakeServer` swaps exactly this.
VLLM_HEAD = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
_HOST = "127.0.0.1"


def http_client(timeout_s: float = 10.0) -> httpx.Client:
    """An ``httpx.Client`` for plain HTTP to the fake: no proxy from the environment, and no
    TLS set-up (loading the CA bundle costs ~60 ms per client, a lot in a polling loop)."""
    return httpx.Client(trust_env=False, verify=False, timeout=timeout_s)


class FakeProcess:
    """One fake vLLM server as a plain subprocess on ``127.0.0.1`` (not supervised).

    Args:
        *flags: more command-line flags (vLLM's or the fake's, e.g. ``"--ready-after", "5"``).
        served_model_name: the model name clients send.
        num_speculative_tokens: with a value k, ``--speculative-config`` of a draft model
            with k tokens (greedy chunks of k+1 tokens); None: a plain (reference) server.
        port: default a free one.
        log_path: the server's stdout+stderr (default: a temporary file, removed by :meth:`stop`).

    Start it with :meth:`start` (waits for ``/health`` 200 unless ``wait=False``); end it
    with :meth:`stop` (idempotent). Also a context manager (started on enter).
    """

    def __init__(self, *flags: str, served_model_name: str = "fake", num_speculative_tokens: int | None = None,
                 port: int | None = None, log_path: str | os.PathLike | None = None):
        self.flags = list(flags)
        self.served_model_name = served_model_name
        self.num_speculative_tokens = num_speculative_tokens
        self.port = port or free_ports(_HOST, 1)[0]
        self.base_url = f"http://{_HOST}:{self.port}"
        self._own_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="fake-vllm-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.popen: subprocess.Popen | None = None
        self._api: psutil.Process | None = None
        self._known: dict[int, psutil.Process] = {}

    # ------------------------------------------------------------------ start
    def command(self) -> list[str]:
        cmd = [sys.executable, str(FAKE_PATH), "--model", self.served_model_name,
               "--served-model-name", self.served_model_name, "--host", _HOST, "--port", str(self.port)]
        if self.num_speculative_tokens:
            cmd += ["--speculative-config",
                    f'{{"method": "draft_model", "model": "draft", '
                    f'"num_speculative_tokens": {int(self.num_speculative_tokens)}}}']
        return cmd + self.flags

    def start(self, wait: bool = True, timeout_s: float = 20.0) -> "FakeProcess":
        """Spawn the fake (its own session, dies with the starting thread); with ``wait``
        block until ``/health`` answers 200.

        Raises:
            RuntimeError: it exited or was not ready within ``timeout_s`` (the log tail is in the message).
        """
        if self.popen is not None:
            return self
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as logf:
            self.popen = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=logf,
                                          stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                          preexec_fn=die_with_parent(), close_fds=True)
        try:
            self._api = psutil.Process(self.popen.pid)
            self._known[self._api.pid] = self._api
        except psutil.Error:
            self._api = None
        if wait:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Poll ``/health`` until 200 (every 20 ms)."""
        assert self.popen is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        with http_client(2.0) as client:
            while True:
                if self.popen.poll() is not None:
                    raise RuntimeError(f"fake vLLM exited with {self.popen.returncode} during start-up:\n"
                                       f"{self.log_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        self.tree()   # remember engine and worker for stop()
                        return
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"fake vLLM not ready within {timeout_s} s:\n{self.log_text()[-2000:]}")
                time.sleep(0.02)

    # ------------------------------------------------------------------ look
    @property
    def pid(self) -> int:
        assert self.popen is not None, "start() first"
        return self.popen.pid

    def api_process(self) -> psutil.Process | None:
        """The API process while it runs (pid-reuse safe: the handle made at spawn)."""
        return self._api if self._api is not None and procs.alive(self._api) else None

    def roles(self) -> dict[str, list[psutil.Process]]:
        """``{"api", "engine", "worker"}`` → live processes, found by the harness's own
        :func:`harness.stack.procs.tree_roles`."""
        roles = procs.tree_roles(self.api_process())
        for ps in roles.values():
            for p in ps:
                self._known.setdefault(p.pid, p)
        return roles

    def role(self, name: str) -> psutil.Process:
        """The one live process of role ``name`` (``api``, ``engine``, ``worker``)."""
        (p,) = self.roles()[name]
        return p

    def tree(self) -> list[psutil.Process]:
        """The API process and its live descendants (remembered for :meth:`stop`)."""
        api = self.api_process()
        found = ([api] + procs.descendants(api)) if api else []
        for p in found:
            self._known.setdefault(p.pid, p)
        return found

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------------ test hooks
    def _get_json(self, path: str) -> Any:
        with http_client(5.0) as c:
            r = c.get(self.base_url + path)
            r.raise_for_status()
            return r.json()

    @property
    def bodies(self) -> list[dict]:
        """The JSON bodies of the completion requests it received, oldest first (test hook)."""
        return self._get_json("/fake/requests")["bodies"]

    @property
    def flaky_seen(self) -> dict[str, int]:
        """Requests of the ``flaky`` scenario per prompt text (test hook)."""
        return self._get_json("/fake/requests")["flaky"]

    def release(self) -> None:
        """Wake the scenarios that wait (``hang_head``, ``hang_after_chunk``, ``trickle``, ``slow``)."""
        with http_client(5.0) as c:
            c.post(self.base_url + "/fake/release")

    def metrics_text(self) -> str:
        with http_client(5.0) as c:
            r = c.get(self.base_url + "/metrics")
            r.raise_for_status()
            return r.text

    # ------------------------------------------------------------------ stop
    def _group_is_ours(self) -> bool:
        """Whether process group ``pid`` still is the one this fake made (pid-reuse safe):
        its leader is our API process, or gone (a group id is not reused while members live)."""
        if self._api is None:
            return False
        try:
            leader = psutil.Process(self.popen.pid)
            return abs(leader.create_time() - self._api.create_time()) <= procs.CREATE_TIME_TOLERANCE_S
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False

    def stop(self, timeout_s: float = 5.0) -> list[psutil.Process]:
        """SIGKILL the whole tree (every process ever seen in it) and its process group,
        wait until they are gone; idempotent. Returns what is still alive (normally [])."""
        if self.popen is None:
            return []
        self.tree()
        pgid = self.popen.pid if self._group_is_ours() else None
        left = procs.kill_tree(list(self._known.values()), pgid=pgid, timeout_s=timeout_s, tracker_grace_s=0.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout_s)
        if self._own_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        return left

    def __enter__(self) -> "FakeProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"FakeProcess({self.base_url}, pid={self.popen.pid if self.popen else None})"


@contextlib.contextmanager
def run_fake(*flags: str, **kw: Any) -> Iterator[FakeProcess]:
    """``with run_fake(*flags, **kw) as fake:`` a started, ready :class:`FakeProcess`, always
    stopped (whole tree) at the end; raises AssertionError if something of it survived."""
    fake = FakeProcess(*flags, **kw)
    try:
        fake.start()
        yield fake
    finally:
        left = fake.stop()
        assert not left, f"fake vLLM processes survived: {[p.pid for p in left]}"


class FakeServer(LocalServer):
    """A supervised :class:`~harness.stack.local.LocalServer` that runs the fake vLLM.

    Same arguments as LocalServer, plus ``fake_args``: fake-only flags appended to the
    command (see :mod:`tests.fakes.fake_vllm`). Readiness, restarts, roles and tear-down
    are the harness's own.
    """

    def __init__(self, *args: Any, fake_args: Sequence[str] = (), **kw: Any):
        super().__init__(*args, **kw)
        self.fake_args = list(fake_args)

    def command(self) -> list[str]:
        cmd = super().command()
        if cmd[:3] != VLLM_HEAD:
            raise AssertionError(f"LocalServer.command() no longer starts with {VLLM_HEAD}: {cmd[:4]}")
        return [sys.executable, str(FAKE_PATH), *cmd[3:], *self.fake_args]
