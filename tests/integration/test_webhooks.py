"""Webhooks (`/events/webhooks`, E2B's shapes): a key's webhook hears that key's sandboxes'
lifecycle events in order, signed as E2B signs them, retried when the receiver fails, and
never slowing a verb; another key can neither see it nor feed it. A real HTTP receiver runs in
this process on loopback, which the server reaches only with `--webhooks-allow-private`."""

import json
import socket
import time
import uuid

import pytest
from e2b import Sandbox
from receiver import Receiver, signature

LIFECYCLE = "sandbox.lifecycle."
ALL_EVENTS = [LIFECYCLE + e for e in ("created", "updated", "paused", "resumed", "killed")]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def private_allowed(server):
    """The server, restarted with `--webhooks-allow-private` for this module's tests that
    receive on loopback; put back afterwards."""
    saved = list(server.extra_args)
    server.stop()
    server.extra_args = saved + ["--webhooks-allow-private"]
    server.start()
    yield server
    server.stop()
    server.extra_args = saved
    server.start()


def register(server, url, events=ALL_EVENTS, secret="s3cret", key=None, **more):
    body = {"name": "test hook", "url": url, "events": events, "signatureSecret": secret, **more}
    kwargs = {"key": key} if key else {}
    return server.api("POST", "/events/webhooks", body, **kwargs)


def events_of(requests, sandbox_id):
    """The events of `sandbox_id` among the requests, as sent, with their headers."""
    out = []
    for headers, raw in requests:
        event = json.loads(raw)
        if event["sandboxId"] == sandbox_id:
            out.append((headers, raw, event))
    return out


def kinds(events):
    return [e["type"].removeprefix(LIFECYCLE) for _, _, e in events]


def test_webhooks_reach_only_public_addresses_unless_the_operator_allows_it(
        server, receiver, restarted):
    # Addresses only this server reaches are refused at registration, with a precise 400.
    for url in [receiver.url("/ok"), f"http://localhost:{receiver.port}/x",
                "http://169.254.169.254/latest/meta-data", "http://[::1]/x", "http://10.0.0.1/x"]:
        status, body = register(server, url)
        assert status == 400 and body["code"] == 400, (url, body)
        assert "--webhooks-allow-private" in body["message"], body
    for bad in [{"url": "ftp://example.com/x"}, {"events": []},
                {"events": ["sandbox.lifecycle.exploded"]}, {"secret": ""}]:
        status, body = register(server, **{"url": "https://hooks.example.com/x", **bad})
        assert status == 400 and body["code"] == 400 and body["message"], (bad, body)
    # Positive control: a public URL is taken.
    status, public = register(server, "https://hooks.example.com/airlock")
    assert status == 201, public
    assert server.api("DELETE", f"/events/webhooks/{public['id']}")[0] == 200

    # A name that resolves to this host passes registration, but no request is sent to it.
    name = socket.gethostname()
    assert all(a[4][0].startswith("127.") for a in socket.getaddrinfo(name, 80)), name
    status, hook = register(server, f"http://{name}:{receiver.port}/by-name")
    assert status == 201, hook
    try:
        def create_and_kill():
            sbx = Sandbox.create("base", metadata={"test_id": uuid.uuid4().hex})
            sbx.kill()
            return sbx.sandbox_id

        def refused():
            return [line for line in server.log.read_text().splitlines()
                    if "webhook delivery failed" in line and hook["id"] in line]

        create_and_kill()
        # The deliverer tried and was refused (its log says why), and nothing arrived.
        deadline = time.monotonic() + 30
        while not (refused() or receiver.requests("/by-name")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert receiver.requests("/by-name") == [], "sent to an address only this host has"
        assert refused() and "--webhooks-allow-private" in refused()[0], refused()

        # Positive control: with the operator's flag the same webhook hears the next sandbox.
        restarted("--webhooks-allow-private")
        sandbox_id = create_and_kill()
        got = receiver.wait("/by-name", lambda r: len(events_of(r, sandbox_id)) == 2)
        assert kinds(events_of(got, sandbox_id)) == ["created", "killed"]
    finally:
        server.api("DELETE", f"/events/webhooks/{hook['id']}")


def test_a_keys_webhook_hears_its_own_sandboxes_in_order_signed(
        private_allowed, receiver, other_key):
    server = private_allowed
    status, hook = register(server, receiver.url("/mine"), secret="whsec-mine")
    assert status == 201, hook
    hook_id = hook["id"]
    try:
        # E2B's fields; the secret is never shown again.
        assert hook["url"] == receiver.url("/mine") and hook["enabled"] is True
        assert sorted(hook["events"]) == sorted(ALL_EVENTS) and hook["name"] == "test hook"
        assert hook["teamId"] and hook["createdAt"].endswith("Z")
        status, listed = server.api("GET", "/events/webhooks")
        assert status == 200 and [h for h in listed if h["id"] == hook_id] == [hook]
        status, one = server.api("GET", f"/events/webhooks/{hook_id}")
        assert status == 200 and one == hook
        assert "whsec-mine" not in json.dumps([hook, listed, one])

        # Another key: not found, whatever it does; none in its list.
        for method, body in [("GET", None), ("PATCH", {"enabled": False}), ("DELETE", None)]:
            status, theirs = server.api(method, f"/events/webhooks/{hook_id}", body,
                                        key=other_key)
            assert status == 404 and theirs["code"] == 404, (method, theirs)
        status, their_list = server.api("GET", "/events/webhooks", key=other_key)
        assert status == 200 and their_list == []

        # Another key's sandbox feeds nothing here...
        theirs = Sandbox.create("base", api_key=other_key, metadata={"test_id": "other"})
        theirs.kill()
        # ...its own sandbox does (the positive control), every event in order.
        sbx = Sandbox.create("base", metadata={"test_id": uuid.uuid4().hex})
        sbx.pause()
        Sandbox.connect(sbx.sandbox_id)
        sbx.kill()
        got = receiver.wait("/mine", lambda r: len(events_of(r, sbx.sandbox_id)) >= 4)
        mine = events_of(got, sbx.sandbox_id)
        assert kinds(mine) == ["created", "paused", "resumed", "killed"]
        for headers, raw, event in mine:
            headers = {k.lower(): v for k, v in headers.items()}
            assert headers["e2b-signature"] == signature("whsec-mine", raw), headers
            assert headers["e2b-signature-version"] == "v1"
            assert headers["e2b-webhook-id"] == hook_id
            assert event["version"] == "v1" and event["sandboxTemplateId"] == "base"
            assert event["sandboxTeamId"] == hook["teamId"]
        assert len({h["e2b-delivery-id"] for h, _, _ in mine}) == 4
        assert [e["timestamp"] for *_, e in mine] == sorted(e["timestamp"] for *_, e in mine)
        time.sleep(1)
        assert events_of(receiver.requests("/mine"), theirs.sandbox_id) == []

        # A disabled webhook hears nothing; the owner's update says so.
        status, off = server.api("PATCH", f"/events/webhooks/{hook_id}", {"enabled": False})
        assert status == 200 and off["enabled"] is False, off
        quiet = Sandbox.create("base", metadata={"test_id": uuid.uuid4().hex})
        quiet.kill()
    finally:
        assert server.api("DELETE", f"/events/webhooks/{hook_id}")[0] == 200
    assert server.api("GET", f"/events/webhooks/{hook_id}")[0] == 404
    time.sleep(1)
    assert events_of(receiver.requests("/mine"), quiet.sandbox_id) == []


def test_a_failed_delivery_is_retried(private_allowed, receiver):
    server = private_allowed
    status, hook = register(server, receiver.url("/flaky"), events=[LIFECYCLE + "created"])
    assert status == 201, hook
    try:
        sbx = Sandbox.create("base", metadata={"test_id": uuid.uuid4().hex})
        sbx.kill()
        got = receiver.wait("/flaky", lambda r: len(r) >= 2)
        (first_headers, first), (again_headers, again) = got[:2]
        assert first == again and json.loads(first)["sandboxId"] == sbx.sandbox_id
        assert again_headers["e2b-signature"] == signature("s3cret", again)
        assert first_headers["e2b-delivery-id"] != again_headers["e2b-delivery-id"]
        time.sleep(3)
        assert len(receiver.requests("/flaky")) == 2, "answered 200: no more tries"
    finally:
        server.api("DELETE", f"/events/webhooks/{hook['id']}")


def test_a_hanging_webhook_never_slows_a_verb(private_allowed, receiver):
    server = private_allowed

    def create_and_kill():
        start = time.monotonic()
        sbx = Sandbox.create("base", metadata={"test_id": uuid.uuid4().hex})
        created = time.monotonic() - start
        sbx.kill()
        return created, time.monotonic() - start - created

    baseline = [create_and_kill() for _ in range(2)]
    hooks = []
    try:
        # As many webhooks as a key may have, all at a receiver that never answers.
        for n in range(10):
            status, hook = register(server, receiver.url(f"/hang{n}"))
            assert status == 201, hook
            hooks.append(hook["id"])
        status, body = register(server, receiver.url("/hang-more"))
        assert status == 429 and body["code"] == 429, body
        slow = [create_and_kill() for _ in range(3)]
        # The deliveries were made and are stuck...
        receiver.wait("/hang0", lambda r: len(r) >= 1)
        # ...and the verbs took as long as without them (loosely: the guarantee is structural).
        worst_create = max(c for c, _ in baseline)
        worst_kill = max(k for _, k in baseline)
        assert all(c < worst_create * 2 + 3 for c, _ in slow), (baseline, slow)
        assert all(k < worst_kill * 2 + 3 for _, k in slow), (baseline, slow)
    finally:
        for hook_id in hooks:
            server.api("DELETE", f"/events/webhooks/{hook_id}")
