"""Idempotent creates (the SDK's `idempotency_key`) and lifecycle events
(`GET /events/sandboxes/{id}`), each per API key: another key's probe has its positive control,
the owner, doing the same thing."""

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import SandboxException

from harness import API_KEY

LIFECYCLE = "sandbox.lifecycle."


def test_the_same_idempotency_key_makes_one_sandbox_per_api_key(server, other_key):
    key, test_id = str(uuid.uuid4()), uuid.uuid4().hex
    made = {}  # sandbox id: the API key that made it

    def create(api_key=API_KEY):
        sbx = Sandbox.create("base", metadata={"test_id": test_id}, idempotency_key=key,
                             api_key=api_key)
        made[sbx.sandbox_id] = api_key
        return sbx.sandbox_id

    try:
        # Duplicates at once, then a retry: one sandbox, the same answer for all.
        with ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(lambda _: create(), range(4)))
        assert len(set(ids)) == 1, ids
        assert create() == ids[0]
        listed = Sandbox.list(query=SandboxQuery(metadata={"test_id": test_id})).next_items()
        assert [s.sandbox_id for s in listed] == ids[:1]

        # The same key with another request is refused, as JSON, and makes nothing.
        status, body = server.api("POST", "/v2/sandboxes", {"templateID": "base"},
                                  headers={"Idempotency-Key": key})
        assert status == 409 and body["code"] == 409 and "different" in body["message"], body
        with pytest.raises(SandboxException, match="409"):
            Sandbox.create("base", metadata={"test_id": "other"}, idempotency_key=key)

        # Another API key's same key is its own: a sandbox of its own.
        assert create(api_key=other_key) != ids[0]
    finally:
        for sandbox_id, api_key in made.items():
            Sandbox.kill(sandbox_id, api_key=api_key)


def events(server, sandbox_id, query="", key=API_KEY):
    return server.api("GET", f"/events/sandboxes/{sandbox_id}{query}", key=key)


def test_lifecycle_events_are_recorded_in_order_for_the_owner_only(server, other_key, names):
    sbx = Sandbox.create("base", metadata={"test_id": uuid.uuid4().hex})
    sandbox_id = sbx.sandbox_id
    try:
        sbx.set_timeout(120)
        sbx.pause()
        Sandbox.connect(sandbox_id)
        snap = sbx.create_snapshot(name=names())
        Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        sbx.kill()

    # Read after the kill, oldest first, with E2B's fields.
    status, body = events(server, sandbox_id, "?orderAsc=true&limit=100")
    assert status == 200, body
    assert [e["type"].removeprefix(LIFECYCLE) for e in body] == [
        "created", "updated", "paused", "resumed", "checkpointed", "killed"]
    assert all(e["sandboxId"] == sandbox_id and e["sandboxTemplateId"] == "base"
               and e["version"] == "v1" and e["sandboxTeamId"] for e in body)
    assert [e["timestamp"] for e in body] == sorted(e["timestamp"] for e in body)
    assert body[1]["eventData"]["set_timeout"].endswith("Z") and body[0]["eventData"] is None

    # Newest first by default, ten at most; filtered by type; in pages.
    status, newest = events(server, sandbox_id)
    assert [e["id"] for e in newest] == [e["id"] for e in reversed(body)]
    status, typed = events(server, sandbox_id, f"?types={LIFECYCLE}paused&types={LIFECYCLE}resumed")
    assert [e["type"] for e in typed] == [LIFECYCLE + "resumed", LIFECYCLE + "paused"]
    status, page = events(server, sandbox_id, "?orderAsc=true&offset=4&limit=1")
    assert [e["id"] for e in page] == [body[4]["id"]]
    status, bad = events(server, sandbox_id, "?types=sandbox.lifecycle.exploded")
    assert status == 400 and bad["code"] == 400, bad

    # Another key: not found, as a sandbox that never was; and none in its own list.
    status, theirs = events(server, sandbox_id, key=other_key)
    assert status == 404 and theirs["code"] == 404 and theirs["message"], theirs
    status, all_theirs = server.api("GET", "/events/sandboxes", key=other_key)
    assert status == 200 and not any(e["sandboxId"] == sandbox_id for e in all_theirs)
    status, never = events(server, "never0existed0id")
    assert status == 404, never
