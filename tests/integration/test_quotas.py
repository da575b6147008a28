"""Admission and quotas: a server's room and a key's limits hold under concurrent creates, and
what is refused gets a clear 429 while what was admitted works."""

import concurrent.futures
import json
import uuid

import pytest
from e2b import Sandbox

from conftest import airlock_key
from harness import API_KEY, fetch
from test_operator_metrics import scrape, wait_for


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


def test_a_burst_past_the_launches_is_queued_or_refused_at_once(server, restarted):
    """One launch at a time and no queueing (every create boots: no pools): of a burst, some
    are made and work, the rest get a prompt 429 with Retry-After and E2B's JSON body, the
    server's own API answers throughout, and nothing refused is left behind."""
    restarted("--max-launches", "1", "--max-launch-wait-secs", "0", "--pool-size", "0")
    tag = uuid.uuid4().hex
    body = json.dumps({"templateID": "base", "metadata": {"t": tag}}).encode()
    headers = {"X-API-KEY": API_KEY, "Content-Type": "application/json"}

    def create(_):
        return fetch(server.url + "/v2/sandboxes", headers, "POST", body)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        burst = [pool.submit(create, i) for i in range(8)]
        health, _, _ = fetch(server.url + "/health")
        results = [f.result() for f in burst]
    made = [json.loads(text)["sandboxID"] for status, _, text in results if status == 201]
    refused = [(h, json.loads(text)) for status, h, text in results if status == 429]
    try:
        assert health == 200
        assert made and refused and len(made) + len(refused) == 8, [s for s, _, _ in results]
        for h, answer in refused:
            assert int(h["Retry-After"]) >= 1, dict(h)
            assert answer["code"] == 429 and "busy starting other sandboxes" in answer["message"], answer
        assert Sandbox.connect(made[0]).commands.run("echo ok").stdout == "ok\n"
        status, listed = server.api("GET", f"/v2/sandboxes?metadata=t%3D{tag}")
        assert status == 200 and sorted(s["sandboxID"] for s in listed) == sorted(made), listed
    finally:
        for sandbox_id in made:
            server.api("DELETE", f"/sandboxes/{sandbox_id}")


def pooled(metrics):
    return sum(v for (name, _), v in metrics.items() if name == "airlock_pool_ready")


def test_pooled_sandboxes_give_way_to_creates_at_the_cap(server, restarted):
    """Pools fill only the room that --max-sandboxes leaves; at the cap a create that the pools
    cannot serve still gets in, and a ready pooled sandboxes nobody asked for gives way."""
    restarted("--max-sandboxes", "3")
    wait_for(server, lambda m: pooled(m) == 3, within=120)
    made = []
    try:
        for _ in range(3):
            # Another size than the pools': restored afresh, not taken from them.
            status, body = server.api("POST", "/v2/sandboxes", {"templateID": "base", "cpuCount": 1})
            assert status == 201, body
            made.append(body["sandboxID"])
        assert pooled(scrape(server)) == 0
        status, body = server.api("POST", "/v2/sandboxes", {"templateID": "base", "cpuCount": 1})
        assert status == 429 and "maximum of 3" in body["message"], body
        assert Sandbox.connect(made[-1]).commands.run("echo ok").stdout == "ok\n"
    finally:
        for sandbox_id in made:
            server.api("DELETE", f"/sandboxes/{sandbox_id}")
