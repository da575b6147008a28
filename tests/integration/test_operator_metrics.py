"""The operator's `/metrics` (`airlock serve --metrics-listen`): how full the host is, in
Prometheus' text format, read with Prometheus' own parser. Each figure is checked against what
the test did and what the host shows (the freezer's state, `/proc/meminfo`)."""

import time
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families
from test_freezer import wait_for_state


def memory_sized_max_sandboxes():
    """The default --max-sandboxes, as `airlock serve --help` states it: (MemTotal - 1024 MiB)
    / 20 MiB."""
    meminfo = dict(line.split(":") for line in open("/proc/meminfo"))
    return (int(meminfo["MemTotal"].split()[0]) // 1024 - 1024) // 20


def scrape(server):
    """{(sample name, frozenset of labels): value}."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics, name, **labels):
    return metrics.get((name, frozenset(labels.items())), 0)


def wait_for(server, check, within=60):
    """The first scrape for which `check(metrics)` holds."""
    deadline = time.monotonic() + within
    while True:
        metrics = scrape(server)
        if check(metrics) or time.monotonic() > deadline:
            assert check(metrics), metrics
            return metrics
        time.sleep(0.2)


def test_metrics_say_how_full_the_host_is(server, restarted, sandbox_factory):
    # A restart kills every running sandbox: what runs after it is this test's alone.
    restarted()
    metrics = wait_for(server, lambda m: value(m, "airlock_pool_ready", template="base")
                       == value(m, "airlock_pool_keep", template="base") == 2)
    assert value(metrics, "airlock_sandboxes", phase="running") == 0
    assert value(metrics, "airlock_sandboxes_max") == memory_sized_max_sandboxes()
    assert 0 < value(metrics, "airlock_pool_memory_bytes") <= value(
        metrics, "airlock_pool_memory_budget_bytes") == 2048 << 20
    meminfo = dict(line.split(":") for line in open("/proc/meminfo"))
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    assert value(metrics, "airlock_host_memory_total_bytes") == total
    assert 0 < value(metrics, "airlock_host_memory_available_bytes") < total
    # The pools were restored into since the restart, and no restore was thrown away unused.
    assert value(metrics, "airlock_pool_restores_total") >= 2
    assert value(metrics, "airlock_pool_wasted_restores_total") == 0

    sbx = sandbox_factory()
    wait_for_state(sbx.sandbox_id, "FROZEN")
    metrics = scrape(server)
    assert value(metrics, "airlock_sandboxes", phase="running") == 1
    assert value(metrics, "airlock_sandboxes_frozen") == 1
    # A process of its own keeps it awake (see test_freezer), and the count follows.
    sbx.commands.run("nohup sleep 60 >/dev/null 2>&1 &")
    wait_for_state(sbx.sandbox_id, "THAWED")
    assert value(scrape(server), "airlock_sandboxes_frozen") == 0

    sbx.kill()
    wait_for(server, lambda m: value(m, "airlock_sandboxes", phase="running") == 0)


def test_metrics_are_not_on_the_api_port(server):
    """The numbers are the whole host's: API keys' holders do not get them."""
    status, body = server.api("GET", "/metrics")
    assert status == 404, body


def test_verbs_keys_builds_and_disks_are_counted(server, restarted, sandbox_factory):
    import hashlib
    import os

    from e2b import Sandbox, SandboxException

    from conftest import API_KEY

    restarted()  # counters start afresh with the process
    before = scrape(server)
    assert value(before, "airlock_sandbox_verb_calls_total", verb="create", outcome="ok") == 0
    assert value(before, "airlock_golden_image_builds_total", outcome="failed") == 0

    sbx = sandbox_factory()
    sbx.pause()
    Sandbox.connect(sbx.sandbox_id)
    try:
        Sandbox.create("no-such-template")
    except SandboxException:
        pass
    metrics = scrape(server)
    for verb, outcome in [("create", "ok"), ("create", "refused"), ("pause", "ok"), ("connect", "ok")]:
        assert value(metrics, "airlock_sandbox_verb_calls_total", verb=verb, outcome=outcome) == 1, (verb, outcome)
    assert value(metrics, "airlock_sandbox_verb_seconds_count", verb="create") == 2
    assert value(metrics, "airlock_sandbox_verb_seconds_sum", verb="create") > 0
    assert value(metrics, "airlock_sandbox_verb_seconds_bucket", verb="create", le="+Inf") == 2

    key_id = hashlib.sha256(API_KEY.encode()).hexdigest()[:12]
    assert value(metrics, "airlock_key_sandboxes", key=key_id, state="running") == 1
    assert value(metrics, "airlock_key_sandboxes", key=key_id, state="paused") == 0

    disk = os.statvfs(server.data_dir)
    total = disk.f_blocks * disk.f_frsize
    assert value(metrics, "airlock_disk_total_bytes", dir="data") == total
    assert 0 < value(metrics, "airlock_disk_available_bytes", dir="data") <= total
    assert ("airlock_golden_image_builds_total", frozenset({"outcome": "ok"}.items())) in metrics

    sbx.kill()
    metrics = scrape(server)
    assert value(metrics, "airlock_sandbox_verb_calls_total", verb="kill", outcome="ok") == 1
    assert value(metrics, "airlock_key_sandboxes", key=key_id, state="running") == 0
