"""The nodes' admin routes (E2B's `GET /nodes`, `GET /nodes/{nodeID}`) and `clientID`: one
`airlock serve` is one node. They show every tenant's load, so only an operator's key
(`airlock key create --operator`) reads them."""

import json
import subprocess
import uuid

from harness import AIRLOCK, API_KEY
from conftest import airlock_key


def operator_key(server):
    return airlock_key(server, "create", "--operator", "--name", f"ops-{uuid.uuid4().hex[:8]}")


def node_cli(server, key, *args):
    return subprocess.run(
        [str(AIRLOCK), "--url", server.url, "--api-key", key, "node", *args],
        capture_output=True, text=True, timeout=60,
    )


def test_an_operator_sees_the_node_and_what_runs_there(server, sandbox_factory):
    ops = operator_key(server)
    status, nodes = server.api("GET", "/nodes", key=ops)
    assert status == 200 and len(nodes) == 1, nodes
    before = nodes[0]
    assert before["status"] == "ready"
    assert set(before) >= {"nodeID", "status", "sandboxCount", "allocatedCPU", "allocatedMemoryMiB"}

    small = sandbox_factory(cpuCount=1, memoryMB=512)
    large = sandbox_factory(cpuCount=2, memoryMB=768)
    status, node = server.api("GET", f"/nodes/{before['nodeID']}", key=ops)
    assert status == 200, node
    assert node["sandboxCount"] == before["sandboxCount"] + 2
    assert node["allocatedCPU"] == before["allocatedCPU"] + 3
    assert node["allocatedMemoryMiB"] == before["allocatedMemoryMiB"] + 512 + 768
    assert {small.sandbox_id, large.sandbox_id} <= set(node["sandboxes"])

    # Each sandbox names its node as E2B's clientID, in its detail and in the list.
    status, detail = server.api("GET", f"/sandboxes/{small.sandbox_id}")
    assert status == 200 and detail["clientID"] == before["nodeID"], detail
    status, listed = server.api("GET", "/v2/sandboxes")
    assert {s["clientID"] for s in listed if s["sandboxID"] == large.sandbox_id} == {before["nodeID"]}

    # A paused sandbox runs nowhere: the node no longer counts it.
    status, body = server.api("POST", f"/sandboxes/{large.sandbox_id}/pause")
    assert status == 204, body
    status, node = server.api("GET", f"/nodes/{before['nodeID']}", key=ops)
    assert node["sandboxCount"] == before["sandboxCount"] + 1
    assert large.sandbox_id not in node["sandboxes"]

    ls = node_cli(server, ops, "ls", "--json")
    assert ls.returncode == 0, ls.stderr
    assert [n["node"] for n in json.loads(ls.stdout)] == [before["nodeID"]]


def test_a_tenants_key_reads_no_node(server, sandbox):
    ops = operator_key(server)
    status, nodes = server.api("GET", "/nodes", key=ops)
    assert status == 200  # the control: the same request with the operator's key
    node_id = nodes[0]["nodeID"]
    for path in ("/nodes", f"/nodes/{node_id}"):
        status, body = server.api("GET", path)
        assert status == 403 and body["code"] == 403, body
        assert "airlock key create --operator" in body["message"]
        status, body = server.api("GET", path, key=None)
        assert status == 401, body
    ls = node_cli(server, API_KEY, "ls")
    assert ls.returncode == 1 and "--operator" in ls.stderr, ls.stderr

    status, body = server.api("GET", "/nodes/no-such-node", key=ops)
    assert status == 404 and "no node 'no-such-node'" in body["message"], body

    ops_id = json.loads(airlock_key(server, "ls", "--json"))
    mine = [k for k in ops_id if k["role"] == "operator" and k["revoked"] == "-"]
    assert mine, ops_id
    for k in mine:
        airlock_key(server, "revoke", k["id"])
    status, body = server.api("GET", "/nodes", key=ops)
    assert status == 401, body


def test_the_node_is_named_by_the_flag(server, restarted, sandbox_factory):
    restarted("--node-name", "Rack7-Node")
    sbx = sandbox_factory()
    status, detail = server.api("GET", f"/sandboxes/{sbx.sandbox_id}")
    assert status == 200 and detail["clientID"] == "rack7-node", detail
    status, nodes = server.api("GET", "/nodes", key=operator_key(server))
    assert [n["nodeID"] for n in nodes] == ["rack7-node"]

    bad = subprocess.run([str(AIRLOCK), "serve", "--node-name", "no/such name"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "is not a node name" in bad.stderr, bad.stderr
