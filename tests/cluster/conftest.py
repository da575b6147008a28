"""One cluster on this machine for the whole module (scripts/cluster.sh: PostgreSQL, an S3
server, two nodes each in its own network namespace, two gateways), driven by the stock e2b
SDK through the gateways."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from harness import exports, fetch  # noqa: E402


class Cluster:
    def __init__(self, env):
        self.env = env
        self.gateways = env["AIRLOCK_GATEWAYS"].split()
        self.nodes = env["AIRLOCK_NODES"].split()
        self.key = env["E2B_API_KEY"]
        self.operator = env["AIRLOCK_OPERATOR_KEY"]
        self.dir = Path(env["AIRLOCK_CLUSTER_DIR"])

    def script(self, *args, timeout=300):
        return subprocess.run(["bash", str(REPO / "scripts/cluster.sh"), *args],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "AIRLOCK_CLUSTER_DIR": str(self.dir)})

    def run_airlock(self, *args):
        """`airlock ARGS` with a scratch data dir of the cluster's; the finished process."""
        return subprocess.run([str(REPO / "target/release/airlock"), "--data-dir",
                               str(self.dir / "cli"), *args],
                              capture_output=True, text=True, timeout=60)

    def airlock_cli(self, *args):
        """`airlock ARGS` as a client of a gateway (pass --url and --api-key)."""
        out = self.run_airlock(*args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def airlock(self, *args):
        """`airlock ARGS` on the cluster's PostgreSQL (keys live there), which takes TLS only."""
        out = self.run_airlock("--database", self.env["AIRLOCK_CLUSTER_DATABASE_URL"],
                               "--database-ca", self.env["AIRLOCK_CLUSTER_DATABASE_CA"], *args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def api(self, method, path, key=None, gateway=0, body=None, headers=None, base=None):
        """A raw call through a gateway (or to `base`); returns (status, parsed JSON or text)."""
        sent = {"Content-Type": "application/json", **(headers or {})}
        if key is not False:
            sent["X-API-KEY"] = key or self.key
        data = json.dumps(body).encode() if body is not None else None
        status, _, text = fetch((base or self.gateways[gateway]) + path, sent, method, data)
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text.decode(errors="replace")

    def sdk(self, gateway=0, key=None):
        """Connection arguments for the SDK through one gateway."""
        url = self.gateways[gateway]
        return {"api_key": key or self.key, "api_url": url, "sandbox_url": url}

    def log_tail(self, name, lines=40):
        log = self.dir / "logs" / f"{name}.log"
        return log.read_text()[-lines * 200:] if log.exists() else f"(no {log})"


@pytest.fixture(scope="session")
def cluster():
    up = subprocess.run(["bash", str(REPO / "scripts/cluster.sh"), "up", "--nodes", "2",
                         "--gateways", "2"], capture_output=True, text=True, timeout=900)
    env = exports(up.stdout)
    if up.returncode != 0:
        if env.get("AIRLOCK_CLUSTER_DIR"):
            subprocess.run(["bash", str(REPO / "scripts/cluster.sh"), "down"], timeout=300,
                           env={**os.environ, "AIRLOCK_CLUSTER_DIR": env["AIRLOCK_CLUSTER_DIR"]})
        pytest.fail(f"cluster.sh up failed:\n{up.stderr[-4000:]}")
    c = Cluster(env)
    yield c
    down = c.script("down")
    assert down.returncode == 0, down.stderr


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with the tails of the nodes' and gateways' logs, which
    `cluster.sh down` removes with the cluster."""
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if report.when == "call" and report.failed and cluster is not None:
        for log in sorted((cluster.dir / "logs").glob("*.log")):
            report.sections.append((f"{log.stem} log (its last lines)", cluster.log_tail(log.stem)))
