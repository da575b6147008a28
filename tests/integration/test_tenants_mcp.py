"""Issue 31, MCP over HTTP: an MCP session belongs to the key that opened it. Another key that
learns its `Mcp-Session-Id` can neither call tools in it, nor take over the stream of a call
under way (and so its result), nor cancel its calls, nor end it (which kills its sandbox).
Raw HTTP, as an attacker would send it."""

import json
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from conftest import API_KEY

PROTOCOL = "2025-06-18"


def mcp(server, key, method, body=None, session=None, headers=None):
    """One request to /mcp; returns (status, headers, SSE events as (id, data) or a JSON body)."""
    sent = {"X-API-Key": key, "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json", **(headers or {})}
    if session:
        sent.update({"Mcp-Session-Id": session, "MCP-Protocol-Version": PROTOCOL})
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{server.url}/mcp", data=data, headers=sent, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, answer, raw = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, answer, raw = e.code, e.headers, e.read().decode()
    if not (answer.get("Content-Type") or "").startswith("text/event-stream"):
        return status, answer, raw
    events, event_id = [], None
    for line in raw.splitlines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:") and line[5:].strip():
            events.append((event_id, line[5:].strip()))
    return status, answer, events


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                         "clientInfo": {"name": "test", "version": "1"}}}


def open_session(server, key):
    status, headers, _ = mcp(server, key, "POST", INITIALIZE)
    assert status == 200, status
    session = headers["Mcp-Session-Id"]
    status, _, _ = mcp(server, key, "POST", {"jsonrpc": "2.0", "method": "notifications/initialized"},
                       session)
    assert status == 202, status
    return session


def run(server, key, session, command, call_id):
    return mcp(server, key, "POST", {
        "jsonrpc": "2.0", "id": call_id, "method": "tools/call",
        "params": {"name": "run_command", "arguments": {"command": command}}}, session)


def stdout(events):
    """The stdout of a run_command's result."""
    text = json.loads(events[-1][1])["result"]["content"][0]["text"]
    return text.split("[stdout]\n", 1)[1].split("\n[stderr]", 1)[0]


def resume(server, key, session, stream):
    """`GET` of a session's stream `stream` (a counter rmcp keeps per session: 0, 1, ...) from
    its start, as a client that lost its connection asks for it again."""
    return mcp(server, key, "GET", session=session,
               headers={"Accept": "text/event-stream", "Last-Event-ID": f"0/{stream}"})


class Slow:
    """A run_command of `key` in `session` that takes a few seconds, in a thread."""

    def __init__(self, server, key, session, command, call_id):
        self.answer = None
        self.thread = threading.Thread(target=self.run, args=(server, key, session, command, call_id))
        self.thread.start()
        time.sleep(1.5)  # under way

    def run(self, *args):
        self.answer = run(*args)

    def result(self):
        self.thread.join(60)
        return self.answer


@pytest.mark.newest_sdk
def test_another_key_cannot_use_take_over_or_end_a_leaked_session(server, other_key):
    from e2b import Sandbox

    secret = f"secret-{uuid.uuid4().hex[:8]}"
    session = open_session(server, API_KEY)
    status, _, events = run(server, API_KEY, session, "hostname", 2)
    assert status == 200, events
    sandbox_id = stdout(events).split()[-1]  # the hostname of a sandbox is its id

    def running():
        return sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
    assert running()

    # The other key, with the leaked session id: the stream of a call under way asked for again
    # (which would hand it the result), a notification that cancels, tool calls, and the
    # session's end. Each must be answered as an unknown session is; what got through is
    # listed at the end.
    got_through = []

    def refused(what, answer):
        status, _, body = answer
        if secret in json.dumps(body):
            got_through.append(f"{what} got the victim's result: {body}")
        elif status != 404 or not isinstance(body, str) or json.loads(body)["code"] != 404:
            got_through.append(f"{what}: {status} {str(body)[:300]}")

    slow = Slow(server, API_KEY, session, f"sleep 4; echo {secret}", 3)
    for stream in range(3):
        refused(f"GET of stream {stream}", resume(server, other_key, session, stream))
    refused("cancel", mcp(server, other_key, "POST", {
        "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}},
        session))
    status, _, events = slow.result()
    if secret not in json.dumps(events):
        got_through.append(f"the victim's own call lost its result: {status} {events}")
    refused("run_command", run(server, other_key, session, "hostname", 4))
    refused("kill_sandbox", mcp(server, other_key, "POST", {
        "jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "kill_sandbox", "arguments": {}}}, session))
    refused("DELETE", mcp(server, other_key, "DELETE", session=session))
    time.sleep(2)  # an ended session kills its sandbox just after
    if not running():
        got_through.append("the victim's sandbox is gone")
    assert not got_through, "\n".join(got_through)

    # The session and its sandbox are the victim's still: the same sandbox answers it, and its
    # own key can ask for a call's stream again, as the other key could not (so the probe
    # above would have seen the result).
    status, _, events = run(server, API_KEY, session, "hostname", 6)
    assert status == 200 and stdout(events).strip() == sandbox_id, events
    slow = Slow(server, API_KEY, session, f"sleep 4; echo {secret}-again", 7)
    again = [resume(server, API_KEY, session, stream) for stream in range(6)]
    assert any(f"{secret}-again" in json.dumps(body) for _, _, body in again), again
    slow.result()
    status, _, _ = mcp(server, API_KEY, "DELETE", session=session)
    assert status in (200, 202, 204), status
    # Its end, by its own key, kills its sandbox; and the id now finds nothing for anyone.
    deadline = time.time() + 30
    while running() and time.time() < deadline:
        time.sleep(0.2)
    assert not running()
    status, _, _ = run(server, API_KEY, session, "hostname", 8)
    assert status == 404


@pytest.mark.newest_sdk
def test_sessions_of_two_keys_side_by_side(server, other_key):
    """Positive control for the binding: each key works in its own session at the same time."""
    mine, theirs = open_session(server, API_KEY), open_session(server, other_key)
    for key, session in ((API_KEY, mine), (other_key, theirs)):
        status, _, events = run(server, key, session, "echo ok", 2)
        assert status == 200 and "ok" in events[-1][1], events
    for key, session in ((API_KEY, mine), (other_key, theirs)):
        assert mcp(server, key, "DELETE", session=session)[0] in (200, 202, 204)


@pytest.mark.newest_sdk
def test_one_key_cannot_open_sessions_without_end(server, other_key):
    """Each open session holds memory until it idles out: a key may have 64 at once."""
    opened = [open_session(server, other_key) for _ in range(64)]
    status, _, body = mcp(server, other_key, "POST", INITIALIZE)
    assert status == 429 and "64 MCP sessions" in json.loads(body)["message"], (status, body)
    # Another key is not held up by it; and one ended session makes room.
    mine = open_session(server, API_KEY)
    assert mcp(server, API_KEY, "DELETE", session=mine)[0] in (200, 202, 204)
    assert mcp(server, other_key, "DELETE", session=opened.pop())[0] in (200, 202, 204)
    opened.append(open_session(server, other_key))
    for session in opened:
        assert mcp(server, other_key, "DELETE", session=session)[0] in (200, 202, 204)
