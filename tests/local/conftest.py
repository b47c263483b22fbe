"""Fixtures of the local-backend tests."""

from __future__ import annotations

import pytest

from tests.local import images


@pytest.fixture(scope="session")
def engine_image() -> tuple[str, str]:
    engine, why = images.working_engine()
    if not engine:
        pytest.skip(f"{why}: the engine path is covered by the command lines in tests/local/test_containers.py")
    tag = "localhost/taugrid-test-sh:1"
    problem = images.build(engine, tag, ["sh", "sleep", "cat"])
    if problem:
        pytest.skip(f"{problem}: the engine path is covered by the command lines in tests/local/test_containers.py")
    return engine, tag
