"""A LocalServer that runs the fake vLLM (fake_vllm.py) instead of the real one."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.stack.local import LocalServer

FAKE = Path(__file__).with_name("fake_vllm.py")


class FakeServer(LocalServer):
    """Same supervision, readiness and teardown; the command is the fake vLLM."""

    def __init__(self, *args, fake_args=(), **kw):
        super().__init__(*args, **kw)
        self.fake_args = list(fake_args)

    def command(self) -> list[str]:
        return [sys.executable, str(FAKE), "--host", self.host, "--port", str(self.port), *self.fake_args]
