"""The state in PostgreSQL (`airlock serve --database`), as the gateways and nodes of many
machines share it: keys, templates and the sandbox catalog (each sandbox with its node) live in
the database, not in the data dir, quotas are admitted there, and a restart adopts what the
catalog names. The PostgreSQL is Debian's, started for this module (scripts/postgres.sh)."""

import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox

from conftest import airlock_key

REPO = Path(__file__).resolve().parents[2]
NODE = "pg-node-1"


@pytest.fixture(scope="module")
def postgres():
    """A private PostgreSQL; yields its connection string."""
    home = tempfile.mkdtemp(prefix="airlock-pg-", dir="/var/tmp")
    started = subprocess.run(["bash", str(REPO / "scripts/postgres.sh"), "start", home],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    url = re.search(r"AIRLOCK_TEST_POSTGRES_URL='([^']*)'", started.stdout).group(1)
    yield url
    subprocess.run(["bash", str(REPO / "scripts/postgres.sh"), "stop", home], timeout=120)
    shutil.rmtree(home, ignore_errors=True)


def psql(url, sql):
    """Rows of `sql`, read from the database itself, each a tuple of text."""
    psql_bin = sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))[-1]
    out = subprocess.run([str(psql_bin), url, "-At", "-F", "\t", "-c", sql],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [tuple(line.split("\t")) for line in out.stdout.splitlines()]


@pytest.fixture
def on_postgres(server, postgres):
    """The server restarted on the PostgreSQL as node NODE, leaving sandboxes running through
    its stops; put back on its data dir after."""
    saved = list(server.extra_args)
    server.stop()
    server.extra_args = saved + ["--database", postgres, "--node-name", NODE]
    server.stop_sandboxes_on_exit = False
    server.start()
    yield server
    server.stop()
    server.extra_args = saved
    server.stop_sandboxes_on_exit = True
    server.start()


def catalog(url, sandbox_id):
    return psql(url, f"SELECT node, state FROM sandboxes WHERE id = '{sandbox_id}'")


def test_keys_quotas_catalog_and_restarts_on_postgres(on_postgres, postgres):
    server = on_postgres
    name = f"pg-{uuid.uuid4().hex[:6]}"
    key = airlock_key(server, "create", "--name", name, "--max-running", "1", database=postgres)
    # The key is in PostgreSQL, and the data dir's own database does not know it (the control
    # that the listing can see a key at all is the first).
    assert name in airlock_key(server, "ls", database=postgres)
    assert name not in airlock_key(server, "ls")

    first = Sandbox.create("base", api_key=key)
    second = None
    try:
        first.files.write("/home/user/kept.txt", "on postgres")
        assert first.commands.run("echo $((6*7))").stdout == "42\n"
        status, detail = server.api("GET", f"/sandboxes/{first.sandbox_id}", key=key)
        assert status == 200 and detail["clientID"] == NODE, detail
        assert catalog(postgres, first.sandbox_id) == [(NODE, "running")]
        # The built-in templates were recorded there at start.
        assert psql(postgres, "SELECT name FROM templates WHERE name = 'base'") == [("base",)]

        # The key's quota is admitted by the catalog: one running at most.
        status, body = server.api("POST", "/v2/sandboxes", {"templateID": "base"}, key=key)
        assert status == 429 and "at most 1" in body["message"], body
        # A paused sandbox frees its place, and resuming it needs one again.
        first.beta_pause()
        assert catalog(postgres, first.sandbox_id) == [(NODE, "paused")]
        second = Sandbox.create("base", api_key=key)
        status, body = server.api("POST", f"/sandboxes/{first.sandbox_id}/resume", {}, key=key)
        assert status == 429 and "at most 1" in body["message"], body
        second.kill()
        second = None
        status, body = server.api("POST", f"/sandboxes/{first.sandbox_id}/resume", {}, key=key)
        assert status == 201, body

        # A restart that leaves sandboxes running adopts them from the catalog.
        server.stop()
        server.start()
        again = Sandbox.connect(first.sandbox_id, api_key=key)
        assert again.files.read("/home/user/kept.txt") == "on postgres"
        assert catalog(postgres, first.sandbox_id) == [(NODE, "running")]
    finally:
        for sbx in (first, second):
            if sbx is not None:
                server.api("DELETE", f"/sandboxes/{sbx.sandbox_id}", key=key)
    # A killed sandbox leaves the catalog once its host cleanup is done.
    deadline = time.time() + 30
    while catalog(postgres, first.sandbox_id) and time.time() < deadline:
        time.sleep(0.2)
    assert catalog(postgres, first.sandbox_id) == []
    events = psql(postgres, f"SELECT type FROM sandbox_events WHERE sandbox_id = '{first.sandbox_id}'"
                            " ORDER BY at_us")
    assert [e[0].rsplit(".", 1)[-1] for e in events] == ["created", "paused", "resumed", "killed"]
