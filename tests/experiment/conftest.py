"""Fixtures of the experiment tests."""

import pytest

from tests.experiment.files import MODELS


@pytest.fixture
def models_built():
    """Skip when the tiny models are not built (``make test`` builds them)."""
    if not (MODELS / "manifest.json").exists():
        pytest.skip("models not built (make test builds them)")
