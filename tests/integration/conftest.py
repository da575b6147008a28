"""Integration fixtures: a real `airlock serve` with real gVisor sandboxes, driven by the pinned
`e2b` SDK. Run through ./test.sh, which builds the binaries and the `base` template first."""

import os
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import AIRLOCK, API_KEY, host_leftovers, start_server  # noqa: E402,F401

DATA_DIR = Path(os.environ.get("AIRLOCK_TEST_DATA_DIR", "/var/tmp/airlock-test"))


@pytest.fixture(scope="session")
def server():
    srv = start_server(DATA_DIR)
    yield srv
    srv.stop()


@pytest.fixture
def sandbox_factory(server):
    from e2b import Sandbox

    made = []

    def make(**kwargs):
        kwargs.setdefault("metadata", {})
        kwargs["metadata"].setdefault("test_id", uuid.uuid4().hex)
        sbx = Sandbox.create("base", **kwargs)
        made.append(sbx)
        return sbx

    yield make
    for sbx in made:
        try:
            sbx.kill()
        except Exception:
            pass


@pytest.fixture
def sandbox(sandbox_factory):
    return sandbox_factory()


