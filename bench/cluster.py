"""Benchmark (not a test): Airlock as a cluster on this machine (scripts/cluster.sh: PostgreSQL,
an S3 server, two nodes in network namespaces of their own, two gateways). Reports:
  * create → first command through a gateway against straight on a node (with the cluster
    secret in hand, as a gateway sends it), alternating in the same run: what the gateway adds.
    Raw HTTP for both (the SDK cannot send the secret on a sandbox's traffic): `POST /sandboxes`
    then envd's `process.Process/Start` of `echo ok`, each on a new connection, as the SDK's;
  * one request on a running sandbox through a gateway against straight on its node, on
    kept-alive connections, for the REST path and for a sandbox's traffic: the gateway's hop
    alone;
  * N creates at once through the two gateways, each with its first command (the SDK): the
    wall time and how evenly the nodes got them;
  * time until the gateways stop placing on a lost node (`GET /nodes` says unhealthy);
  * a template on a node that lacks it: a template with `--template-mb` of its own layer is
    built through a gateway, then sandboxes are created (and kept) until two land on the node
    that did not build it: the first ones go to the builder, which holds the golden image;
    then the other node's first create (which fetches the layer from object storage) against
    its next one;
  * a new node: node-2 is stopped, its templates dir emptied, and started again: the time until
    it answers, which is fetching the built-in templates (1.1 GB) instead of building them;
  * resume on another node: a sandbox with `--image-mb` of data in memory is paused on node A,
    A is stopped as a power loss would, and `Sandbox.connect` through a gateway resumes it on
    B; the resume's time, and the download's share of it (node B's log).

Run it with bench/run.sh cluster (which builds everything first)."""

import argparse
import base64
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from e2b import Sandbox, Template

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from harness import exports, fetch  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from startup import pct, row  # noqa: E402


def cluster_script(*args, env=None):
    out = subprocess.run(["bash", str(REPO / "scripts/cluster.sh"), *args], capture_output=True,
                         text=True, timeout=900, env={**os.environ, **(env or {})})
    if out.returncode != 0:
        sys.exit(f"cluster.sh {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def new_key(env):
    """A tenant key of the cluster, and its public id (what a gateway names to a node)."""
    out = subprocess.run([str(REPO / "target/release/airlock"), "--data-dir",
                          env["AIRLOCK_CLUSTER_DIR"] + "/bench-cli", "--database",
                          env["AIRLOCK_CLUSTER_DATABASE_URL"], "--database-ca",
                          env["AIRLOCK_CLUSTER_DATABASE_CA"], "key", "create", "--name",
                          f"bench-{os.getpid()}"], capture_output=True, text=True, check=True)
    return out.stdout.strip(), re.search(r"key id (\w+)", out.stderr).group(1)


ECHO = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo ok"]}}).encode()


def create_and_run(base, api_headers, traffic_headers):
    """ms from the create's request to the first command's end; kills the sandbox after."""
    started = time.perf_counter()
    status, _, body = fetch(base + "/sandboxes", {**api_headers, "Content-Type": "application/json"},
                            "POST", json.dumps({"templateID": "base", "timeout": 60}).encode())
    if status != 201:
        raise RuntimeError(f"create: {status} {body[:200]!r}")
    sbx = json.loads(body)
    headers = {**traffic_headers, "E2b-Sandbox-Id": sbx["sandboxID"],
               "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    if sbx.get("envdAccessToken"):
        headers["X-Access-Token"] = sbx["envdAccessToken"]
    frame = b"\x00" + len(ECHO).to_bytes(4, "big") + ECHO
    status, _, out = fetch(base + "/process.Process/Start", headers, "POST", frame)
    elapsed = (time.perf_counter() - started) * 1000
    fetch(base + f"/sandboxes/{sbx['sandboxID']}", api_headers, "DELETE")
    if status != 200 or base64.b64encode(b"ok\n") not in out:
        raise RuntimeError(f"first command: {status} {out[:200]!r}")
    return elapsed


def gateway_against_node(env, key, key_id, rounds):
    secret = (Path(env["AIRLOCK_CLUSTER_DIR"]) / "cluster-secret").read_text().strip()
    gateway = env["AIRLOCK_GATEWAYS"].split()[0]
    node = env["AIRLOCK_NODES"].split()[0]
    ways = {
        "through a gateway": (gateway, {"X-API-KEY": key}, {}),
        "straight on a node": (node, {"X-Airlock-Cluster-Secret": secret,
                                      "X-Airlock-Caller": key_id},
                               {"X-Airlock-Cluster-Secret": secret}),
    }
    times = {way: [] for way in ways}
    for i in range(rounds):
        for way, (base, api, traffic) in ways.items():
            try:
                times[way].append(create_and_run(base, api, traffic))
            except Exception as e:  # counted in the success rate
                print(f"  failure ({way}): {e}", file=sys.stderr)
            time.sleep(0.3)  # the pool refills between creates
    print(f"{'create → first command (ms)':<46} {'p50':>7} {'p95':>7} {'p99':>7} {'min':>7} "
          f"{'max':>7}  ok")
    for way, ms in times.items():
        print(row(way, ms, rounds))
    if all(times.values()):
        added = pct(times["through a gateway"], 50) - pct(times["straight on a node"], 50)
        print(f"the gateway adds {added:.1f} ms at p50")


def gateway_hop(env, key, key_id, rounds):
    """What the gateway's hop costs one request, measured on one running sandbox over kept-alive
    connections (as the SDK's pooled ones are), alternating between a gateway and its node:
    `GET /sandboxes/{id}` (the REST path: the key's check and the catalog's row, then the
    forward) and envd's `GET /health` (a sandbox's traffic: the catalog's row, then the
    forward, then the node's proxy into the sandbox)."""
    secret = (Path(env["AIRLOCK_CLUSTER_DIR"]) / "cluster-secret").read_text().strip()
    gateway, node = env["AIRLOCK_GATEWAYS"].split()[0], env["AIRLOCK_NODES"].split()[0]
    placed = None
    for _ in range(8):  # a sandbox on the node measured against (cluster.sh's first: node-1)
        sbx = Sandbox.create("base", api_key=key, api_url=gateway, sandbox_url=gateway)
        if node_of(env, key, sbx.sandbox_id) == "node-1":
            placed = sbx
            break
        sbx.kill()
    if placed is None:
        print("the gateway's hop: no sandbox landed on the first node")
        return
    on_node = {"X-Airlock-Cluster-Secret": secret}
    ways = {
        "REST through a gateway": (gateway, f"/sandboxes/{placed.sandbox_id}",
                                   {"X-API-KEY": key}),
        "REST straight on its node": (node, f"/sandboxes/{placed.sandbox_id}",
                                      {**on_node, "X-Airlock-Caller": key_id}),
        "traffic through a gateway": (gateway, "/health",
                                      {"E2b-Sandbox-Id": placed.sandbox_id}),
        "traffic straight on its node": (node, "/health",
                                         {**on_node, "E2b-Sandbox-Id": placed.sandbox_id}),
    }
    connections = {way: kept_alive(base) for way, (base, _, _) in ways.items()}
    times = {way: [] for way in ways}
    for _ in range(rounds):
        for way, (_, path, headers) in ways.items():
            conn = connections[way]
            started = time.perf_counter()
            conn.request("GET", path, headers=headers)
            answer = conn.getresponse()
            answer.read()
            times[way].append((time.perf_counter() - started) * 1000)
            if answer.status >= 300:
                raise SystemExit(f"{way}: {answer.status}")
    placed.kill()
    print(f"{'one request on a kept-alive connection (ms)':<46} {'p50':>7} {'p95':>7} "
          f"{'p99':>7} {'min':>7} {'max':>7}  ok")
    for way, ms in times.items():
        print(row(way, ms, rounds))
    for kind in ("REST", "traffic"):
        added = (pct(times[f"{kind} through a gateway"], 50)
                 - pct(times[f"{kind} straight on its node"], 50))
        print(f"the gateway adds {added:.2f} ms at p50 to a request of the {kind.lower()} path")


def kept_alive(base):
    import http.client
    host, port = base.removeprefix("http://").rstrip("/").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def node_of(env, key, sandbox_id):
    gateway = env["AIRLOCK_GATEWAYS"].split()[0]
    _, _, body = fetch(gateway + f"/sandboxes/{sandbox_id}", {"X-API-KEY": key})
    return json.loads(body)["clientID"]


def burst(env, key, size):
    gateways = env["AIRLOCK_GATEWAYS"].split()

    def one(i):
        url = gateways[i % len(gateways)]
        sbx = Sandbox.create("base", api_key=key, api_url=url, sandbox_url=url)
        sbx.commands.run("echo ok")
        return sbx

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=size) as pool:
        made = [f for f in pool.map(lambda i: _try(one, i), range(size)) if f]
    wall = time.perf_counter() - started
    nodes = [node_of(env, key, s.sandbox_id) for s in made]
    spread = {n: nodes.count(n) for n in sorted(set(nodes))}
    print(f"{size} creates at once through {len(gateways)} gateways: {len(made)}/{size} ok, "
          f"wall {wall:.2f} s, placed {spread}")
    for sbx in made:
        sbx.kill()


def _try(fn, arg):
    try:
        return fn(arg)
    except Exception as e:  # counted in the success rate
        print(f"  failure: {e}", file=sys.stderr)
        return None


def template_on_a_node_that_lacks_it(env, key, mb):
    gateway = env["AIRLOCK_GATEWAYS"].split()[0]
    sdk = {"api_key": key, "api_url": gateway, "sandbox_url": gateway}
    own = Path(env["AIRLOCK_CLUSTER_DIR"]) / "node-2-templates" / "layers"
    before = set(os.listdir(own))
    name = f"bench-fetch-{os.getpid()}"
    started = time.perf_counter()
    Template.build(Template().from_template("base").run_cmd(
        f"head -c {mb}M /dev/urandom > /home/user/blob"), name, **sdk)
    built = time.perf_counter() - started
    builder = "node-2" if set(os.listdir(own)) - before else "node-1"
    # Placement sends creates to the builder (it holds the golden image) until it is busier
    # by a sandbox per core; the sandboxes are kept, so later ones go to the other node.
    made, firsts, warm = [], [], []
    try:
        for _ in range(12):
            t0 = time.perf_counter()
            sbx = Sandbox.create(name, **sdk)
            sbx.commands.run("true")
            took = (time.perf_counter() - t0) * 1000
            made.append(sbx)
            node = node_of(env, key, sbx.sandbox_id)
            (firsts if node != builder else warm).append(took)
            if len(firsts) == 2:
                break
    finally:
        for sbx in made:
            sbx.kill()
    print(f"a template with {mb} MiB of its own, built on {builder} in {built:.1f} s: creates "
          f"went to {builder} (its golden image) {len(warm)} times first, create + first "
          f"command {statistics.median(warm):.0f} ms there (median); on the other node "
          f"{firsts[0]:.0f} ms the first time (fetching it), {firsts[1]:.0f} ms the next")


def new_node_start(env):
    cluster_dir = {"AIRLOCK_CLUSTER_DIR": env["AIRLOCK_CLUSTER_DIR"]}
    cluster_script("stop-node", "node-2", env=cluster_dir)
    subprocess.run(["rm", "-rf", env["AIRLOCK_CLUSTER_DIR"] + "/node-2-templates"], check=True)
    started = time.perf_counter()
    cluster_script("start-node", "node-2", env=cluster_dir)
    print(f"a new node (node-2, empty templates dir) answers {time.perf_counter() - started:.1f} s "
          "after its start, with the built-in templates fetched from object storage")


def lost_node_and_resume_elsewhere(env, key, image_mb):
    gateway = env["AIRLOCK_GATEWAYS"].split()[0]
    sbx = Sandbox.create("base", api_key=key, api_url=gateway, sandbox_url=gateway, timeout=600)
    sbx.commands.run(f"head -c {image_mb}M /dev/urandom > /tmp/blob && echo kept > /tmp/kept")
    sbx.pause()
    lost = node_of(env, key, sbx.sandbox_id)
    operator = env["AIRLOCK_OPERATOR_KEY"]
    stopped = time.perf_counter()
    cluster_script("stop-node", lost, env={"AIRLOCK_CLUSTER_DIR": env["AIRLOCK_CLUSTER_DIR"]})
    while True:
        _, _, body = fetch(gateway + "/nodes", {"X-API-KEY": operator})
        if any(n["nodeID"] == lost and n["status"] == "unhealthy" for n in json.loads(body)):
            break
        time.sleep(0.05)
    print(f"a lost node: unhealthy, and no longer placed on, {time.perf_counter() - stopped:.2f} s "
          "after it stopped")
    started = time.perf_counter()
    resumed = Sandbox.connect(sbx.sandbox_id, api_key=key, api_url=gateway, sandbox_url=gateway)
    first = resumed.commands.run("cat /tmp/kept").stdout.strip()
    took = time.perf_counter() - started
    other = node_of(env, key, sbx.sandbox_id)
    log = (Path(env["AIRLOCK_CLUSTER_DIR"]) / "logs" / f"{other}.log").read_text()
    image = f"paused-{sbx.sandbox_id}"
    downloads = re.findall(rf"image downloaded.*?{image}.*?elapsed=(\S+)"
                           rf"|{image}.*?image downloaded.*?elapsed=(\S+)", log)
    download = next((a or b for a, b in downloads), "?")
    print(f"resume on another node ({lost} → {other}, {image_mb} MiB in memory): "
          f"connect + first command {took:.2f} s, of which the download {download} "
          f"(first command said {first!r})")
    resumed.kill()


PARTS = ["create", "hop", "burst", "template", "new-node", "lost-node"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--burst", type=int, default=40)
    ap.add_argument("--image-mb", type=int, default=100)
    ap.add_argument("--template-mb", type=int, default=200)
    ap.add_argument("--hop-rounds", type=int, default=300)
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"which parts to run, comma-separated (default: all of {','.join(PARTS)})")
    args = ap.parse_args()
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    env = exports(cluster_script("up", "--nodes", "2", "--gateways", "2"))
    try:
        key, key_id = new_key(env)
        time.sleep(5)  # the nodes' pools fill
        parts = {
            "create": lambda: gateway_against_node(env, key, key_id, args.rounds),
            "hop": lambda: gateway_hop(env, key, key_id, args.hop_rounds),
            "burst": lambda: burst(env, key, args.burst),
            "template": lambda: template_on_a_node_that_lacks_it(env, key, args.template_mb),
            "new-node": lambda: new_node_start(env),
            "lost-node": lambda: lost_node_and_resume_elsewhere(env, key, args.image_mb),
        }
        for part in PARTS:
            if part in args.parts.split(","):
                parts[part]()
                print()
    finally:
        cluster_script("down", env={"AIRLOCK_CLUSTER_DIR": env["AIRLOCK_CLUSTER_DIR"]})


if __name__ == "__main__":
    main()
