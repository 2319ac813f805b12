"""Session fixtures for the core test-suite (helpers live in tests/helpers.py)."""

from __future__ import annotations

import pytest

from topologies import load_machine


@pytest.fixture(scope="session")
def frontier():
    return load_machine("frontier")


@pytest.fixture(scope="session")
def perlmutter():
    return load_machine("perlmutter")
