"""Launchers that run the fake vLLM under the harness's real supervision, for the fast
end-to-end path: the whole experiment (Chaos Toolkit control, probes, actions, locust
load, faults, judge, report) in seconds.

Each is a :class:`harness.stack.local.LocalStack` whose servers are
:class:`tests.fakes.launch.FakeServer`; registering one is one line
(:func:`harness.stack.launchers.register_launcher`), which is all a new launcher costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from harness.stack.launchers import register_launcher
from harness.stack.local import LocalServer, LocalStack
from harness.stack.vllm_server import VllmSpec
from tests.fakes.launch import FakeServer

__all__ = ["FakeStack", "MismatchFakeStack", "QuickFakeStack", "register_fake_launchers", "FAKE_LAUNCHERS"]


class FakeStack(LocalStack):
    """The local launcher with the fake vLLM in place of vLLM (launcher name ``fake``)."""

    launcher = "fake"
    server_class = FakeServer
    #: Fake-only flags per server name (see :mod:`tests.fakes.fake_vllm`).
    fake_args: ClassVar[dict[str, list[str]]] = {}

    def new_server(self, name: str, vllm_spec: VllmSpec, **kw: Any) -> LocalServer:
        return FakeServer(name, vllm_spec, fake_args=self.fake_args.get(name, []), **kw)


class MismatchFakeStack(FakeStack):
    """A speculative server whose greedy output differs from the reference's from the
    third token on: an integrity defect the judge must catch (launcher ``fake-mismatch``)."""

    launcher = "fake-mismatch"
    fake_args: ClassVar[dict[str, list[str]]] = {"spec": ["--mismatch"]}


class QuickFakeStack(FakeStack):
    """Both servers with a 10 ms engine step instead of the fake's default (launcher
    ``fake-quick``): for tests that time something finer than a default step, e.g. recovery
    instants resolved to 100 ms by one-token probes every 50 ms."""

    launcher = "fake-quick"
    fake_args: ClassVar[dict[str, list[str]]] = {name: ["--step-delay-s", "0.01"] for name in ("spec", "ref")}


FAKE_LAUNCHERS = {cls.launcher: cls for cls in (FakeStack, MismatchFakeStack, QuickFakeStack)}


def register_fake_launchers() -> None:
    """Register every fake launcher by name (idempotent)."""
    for name, cls in FAKE_LAUNCHERS.items():
        register_launcher(name, cls)
