"""Tenants against each other: one API key must never reach another's snapshots, nobody without
a sandbox's tokens may drive its agent on either port, and `allowPublicTraffic: false` closes a
sandbox's user ports to requests without its traffic token. Each probe has a positive control:
the owner, or the right token, gets through the same way."""

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from e2b import Sandbox


def http(server, method, path, headers=None, body=None):
    """A raw request to the server's one port; returns (status, body text)."""
    req = urllib.request.Request(server.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_a_snapshot_belongs_to_its_key_alone(server, sandbox, other_key):
    name = f"ready-{uuid.uuid4().hex[:8]}"
    secret = uuid.uuid4().hex
    sandbox.files.write("/home/user/secret.txt", secret)
    snap = sandbox.create_snapshot(name=name)

    # The control: its owner starts a copy and reads the file.
    mine = Sandbox.create(snap.snapshot_id)
    try:
        assert mine.files.read("/home/user/secret.txt") == secret
    finally:
        mine.kill()

    # Another key gets exactly what a name that never existed gets.
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    theirs = server.api("POST", "/v2/sandboxes", {"templateID": snap.snapshot_id}, key=other_key)
    never = server.api("POST", "/v2/sandboxes", {"templateID": missing}, key=other_key)
    assert theirs[0] == never[0] == 404, (theirs, never)
    assert theirs[1]["message"].replace(snap.snapshot_id, "X") == never[1]["message"].replace(missing, "X")
    assert snap.snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots(api_key=other_key).next_items()]
    assert Sandbox.delete_snapshot(snap.snapshot_id, api_key=other_key) is False

    # The other key's snapshot of the same name is its own and takes nothing over.
    other = Sandbox.create("base", api_key=other_key)
    try:
        other.files.write("/home/user/secret.txt", "the other key's")
        assert other.create_snapshot(name=name).snapshot_id == snap.snapshot_id
        copy = Sandbox.create(snap.snapshot_id, api_key=other_key)
        try:
            assert copy.files.read("/home/user/secret.txt") == "the other key's"
        finally:
            copy.kill()
        mine = Sandbox.create(snap.snapshot_id)
        try:
            assert mine.files.read("/home/user/secret.txt") == secret, "the owner's is untouched"
        finally:
            mine.kill()
        assert Sandbox.delete_snapshot(snap.snapshot_id, api_key=other_key) is True
    finally:
        other.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True


@pytest.mark.parametrize("name", ["base", "code-interpreter-v1"])
def test_a_snapshot_cannot_take_a_templates_name(server, sandbox, name):
    status, body = server.api("POST", f"/sandboxes/{sandbox.sandbox_id}/snapshots", {"name": name})
    assert status == 400 and "a template has that name" in body["message"], body


# Every route of the agent's two servers, with a body that the route answers quickly when the
# token is right (a 4xx of its own is fine: the point is that it is not 401).
ENVD_ROUTES = [
    ("GET", "/envs", None),
    ("GET", "/files?path=/etc/hostname", None),
    ("POST", "/files?path=/tmp/x", b"x"),
    *[("POST", f"/process.Process/{rpc}", b"{}") for rpc in
      ["Start", "Connect", "List", "SendInput", "StreamInput", "SendSignal", "CloseStdin", "Update"]],
    *[("POST", f"/filesystem.Filesystem/{rpc}", b'{"path": "/nonexistent"}') for rpc in
      ["Stat", "MakeDir", "Move", "ListDir", "Remove", "WatchDir", "CreateWatcher",
       "GetWatcherEvents", "RemoveWatcher"]],
    ("GET", "/no/such/route", None),
]
INTERPRETER_ROUTES = [
    ("POST", "/execute", b"{}"),
    ("GET", "/contexts", None),
    ("POST", "/contexts", b'{"language": "no-such-language"}'),
    ("DELETE", "/contexts/nosuchcontext", None),
    ("POST", "/contexts/nosuchcontext/restart", None),
    ("GET", "/no/such/route", None),
]


def test_every_agent_route_on_both_ports_wants_a_token(server):
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sbx = CodeSandbox.create()
    try:
        access, traffic = sbx._envd_access_token, sbx.traffic_access_token
        assert access and traffic, "both tokens come with the create response"

        def call(port, method, path, body, tokens):
            headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port),
                       "Content-Type": "application/json", **tokens}
            return http(server, method, path, headers, body)[0]

        right = {"X-Access-Token": access}
        wrong = {"X-Access-Token": access[:-1] + ("x" if access[-1] != "x" else "y")}
        for port, routes in [(49983, ENVD_ROUTES), (49999, INTERPRETER_ROUTES)]:
            for method, path, body in routes:
                assert call(port, method, path, body, {}) == 401, (port, method, path)
                assert call(port, method, path, body, wrong) == 401, (port, method, path)
                assert call(port, method, path, body, right) != 401, (port, method, path)
            assert call(port, "GET", "/health", None, {}) in (200, 204), port

        # The SDK proves itself on the context routes with the traffic token alone; running code
        # takes the access token.
        by_traffic = {"E2B-Traffic-Access-Token": traffic}
        assert call(49999, "GET", "/contexts", None, by_traffic) == 200
        assert call(49999, "POST", "/execute", b'{"code": "1"}', by_traffic) == 401
        assert call(49983, "POST", "/process.Process/List", b"{}", by_traffic) == 401
        # A valid signed URL needs no header; the agent's internal route is never forwarded.
        with urllib.request.urlopen(sbx.download_url("/etc/hostname"), timeout=30) as r:
            assert r.status == 200
        assert call(49983, "POST", "/init", b"{}", right) == 404

        # And the stock SDK, which sends what it has, still works on every route it uses.
        ctx = sbx.create_code_context()
        assert any(c.id == ctx.id for c in sbx.list_code_contexts())
        assert sbx.run_code("1 + 1", context=ctx).text == "2"
        sbx.restart_code_context(ctx)
        sbx.remove_code_context(ctx)
    finally:
        sbx.kill()


def wait_for_port(sbx, port):
    for _ in range(100):
        if sbx.commands.run(f"curl -s -o /dev/null localhost:{port} && echo up || true").stdout.strip() == "up":
            return
        time.sleep(0.1)
    raise AssertionError(f"port {port} never answered inside the sandbox")


def test_private_ports_need_the_traffic_token(server, sandbox_factory):
    private = sandbox_factory(network={"allow_public_traffic": False})
    public = sandbox_factory()
    token = private.traffic_access_token
    assert token
    for sbx in (private, public):
        sbx.commands.run("cd /tmp && python3 -m http.server 8080", background=True)
        wait_for_port(sbx, 8080)

    def get(sbx, headers):
        return http(server, "GET", "/", {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8080", **headers})

    # The control: a public sandbox's port answers anyone who knows its id, as on E2B.
    assert get(public, {})[0] == 200
    assert get(private, {"E2B-Traffic-Access-Token": token})[0] == 200
    for headers in [{}, {"E2B-Traffic-Access-Token": token[:-1] + "x"},
                    {"E2B-Traffic-Access-Token": public.traffic_access_token}]:
        status, body = get(private, headers)
        assert status == 403, (headers, body)
        assert json.loads(body)["code"] == 403 and "traffic access token" in json.loads(body)["message"]
    # Routing by Host is held to the same rule.
    status, _ = http(server, "GET", "/", {"Host": f"8080-{private.sandbox_id}.airlock.test"})
    assert status == 403
    # envd keeps its own token; the SDK needs nothing more.
    assert private.commands.run("echo still works").stdout == "still works\n"
    assert private.get_info().network["allow_public_traffic"] is False

    # update_network may open the ports (and the SDK's own update leaves the setting alone).
    private.update_network({"deny_out": ["203.0.113.0/24"]})
    assert get(private, {})[0] == 403
    status, _ = server.api("PUT", f"/sandboxes/{private.sandbox_id}/network", {"allowPublicTraffic": True})
    assert status == 204
    assert get(private, {})[0] == 200
    assert private.get_info().network["allow_public_traffic"] is True


def test_a_private_code_interpreter_works_through_the_sdk(server):
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sbx = CodeSandbox.create(network={"allow_public_traffic": False})
    try:
        ctx = sbx.create_code_context()
        assert sbx.run_code("6 * 7", context=ctx).text == "42"
        status, _ = http(server, "GET", "/contexts",
                         {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"})
        assert status == 403
    finally:
        sbx.kill()
