"""Fixtures of the experiment tests."""

import pytest

from tests.experiment import plain_server
from tests.experiment.files import MODELS


@pytest.fixture
def models_built():
    """Skip when the tiny models are not built (``make test`` builds them)."""
    if not (MODELS / "manifest.json").exists():
        pytest.skip("models not built (make test builds them)")


@pytest.fixture(scope="session")
def plain_vllm_server(tmp_path_factory):
    """A speculative vLLM server booted as a plain subprocess (tests/experiment/plain_server.py),
    not yet ready: ``.ready()`` waits for it. The external launcher's module uses it and stops
    it at its end (the shared stack's two servers never run beside it); stopped here at the
    latest."""
    if not (MODELS / "manifest.json").exists():
        pytest.skip("models not built (make test builds them)")
    server = plain_server.boot(tmp_path_factory.mktemp("plain-server"))
    try:
        yield server
    finally:
        server.stop()
