"""Sandbox metrics through the stock SDKs (`sandbox.get_metrics`, `GET /sandboxes/metrics`):
CPU, memory and disk, sampled every 5 s from the sandbox's cgroup and disk for its life. A key
sees its own sandboxes' only."""

import time
from datetime import datetime, timezone

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException


def sampled(sbx, count, timeout=40):
    """The sandbox's samples once it has at least `count`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = sbx.get_metrics()
        if len(metrics) >= count:
            return metrics
        time.sleep(1)
    raise AssertionError(f"fewer than {count} samples after {timeout} s: {metrics}")


def test_metrics_report_cpu_memory_and_disk(server, sandbox_factory, other_key):
    sbx = sandbox_factory()
    sbx.commands.run("head -c 100000000 /dev/urandom > /home/user/blob")
    # One CPU of the sandbox's two kept busy for a while.
    sbx.commands.run("timeout 25 sh -c 'while :; do :; done'", background=True)
    metrics = sampled(sbx, 3)
    _, detail = server.api("GET", f"/sandboxes/{sbx.sandbox_id}")
    last = metrics[-1]
    assert last.cpu_count == detail["cpuCount"]
    assert last.mem_total == detail["memoryMB"] << 20
    assert last.disk_total == detail["diskSizeMB"] << 20
    assert last.disk_used >= 100_000_000, last
    assert 0 < last.mem_used and 0 <= last.mem_cache <= last.mem_used, last
    busy = max(m.cpu_used_pct for m in metrics[1:])
    assert 20 < busy <= 100, [m.cpu_used_pct for m in metrics]
    stamps = [m.timestamp for m in metrics]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)

    # A time range picks the samples in it.
    second = metrics[1].timestamp
    picked = sbx.get_metrics(start=second, end=second)
    assert [m.timestamp for m in picked] == [second], picked
    future = datetime.fromtimestamp(time.time() + 3600, tz=timezone.utc)
    assert sbx.get_metrics(start=future) == []

    # The latest of several at once; others' and unknown ids are left out.
    status, body = server.api("GET", f"/sandboxes/metrics?sandbox_ids={sbx.sandbox_id},nosuch")
    assert status == 200 and list(body["sandboxes"]) == [sbx.sandbox_id], body
    assert body["sandboxes"][sbx.sandbox_id]["diskTotal"] == last.disk_total
    status, body = server.api("GET", f"/sandboxes/metrics?sandbox_ids={sbx.sandbox_id}",
                              key=other_key)
    assert status == 200 and body["sandboxes"] == {}, body

    # Through the npm SDK too.
    js = """
      import { Sandbox } from 'e2b'
      const m = await Sandbox.getMetrics(process.argv[1])
      console.log(JSON.stringify({ n: m.length, cpus: m.at(-1).cpuCount,
                                   disk: m.at(-1).diskUsed, date: m.at(-1).timestamp instanceof Date }))
    """
    got = server.js(js, sbx.sandbox_id)
    assert got["n"] >= 3 and got["cpus"] == last.cpu_count and got["date"], got
    assert got["disk"] >= 100_000_000, got


def test_metrics_of_unknown_or_another_keys_sandbox_are_not_found(server, sandbox, other_key):
    with pytest.raises(NotFoundException):
        Sandbox.get_metrics(sandbox.sandbox_id, api_key=other_key)
    with pytest.raises(NotFoundException):
        Sandbox.get_metrics("nosuchsandbox0000000")
    for query in ("start=yesterday", "start=20&end=10"):
        status, body = server.api("GET", f"/sandboxes/{sandbox.sandbox_id}/metrics?{query}")
        assert (status, body["code"]) == (400, 400), body
    status, body = server.api("GET", "/sandboxes/metrics")
    assert status == 400 and "sandbox_ids" in body["message"], body
