"""Integration fixtures: a real `airlock serve` with real gVisor sandboxes, driven by the pinned
`e2b` SDK. Run through ./test.sh, which builds the binaries and the `base` template first."""

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import AIRLOCK, API_KEY, footprint, free_port, host_leftovers, slot, start_server  # noqa: E402,F401
from browser import Browser  # noqa: E402
from images import Registry  # noqa: E402
from outside import Outside  # noqa: E402


@pytest.fixture(scope="session")
def registry():
    """A real OCI registry on loopback (see tests/images.py); the server may pull from it."""
    reg = Registry()
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def private_registry():
    """Another, which answers only with its credentials (`tester`, `secret`)."""
    reg = Registry(credentials=("tester", "secret"))
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def outside():
    """A stand-in for a host beyond this machine, listening on a public, a private and the cloud
    metadata address (see tests/outside.py): a target for the network tests that needs no
    internet."""
    host = Outside()
    yield host
    host.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3 server (s3s-fs, by scripts/s3.sh): ./test.sh's, named by AIRLOCK_TEST_S3_URL
    and AIRLOCK_TEST_S3_DIR, else one of this session's own. Yields (an `--object-store` URL,
    the directory its bucket's objects are in as files)."""
    if os.environ.get("AIRLOCK_TEST_S3_URL"):
        yield os.environ["AIRLOCK_TEST_S3_URL"], Path(os.environ["AIRLOCK_TEST_S3_DIR"])
        return
    root = Path(__file__).resolve().parents[2]
    home = tmp_path_factory.mktemp("s3")
    out = subprocess.run([root / "scripts" / "s3.sh", "start", str(home)], check=True,
                         capture_output=True, text=True).stdout
    env = dict(re.findall(r"export (\w+)='([^']*)'", out))
    yield env["AIRLOCK_TEST_S3_URL"], Path(env["AIRLOCK_TEST_S3_DIR"])
    subprocess.run([root / "scripts" / "s3.sh", "stop", str(home)], check=False)


@pytest.fixture(scope="session")
def server(registry, private_registry):
    if not os.environ.get("AIRLOCK_TEST_DATA_DIR"):
        pytest.exit("run ./test.sh, or set AIRLOCK_TEST_DATA_DIR to a data dir that "
                    "scripts/prepare.sh has prepared", returncode=2)
    metrics = f"127.0.0.1:{free_port()}"
    srv = start_server(Path(os.environ["AIRLOCK_TEST_DATA_DIR"]),
                       ["--insecure-registry", registry.address,
                        "--insecure-registry", private_registry.address,
                        "--metrics-listen", metrics])
    srv.metrics_url = f"http://{metrics}/metrics"
    yield srv
    srv.stop()


@pytest.fixture
def restarted(server):
    """`restart(*flags, listen_host=...)` restarts the server with more `serve` flags (the
    session's are kept) and, if asked, on another address; it is put back afterwards."""
    saved_host, saved_flags = server.listen_host, list(server.extra_args)

    def restart(*flags, listen_host=saved_host):
        server.stop()
        server.listen_host, server.extra_args = listen_host, saved_flags + list(flags)
        server.start()

    yield restart
    server.stop()
    server.listen_host, server.extra_args = saved_host, saved_flags
    server.start()


def volume_name():
    """A volume name no other test uses."""
    return f"vol-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def volume(server):
    """A fresh volume of the server's key, destroyed afterwards."""
    from e2b import Volume

    vol = Volume.create(volume_name())
    yield vol
    Volume.destroy(vol.volume_id)


@pytest.fixture
def names(server):
    """Template names for one test; each is deleted afterwards (with its key's API key)."""
    from e2b import Sandbox

    made = []

    def make(api_key=None):
        name = f"t-{uuid.uuid4().hex[:12]}"
        made.append((name, api_key))
        return name

    yield make
    for name, api_key in made:
        kwargs = {"api_key": api_key} if api_key else {}
        try:
            Sandbox.delete_snapshot(name, **kwargs)
        except Exception:
            pass


# Airlock's create-body extension, which the SDK has no argument for.
SIZE_FIELDS = ("cpuCount", "memoryMB", "diskSizeMB")


@pytest.fixture
def sandbox_factory(server):
    """Makes `base` sandboxes (killed afterwards). SDK arguments pass through; a size
    (`cpuCount`, `memoryMB`, `diskSizeMB`) makes it create through the REST API instead."""
    from e2b import Sandbox

    made = []

    def make(**kwargs):
        size = {k: kwargs.pop(k) for k in SIZE_FIELDS if k in kwargs}
        if size:
            assert not kwargs, "sizes and SDK arguments do not mix here"
            status, body = server.api("POST", "/v2/sandboxes", {"templateID": "base", **size})
            assert status == 201, body
            sbx = Sandbox.connect(body["sandboxID"])
        else:
            kwargs.setdefault("metadata", {})
            kwargs["metadata"].setdefault("test_id", uuid.uuid4().hex)
            sbx = Sandbox.create("base", **kwargs)
        made.append(sbx)
        return sbx

    yield make
    for sbx in made:
        try:
            sbx.kill()
        except Exception:
            pass


@pytest.fixture
def browser():
    """A headless Chromium, closed afterwards."""
    b = Browser()
    yield b
    b.close()


@pytest.fixture
def sandbox(sandbox_factory):
    return sandbox_factory()


def airlock_key(server, *args, database=None):
    """Runs `airlock key ARGS` against the server's data dir, or the PostgreSQL `database`
    names; returns its output."""
    on_postgres = ["--database", database] if database else []
    out = subprocess.run(
        [str(AIRLOCK), "--data-dir", str(server.data_dir), *on_postgres, "key", *args],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def other_key(server):
    """A second API key: another tenant of the same server."""
    return airlock_key(server, "create", "--name", f"other-{uuid.uuid4().hex[:8]}")


SERVER_LOG_LINES = 60
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the end of the server's log: the test's data dir is a
    private temp dir that is gone after a CI run, and the server's reasons are in that log."""
    outcome = yield
    report = outcome.get_result()
    srv = item.funcargs.get("server") if hasattr(item, "funcargs") else None
    if report.failed and srv is not None and srv.log.exists():
        lines = srv.log.read_text(errors="replace").splitlines()[-SERVER_LOG_LINES:]
        report.sections.append(("airlock serve log (its last lines)",
                                ANSI_ESCAPE.sub("", "\n".join(lines))))


# The only skips a run may have: test id as pytest prints it (`test_x.py::test_y`) to why the
# claim it leaves out cannot be tested where it skips. Any other skip fails the run: a skipped
# test proves nothing, and a green run must mean that every claim was tested.
ALLOWED_SKIPS = {}

skipped = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        skipped.append((report.nodeid, reason))


def unallowed_skips():
    return [(test, reason) for test, reason in skipped if test not in ALLOWED_SKIPS]


def pytest_sessionfinish(session):
    if unallowed_skips() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if unallowed_skips():
        terminalreporter.section("skips not on ALLOWED_SKIPS (tests/integration/conftest.py)")
        for test, reason in unallowed_skips():
            terminalreporter.line(f"{test}: {reason}")
