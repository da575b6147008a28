"""Admission and quotas: a server's room and a key's limits hold under concurrent creates, and
what is refused gets a clear 429 while what was admitted works."""

import concurrent.futures
import uuid

import pytest
from e2b import Sandbox

from conftest import airlock_key


@pytest.fixture
def small_server(server, restarted):
    """The server restarted with room for 8 sandboxes; restored afterwards."""
    restarted("--max-sandboxes", "8")
    return server


def test_forty_creates_against_room_for_eight(small_server):
    tag = uuid.uuid4().hex

    def create(_):
        return small_server.api("POST", "/v2/sandboxes", {"templateID": "base", "metadata": {"t": tag}})

    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        results = list(pool.map(create, range(40)))
    made = [body["sandboxID"] for status, body in results if status == 201]
    refused = [body for status, body in results if status == 429]
    try:
        assert (len(made), len(refused)) == (8, 32), [s for s, _ in results]
        assert all(r["code"] == 429 and "maximum of 8" in r["message"] for r in refused)
        # What was admitted works.
        for sandbox_id in made[:2]:
            assert Sandbox.connect(sandbox_id).commands.run("echo ok").stdout == "ok\n"
    finally:
        for sandbox_id in made:
            small_server.api("DELETE", f"/sandboxes/{sandbox_id}")


def test_a_key_is_held_to_its_limits(server):
    name = f"limited-{uuid.uuid4().hex[:6]}"
    key = airlock_key(server, "create", "--name", name,
                      "--max-running", "1", "--max-paused", "1", "--max-snapshot-mb", "1")
    listed = [line.split() for line in airlock_key(server, "ls").splitlines() if name in line]
    assert listed and "running=1,paused=1,snapshot_mb=1" in listed[0], listed
    first = Sandbox.create("base", api_key=key)
    others = Sandbox.create("base")  # the control: another key is not held to it
    try:
        status, body = server.api("POST", "/v2/sandboxes", {"templateID": "base"}, key=key)
        assert status == 429 and "at most 1 sandboxes" in body["message"], body
        # Snapshot disk: the first snapshot fits (none taken yet); then the key is at its limit.
        first.create_snapshot(name="one")
        status, body = server.api("POST", f"/sandboxes/{first.sandbox_id}/snapshots", {"name": "two"}, key=key)
        assert status == 429 and "MiB" in body["message"], body
        # Paused: one, and its running place is free again.
        assert first.pause() is True
        second = Sandbox.create("base", api_key=key)
        status, body = server.api("POST", f"/sandboxes/{second.sandbox_id}/pause", key=key)
        assert status == 429 and "paused" in body["message"], body
        assert second.commands.run("echo still running").stdout == "still running\n"
        second.kill()
    finally:
        Sandbox.kill(first.sandbox_id, api_key=key)
        Sandbox.delete_snapshot("one", api_key=key)
        others.kill()
