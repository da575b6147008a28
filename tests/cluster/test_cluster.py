"""Many machines, on one: the stock SDK against two gateways in front of two nodes that share a
PostgreSQL and an S3 server, each with templates of its own (node-2 fetches them). The tests run in file order on one cluster; the last ones stop a
gateway and then a node."""

import concurrent.futures
import json
import subprocess
import time
import uuid

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import RateLimitException, SandboxException, ServiceBusyException

from harness import fetch
from receiver import Receiver, signature


def node_of(cluster, sandbox_id, gateway=0):
    status, detail = cluster.api("GET", f"/sandboxes/{sandbox_id}", gateway=gateway)
    assert status == 200, detail
    return detail["clientID"]


def kill_all(sandboxes):
    for sbx in sandboxes:
        try:
            sbx.kill()
        except Exception:  # noqa: BLE001 - best effort at the end of a test
            pass


def test_nodes_are_listed_for_the_operator_only(cluster):
    status, nodes = cluster.api("GET", "/nodes", key=cluster.operator)
    assert status == 200, nodes
    assert sorted(n["nodeID"] for n in nodes) == ["node-1", "node-2"], nodes
    assert all(n["status"] == "ready" for n in nodes), nodes
    status, body = cluster.api("GET", "/nodes")
    assert status == 403 and "operator" in body["message"], body
    status, detail = cluster.api("GET", "/nodes/node-2", key=cluster.operator, gateway=1)
    assert status == 200 and detail["nodeID"] == "node-2", detail


def test_nodes_answer_only_gateways(cluster):
    """A node refuses a tenant's key and no key alike; the secret is what it takes (the
    positive control: the same request with it is answered)."""
    node = cluster.nodes[0]
    for headers in ({}, {"X-API-KEY": cluster.key}, {"X-Airlock-Caller": "anyone",
                                                      "X-Airlock-Cluster-Secret": "guess" * 8}):
        status, _, body = fetch(node + "/v2/sandboxes", headers)
        assert status == 401 and b"only its cluster's gateways" in body, (headers, body)
    secret = (cluster.dir / "cluster-secret").read_text().strip()
    status, _, body = fetch(node + "/cluster/node", {"X-Airlock-Cluster-Secret": secret})
    assert status == 200 and b'"nodeID":"node-1"' in body, body
    status, _, _ = fetch(node + "/health")
    assert status == 200


def test_the_state_database_is_reached_over_verified_tls_only(cluster):
    """The cluster's PostgreSQL takes TLS connections only, and every gateway's and node's
    connection to it is TLS. The controls: without the CA the server's certificate is refused,
    and a plain connection is refused by the server."""
    url = cluster.env["AIRLOCK_CLUSTER_DATABASE_URL"]
    ca = cluster.env["AIRLOCK_CLUSTER_DATABASE_CA"]
    assert "sslmode=require" in url
    assert "cluster-tenant" in cluster.airlock("key", "ls")
    untrusted = cluster.run_airlock("--database", url, "key", "ls")
    assert untrusted.returncode == 1 and "UnknownIssuer" in untrusted.stderr, untrusted.stderr
    plain = cluster.run_airlock("--database", url.replace("sslmode=require", "sslmode=disable"),
                                "key", "ls")
    assert plain.returncode == 1 and "no encryption" in plain.stderr, plain.stderr

    query = ("SELECT host(client_addr), ssl FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) "
             "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
    psql = subprocess.run(["psql", f"{url} sslmode=verify-full sslrootcert={ca}", "-AtF", " ",
                           "-c", query], capture_output=True, text=True, timeout=30)
    assert psql.returncode == 0, psql.stderr
    rows = [line.split() for line in psql.stdout.splitlines()]
    # Nodes connect from their own addresses (10.78.0.11, .12), gateways from one of the host's.
    nodes = {"10.78.0.11", "10.78.0.12"}
    assert nodes <= {addr for addr, _ in rows} and any(a not in nodes for a, _ in rows), rows
    assert all(ssl == "t" for _, ssl in rows), rows


def test_creates_spread_over_the_nodes(cluster):
    def create(i):
        sbx = Sandbox.create("base", **cluster.sdk(gateway=i % 2))
        assert sbx.commands.run("echo ok").stdout == "ok\n"
        return sbx

    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        sandboxes = list(pool.map(create, range(20)))
    try:
        nodes = [node_of(cluster, s.sandbox_id) for s in sandboxes]
        counts = {n: nodes.count(n) for n in set(nodes)}
        assert set(counts) == {"node-1", "node-2"} and min(counts.values()) >= 5, counts
        # Every gateway lists all of them, whichever node runs each.
        for gateway in (0, 1):
            listed = {s.sandbox_id for s in Sandbox.list(**cluster.sdk(gateway=gateway)).next_items()}
            assert {s.sandbox_id for s in sandboxes} <= listed

        # So does the dashboard, whose overview a gateway puts together from both nodes...
        status, page = cluster.api("GET", "/dashboard/", key=False, gateway=1)
        assert status == 200 and "<script" in page, page[:200]
        status, state = cluster.api("GET", "/dashboard/api/state", gateway=1)
        assert status == 200, state
        shown = {s["sandboxID"]: s["clientID"] for s in state["sandboxes"]}
        assert {s.sandbox_id for s in sandboxes} <= set(shown), state
        assert set(shown.values()) == {"node-1", "node-2"}
        assert state["host"]["sandboxes_running"] >= len(sandboxes), state["host"]
        # ...and whose actions reach the sandbox's node.
        victim = next(s.sandbox_id for s in sandboxes if shown[s.sandbox_id] == "node-2")
        status, body = cluster.api("POST", f"/dashboard/api/sandboxes/{victim}/kill", gateway=0)
        assert status == 204, body
        assert cluster.api("GET", f"/sandboxes/{victim}")[0] == 404
    finally:
        kill_all(sandboxes)


def test_a_sandbox_serves_through_every_gateway(cluster):
    sbx = Sandbox.create("base", **cluster.sdk(gateway=0))
    try:
        via_second = Sandbox.connect(sbx.sandbox_id, **cluster.sdk(gateway=1))
        via_second.files.write("/home/user/hello.txt", "from gateway 2")
        assert sbx.files.read("/home/user/hello.txt") == "from gateway 2"
        assert via_second.commands.run("cat /home/user/hello.txt").stdout == "from gateway 2"
        streamed = []
        via_second.commands.run("for i in 1 2 3; do echo $i; sleep 0.1; done",
                                on_stdout=streamed.append)
        assert "".join(streamed) == "1\n2\n3\n"
        assert node_of(cluster, sbx.sandbox_id, 0) == node_of(cluster, sbx.sandbox_id, 1)

        # Signed URLs name no sandbox, only its token's signature; any gateway finds it.
        def on_second(url):
            assert url.startswith(cluster.gateways[0]), url
            return cluster.gateways[1] + url[len(cluster.gateways[0]):]
        status, _, body = fetch(on_second(sbx.download_url("/home/user/hello.txt", "user", 60)))
        assert (status, body) == (200, b"from gateway 2"), (status, body)
        upload = on_second(sbx.upload_url("/home/user/up.txt", "user", 60))
        answer = httpx.post(upload, files={"file": ("up.txt", b"uploaded")}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert sbx.files.read("/home/user/up.txt") == "uploaded"
        forged = on_second(sbx.download_url("/home/user/hello.txt", "user", 60))
        status, _, body = fetch(forged.replace("signature=v1_", "signature=v1_x"))
        assert status == 401 and b"matches no running sandbox" in body, (status, body)
        via_second.kill()
        status, _ = cluster.api("GET", f"/sandboxes/{sbx.sandbox_id}", gateway=0)
        assert status == 404
    finally:
        kill_all([sbx])


def test_another_key_sees_nothing_through_any_gateway(cluster):
    other = cluster.airlock("key", "create", "--name", f"other-{uuid.uuid4().hex[:6]}").strip()
    other = other.split()[-1]
    sbx = Sandbox.create("base", **cluster.sdk())
    try:
        for gateway in (0, 1):
            # The positive control: the owner's key reaches it through this gateway.
            status, _ = cluster.api("GET", f"/sandboxes/{sbx.sandbox_id}", gateway=gateway)
            assert status == 200
            for method, path in (("GET", ""), ("POST", "/pause"), ("DELETE", ""),
                                 ("POST", "/timeout")):
                status, body = cluster.api(method, f"/sandboxes/{sbx.sandbox_id}{path}",
                                           key=other, gateway=gateway,
                                           body={"timeout": 60} if path == "/timeout" else None)
                assert status == 404, (gateway, method, path, body)
            listed = Sandbox.list(**cluster.sdk(gateway=gateway, key=other)).next_items()
            assert sbx.sandbox_id not in {s.sandbox_id for s in listed}
            status, state = cluster.api("GET", "/dashboard/api/state", key=other, gateway=gateway)
            assert status == 200 and state["sandboxes"] == [], state
            status, body = cluster.api("POST", f"/dashboard/api/sandboxes/{sbx.sandbox_id}/kill",
                                       key=other, gateway=gateway)
            assert status == 404, body
        assert sbx.commands.run("true").exit_code == 0
    finally:
        kill_all([sbx])


def test_quotas_hold_across_gateways(cluster):
    key = cluster.airlock("key", "create", "--name", f"quota-{uuid.uuid4().hex[:6]}",
                          "--max-running", "3").strip().split()[-1]

    def create(i):
        try:
            return Sandbox.create("base", **cluster.sdk(gateway=i % 2, key=key))
        except RateLimitException:
            return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        made = list(pool.map(create, range(20)))
    started = [s for s in made if s is not None]
    try:
        assert len(started) == 3, len(started)
        assert len(Sandbox.list(**cluster.sdk(key=key)).next_items()) == 3
    finally:
        kill_all(started)


def test_a_stopped_gateway_loses_nothing(cluster):
    sbx = Sandbox.create("base", **cluster.sdk(gateway=0))
    try:
        sbx.commands.run("echo kept > /home/user/kept.txt")
        stopped = cluster.script("stop-gateway", "gateway-1")
        assert stopped.returncode == 0, stopped.stderr
        via_second = Sandbox.connect(sbx.sandbox_id, **cluster.sdk(gateway=1))
        assert via_second.commands.run("cat /home/user/kept.txt").stdout == "kept\n"
        started = cluster.script("start-gateway", "gateway-1")
        assert started.returncode == 0, started.stderr
        assert sbx.commands.run("cat /home/user/kept.txt").stdout == "kept\n"
    finally:
        kill_all([sbx])


def test_a_new_node_fetched_the_built_in_templates_instead_of_building_them(cluster):
    # node-2 started with an empty templates dir of its own (cluster.sh): what it has, it
    # fetched from object storage, where node-1 put it.
    own = cluster.dir / "node-2-templates" / "layers"
    assert own.is_dir() and len(list(own.iterdir())) >= 4, list(own.iterdir())
    log = (cluster.dir / "logs" / "node-2.log").read_text()
    assert "fetched a layer from object storage" in log
    assert "fetched a layer from object storage" not in (
        cluster.dir / "logs" / "node-1.log").read_text()
    sbx = Sandbox.create(**cluster.sdk())
    try:
        assert sbx.commands.run("python --version").exit_code == 0
    finally:
        sbx.kill()


def test_a_template_built_through_one_gateway_starts_on_every_node(cluster):
    name = f"cluster-{uuid.uuid4().hex[:6]}"
    built = Template().from_template("base").run_cmd("echo built > /home/user/built.txt")
    Template.build(built, name, **cluster.sdk(gateway=1))
    made, nodes = [], []
    try:
        # Creates go where its golden image is (the node that built it) while that node is
        # not much busier (least loaded alone would alternate), then to the other, which
        # fetches the template.
        while set(nodes) != {"node-1", "node-2"} and len(made) < 8:
            made.append(Sandbox.create(name, **cluster.sdk(gateway=len(made) % 2)))
            nodes.append(node_of(cluster, made[-1].sandbox_id))
        assert nodes[0] == nodes[1] and set(nodes) == {"node-1", "node-2"}, nodes
        for sbx in made:
            assert sbx.commands.run("cat /home/user/built.txt").stdout == "built\n"
    finally:
        kill_all(made)


def test_a_snapshot_taken_on_one_node_starts_on_every_node(cluster):
    src = Sandbox.create("base", **cluster.sdk())
    copies = []

    def copies_on_both_nodes():
        """Creates copies until both nodes run one (up to 8): creates spread by load, which
        also counts pools refilling after the last test."""
        made, nodes = [], set()
        while nodes != {"node-1", "node-2"} and len(made) < 8:
            made.append(Sandbox.create(snap.snapshot_id, **cluster.sdk(gateway=len(made) % 2)))
            nodes.add(node_of(cluster, made[-1].sandbox_id))
        copies.extend(made)
        assert nodes == {"node-1", "node-2"}, [node_of(cluster, c.sandbox_id) for c in made]
        return made

    try:
        src.files.write("/home/user/prepared.txt", "prepared once")
        src.commands.run("sleep 600", background=True)
        snap = src.create_snapshot(name=f"prep-{uuid.uuid4().hex[:6]}")
        # The node that did not take it fetches it.
        for c in copies_on_both_nodes():
            assert c.files.read("/home/user/prepared.txt") == "prepared once"
            assert any("sleep 600" in " ".join([p.cmd] + p.args) for p in c.commands.list())
        # Taken again under its name: every node starts the newer take, the one that kept a
        # copy of the first too.
        src.files.write("/home/user/prepared.txt", "prepared twice")
        assert src.create_snapshot(name=snap.snapshot_id).snapshot_id == snap.snapshot_id
        for c in copies_on_both_nodes():
            assert c.files.read("/home/user/prepared.txt") == "prepared twice"
    finally:
        kill_all(copies + [src])
    assert Sandbox.delete_snapshot(snap.snapshot_id, **cluster.sdk(gateway=1)) is True
    with pytest.raises(SandboxException):
        Sandbox.create(snap.snapshot_id, **cluster.sdk())


def test_mcp_through_a_gateway(cluster):
    """The MCP server is a client of the API: on a gateway, of the gateway, so its sandbox is
    on some node and its tools reach it there."""
    import asyncio
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def steps():
        http = create_mcp_http_client(headers={"X-API-Key": cluster.key})
        url = cluster.gateways[1] + "/mcp"
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            created = await client.call_tool("create_sandbox", {})
            sandbox_id = text(created).split()[2]  # "started sandbox ID from template ..."
            placed = node_of(cluster, sandbox_id)
            first = await client.call_tool("run_code", {"code": "x = 41"})
            second = await client.call_tool("run_code", {"code": "x + 1"})
            host = await client.call_tool("run_command", {"command": "hostname"})
            return sandbox_id, placed, first, second, host

    def text(result):
        return "\n".join(c.text for c in result.content if c.type == "text")
    sandbox_id, placed, first, second, host = asyncio.run(steps())
    assert placed in {"node-1", "node-2"}
    assert not first.is_error and not second.is_error, (first, second)
    assert "42" in text(second)
    assert sandbox_id in text(host), text(host)
    # The session's sandbox ends with the session.
    wait_for(lambda: cluster.api("GET", f"/sandboxes/{sandbox_id}")[0] == 404, 10,
             "the session's sandbox killed")
    status, body = cluster.api("POST", "/mcp", key="not-a-key", body={})
    assert status == 401, body


def test_a_volume_s_files_and_sandboxes_stay_on_the_node_that_keeps_it(cluster):
    """A volume's files are on one node's disk: its content API and every sandbox that mounts
    it go there through either gateway, while plain creates still spread."""
    from e2b import Volume

    def volume(gateway):
        return Volume.create(f"vol-{uuid.uuid4().hex[:8]}", api_key=cluster.key,
                             api_url=cluster.gateways[gateway])

    kept, sandboxes, volumes = None, [], []
    try:
        kept = volume(0)
        volumes.append(kept)
        kept.write_file("hello.txt", "from the content API", api_url=cluster.gateways[0])
        sandboxes = [Sandbox.create("base", volume_mounts={"/mnt/v": kept},
                                    **cluster.sdk(gateway=i % 2)) for i in range(6)]
        homes = {node_of(cluster, s.sandbox_id) for s in sandboxes}
        assert len(homes) == 1, homes
        home = homes.pop()
        for i, sbx in enumerate(sandboxes):
            assert sbx.commands.run("cat /mnt/v/hello.txt").stdout == "from the content API"
            sbx.commands.run(f"echo {i} > /mnt/v/from-{i}.txt")
        via_second = Volume.connect(kept.volume_id, api_key=cluster.key,
                                    api_url=cluster.gateways[1])
        second_url = {"api_url": cluster.gateways[1]}
        listed = {e.name for e in via_second.list("/", **second_url)}
        assert {f"from-{i}.txt" for i in range(6)} <= listed, listed
        assert via_second.read_file("from-5.txt", **second_url) == "5\n"

        # The positive control: once the reports show that load, a plain create goes to the
        # other node, and so does a new volume (the least loaded node makes it).
        time.sleep(2.5)
        plain = Sandbox.create("base", **cluster.sdk())
        sandboxes.append(plain)
        other = node_of(cluster, plain.sandbox_id)
        assert other != home, (home, other)
        second = volume(1)
        volumes.append(second)
        on_second = Sandbox.create("base", volume_mounts={"/mnt/w": second}, **cluster.sdk())
        sandboxes.append(on_second)
        assert node_of(cluster, on_second.sandbox_id) == other

        # Volumes of two nodes cannot be mounted together: a clear 400, nothing made.
        status, body = cluster.api("POST", "/sandboxes", body={
            "templateID": "base",
            "volumeMounts": [{"name": kept.name, "path": "/a"},
                             {"name": second.name, "path": "/b"}]})
        assert status == 400 and "one node only" in body["message"], body

        # A paused sandbox with a volume resumes on the volume's node.
        sandboxes[0].pause()
        resumed = Sandbox.connect(sandboxes[0].sandbox_id, **cluster.sdk(gateway=1))
        assert node_of(cluster, resumed.sandbox_id) == home
        assert resumed.commands.run("cat /mnt/v/from-1.txt").stdout == "1\n"
    finally:
        kill_all(sandboxes)
        for v in volumes:
            assert Volume.destroy(v.volume_id, api_key=cluster.key,
                                  api_url=cluster.gateways[1]) is True


def node_status(cluster, name):
    _, nodes = cluster.api("GET", "/nodes", key=cluster.operator)
    return next(n["status"] for n in nodes if n["nodeID"] == name)


def test_a_drained_node_pauses_its_sandboxes_and_they_resume_elsewhere(cluster):
    made = [Sandbox.create("base", **cluster.sdk()) for _ in range(2)]
    drained = node_of(cluster, made[0].sandbox_id)
    try:
        made[0].files.write("/home/user/kept.txt", "through the drain")
        cluster.airlock_cli("--url", cluster.gateways[1], "--api-key", cluster.operator,
                            "node", "drain", drained)
        wait_for(lambda: node_status(cluster, drained) == "draining", 5, f"{drained} draining")

        def paused():
            _, detail = cluster.api("GET", f"/sandboxes/{made[0].sandbox_id}")
            return detail["state"] == "paused"

        wait_for(paused, 60, "the drained node's sandbox paused")
        fresh = Sandbox.create("base", **cluster.sdk())
        made.append(fresh)
        assert node_of(cluster, fresh.sandbox_id) != drained
        # Its next request resumes it on another node (auto-resume), files and all.
        assert made[0].commands.run("cat /home/user/kept.txt").stdout == "through the drain"
        moved_to = node_of(cluster, made[0].sandbox_id)
        assert moved_to != drained

        # And back: paused where it moved, with a newer file; that node drains, and the first
        # one, ready again, takes it over. It resumes from the newer pause, not from what the
        # first node kept of the older one (its record, its image on disk).
        made[0].files.write("/home/user/kept.txt", "after the move")
        made[0].pause()
        set_status(cluster, drained, "undrain")
        wait_for(lambda: node_status(cluster, drained) == "ready", 5, f"{drained} ready again")
        set_status(cluster, moved_to, "drain")
        wait_for(lambda: node_status(cluster, moved_to) == "draining", 5, f"{moved_to} draining")
        back = Sandbox.connect(made[0].sandbox_id, **cluster.sdk(gateway=1))
        assert node_of(cluster, made[0].sandbox_id) == drained
        assert back.commands.run("cat /home/user/kept.txt").stdout == "after the move"
    finally:
        for node in ("node-1", "node-2"):
            set_status(cluster, node, "undrain")
        kill_all(made)
    for node in ("node-1", "node-2"):
        wait_for(lambda: node_status(cluster, node) == "ready", 5, f"{node} ready again")


def test_a_drained_node_moves_its_volumes_with_their_paused_sandboxes(cluster):
    """Drain the node that keeps a volume: the sandbox that mounts it is paused, and the volume
    moves into object storage. The sandbox then resumes on the other node, with the volume's
    files from both writers and its own, and the volume's content API answers from there."""
    from e2b import Volume
    drained = "node-1"
    volume = volume_on(cluster, drained)
    sbx = None
    try:
        volume.write_file("from-api.txt", "through the content API", api_url=cluster.gateways[0])
        sbx = Sandbox.create("base", volume_mounts={"/mnt/v": volume}, **cluster.sdk())
        assert node_of(cluster, sbx.sandbox_id) == drained
        sbx.commands.run("echo from the sandbox > /mnt/v/from-sandbox.txt")
        sbx.files.write("/home/user/own.txt", "its own disk")
        set_status(cluster, drained, "drain")
        wait_for(lambda: node_status(cluster, drained) == "draining", 5, f"{drained} draining")

        def resumed():
            try:
                return Sandbox.connect(sbx.sandbox_id, **cluster.sdk(gateway=1))
            except (SandboxException, ServiceBusyException):
                return None  # 503 until its volume has moved

        deadline = time.monotonic() + 90
        back = resumed()
        while back is None and time.monotonic() < deadline:
            time.sleep(1)
            back = resumed()
        assert back is not None, cluster.log_tail(drained)
        assert node_of(cluster, sbx.sandbox_id) != drained
        run = back.commands.run
        assert run("cat /mnt/v/from-api.txt").stdout == "through the content API"
        assert run("cat /mnt/v/from-sandbox.txt").stdout == "from the sandbox\n"
        assert back.files.read("/home/user/own.txt") == "its own disk"
        run("echo after the move > /mnt/v/after.txt")
        via_second = Volume.connect(volume.volume_id, api_key=cluster.key,
                                    api_url=cluster.gateways[1])
        assert via_second.read_file("after.txt", api_url=cluster.gateways[1]) == \
            "after the move\n"
    finally:
        set_status(cluster, drained, "undrain")
        if sbx is not None:
            kill_all([sbx])
    wait_for(lambda: node_status(cluster, drained) == "ready", 5, f"{drained} ready again")
    assert Volume.destroy(volume.volume_id, api_key=cluster.key,
                          api_url=cluster.gateways[0]) is True


def set_status(cluster, node, verb):
    """`airlock node drain|undrain NODE` through the first gateway."""
    cluster.airlock_cli("--url", cluster.gateways[0], "--api-key", cluster.operator,
                        "node", verb, node)


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.2)
    pytest.fail(f"not within {timeout}s: {what}")


def volume_on(cluster, node):
    """A new volume of the cluster's key kept on `node`: one is made, and a sandbox that mounts
    it shows where (it runs where its volume is), until one lands there."""
    from e2b import Volume
    for _ in range(6):
        volume = Volume.create(f"vol-{uuid.uuid4().hex[:8]}", api_key=cluster.key,
                               api_url=cluster.gateways[0])
        probe = Sandbox.create("base", volume_mounts={"/mnt/v": volume}, **cluster.sdk())
        there = node_of(cluster, probe.sandbox_id)
        probe.kill()
        if there == node:
            return volume
        assert Volume.destroy(volume.volume_id, api_key=cluster.key,
                              api_url=cluster.gateways[0]) is True
    pytest.fail(f"no volume was made on {node} in 6 tries")


def test_a_lost_node_is_left_and_its_paused_sandbox_resumes_on_the_other(cluster):
    """Pause on node A, stop A as a power loss would: within 10 s it is unhealthy, creates go
    on succeeding on B, A's running sandbox is reported lost (and, killed, its killed event is
    recorded and sent to the key's webhook by the gateway), the paused one stays on the
    dashboard and resumes on B with its file and its background process, and a volume kept on
    A still shows its record while its files answer 503."""
    made = [Sandbox.create("base", **cluster.sdk()) for _ in range(4)]
    paused = made[0]
    lost_node = node_of(cluster, paused.sandbox_id)
    running_there = [s for s in made[1:] if node_of(cluster, s.sandbox_id) == lost_node]
    kept_there = volume_on(cluster, lost_node)
    receiver = Receiver()
    status, hook = cluster.api("POST", "/events/webhooks", body={
        "name": "lost", "url": receiver.url("/lost"), "events": ["sandbox.lifecycle.killed"],
        "signatureSecret": "s3cret"})
    assert status == 201, hook
    try:
        paused.files.write("/home/user/state.txt", "before the loss")
        paused.commands.run(
            "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done'"
            " > /dev/null 2>&1 &")
        time.sleep(1)
        paused.pause()

        stopped_at = time.monotonic()
        stopped = cluster.script("stop-node", lost_node)
        assert stopped.returncode == 0, stopped.stderr

        def unhealthy():
            _, nodes = cluster.api("GET", "/nodes", key=cluster.operator)
            return any(n["nodeID"] == lost_node and n["status"] == "unhealthy" for n in nodes)

        assert wait_for(unhealthy, 10, f"{lost_node} unhealthy in /nodes") - stopped_at <= 10

        fresh = [Sandbox.create("base", **cluster.sdk(gateway=i % 2)) for i in range(3)]
        made += fresh
        assert {node_of(cluster, s.sandbox_id) for s in fresh} == ({"node-1", "node-2"} - {lost_node})

        assert running_there, "placement alternates: a running sandbox was on the lost node"
        for sbx in running_there:
            status, body = cluster.api("GET", f"/sandboxes/{sbx.sandbox_id}")
            assert status == 502 and "lost" in body["message"], body
        # A lost sandbox can be killed: it is gone from the lists at once.
        gone = running_there[0].sandbox_id
        assert Sandbox.kill(gone, **cluster.sdk(gateway=1)) is True
        status, body = cluster.api("GET", f"/sandboxes/{gone}")
        assert status == 404, body
        listed = [s.sandbox_id for s in Sandbox.list(**cluster.sdk()).next_items()]
        assert gone not in listed and fresh[0].sandbox_id in listed, listed
        # Its node cannot tell of the kill: the gateway records the event and sends it.
        status, events = cluster.api("GET", f"/events/sandboxes/{gone}?orderAsc=true")
        assert status == 200, events
        assert [e["type"] for e in events] == [
            "sandbox.lifecycle.created", "sandbox.lifecycle.killed"], events
        sent = receiver.wait("/lost", lambda got: any(gone.encode() in raw for _, raw in got))
        headers, raw = next((h, raw) for h, raw in sent if gone.encode() in raw)
        assert json.loads(raw)["type"] == "sandbox.lifecycle.killed"
        assert headers["e2b-signature"] == signature("s3cret", raw)

        # The dashboard lists the paused sandbox of the lost node (from the catalog: it
        # resumes elsewhere), through either gateway.
        for gateway in range(len(cluster.gateways)):
            status, overview = cluster.api("GET", "/dashboard/api/state", gateway=gateway)
            assert status == 200, overview
            shown = {s["sandboxID"]: s for s in overview["sandboxes"]}
            assert shown[paused.sandbox_id]["state"] == "paused", shown.get(paused.sandbox_id)
            assert shown[paused.sandbox_id]["clientID"] == lost_node
            assert fresh[0].sandbox_id in shown

        # The volume's record is the shared database's: any node reads it. Its files are on
        # the lost node's disk: a clear 503 that names it, through either gateway.
        from e2b import Volume
        for gateway in cluster.gateways:
            info = Volume.get_info(kept_there.volume_id, api_key=cluster.key, api_url=gateway)
            assert info.name == kept_there.name
            status, body = cluster.api("DELETE", f"/volumes/{kept_there.volume_id}",
                                       base=gateway)
            assert status == 503 and lost_node in body["message"], body
        status, _, text = fetch(f"{cluster.gateways[1]}/volumecontent/{kept_there.volume_id}"
                                "/dir?path=/",
                                {"Authorization": f"Bearer {kept_there.token}"}, "GET", None)
        assert status == 503 and lost_node in text.decode(), text

        resumed = Sandbox.connect(paused.sandbox_id, **cluster.sdk(gateway=1))
        assert node_of(cluster, paused.sandbox_id) != lost_node
        assert resumed.files.read("/home/user/state.txt") == "before the loss"
        first = int(resumed.commands.run("cat /tmp/count").stdout)
        time.sleep(1)
        assert int(resumed.commands.run("cat /tmp/count").stdout) > first
    finally:
        kill_all(made)
        cluster.api("DELETE", f"/events/webhooks/{hook['id']}")
        receiver.stop()
