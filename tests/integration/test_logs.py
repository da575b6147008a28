"""Sandbox logs (`GET /v2/sandboxes/{id}/logs`, and E2B's first version), read through the stock
SDKs' own API clients: the processes the agent started and ended, and what the template's start
command wrote, before and after its golden image was taken. They survive a pause, and a key
reads its own sandboxes' logs only."""

import time

import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.api.client.api.sandboxes import (
    get_sandboxes_sandbox_id_logs as logs_v1,
    get_v_2_sandboxes_sandbox_id_logs as logs_v2,
)
from e2b.api.client.models import LogLevel, LogsDirection
from e2b.connection_config import ConnectionConfig
from e2b.sandbox_sync.paginator import get_api_client


def read_logs(sandbox_id, api_key=None, **query):
    """The v2 log page through the SDK's generated client: (status, entries or error)."""
    config = ConnectionConfig(api_key=api_key) if api_key else ConnectionConfig()
    res = logs_v2.sync_detailed(sandbox_id, client=get_api_client(config), **query)
    if res.status_code != 200:
        return res.status_code, res.parsed
    return 200, res.parsed.logs


def wait_for(sandbox_id, predicate, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        status, entries = read_logs(sandbox_id)
        assert status == 200, entries
        if any(predicate(e) for e in entries) or time.monotonic() > deadline:
            return entries
        time.sleep(0.5)


def fields(entry):
    return entry.fields.additional_properties


def events(entries, event):
    return [e for e in entries if fields(e).get("event") == event]


def test_logs_hold_processes_and_the_start_commands_output(server, names):
    # A start command that says hello on stdout, then logs each request on stderr.
    name = names()
    Template.build(Template().from_template("base")
                   .set_start_cmd("echo hello-from-start; exec python3 -u -m http.server 8080",
                                  wait_for_port(8080)), name)
    sbx = Sandbox.create(name)
    try:
        status, entries = read_logs(sbx.sandbox_id)
        assert status == 200, entries
        messages = [e.message for e in entries]
        # Written in the golden image, before this sandbox existed as itself.
        hello = next(e for e in entries if e.message == "hello-from-start")
        assert hello.level == LogLevel.INFO and fields(hello)["stream"] == "stdout", hello
        started = [e for e in events(entries, "process_start")
                   if fields(e).get("tag") == "start-cmd"]
        assert started and "http.server 8080" in started[0].message, messages
        assert f"sandbox {sbx.sandbox_id} started" in messages, messages
        stamps = [e.timestamp for e in entries]
        assert stamps == sorted(stamps)

        # What the restored start command writes now is logged too (http.server logs each
        # request on stderr).
        assert server.sandbox_port(sbx.sandbox_id, 8080, "/logged-path")[0] == 404
        entries = wait_for(sbx.sandbox_id, lambda e: "GET /logged-path" in e.message)
        request = [e for e in entries if "GET /logged-path" in e.message]
        assert request and fields(request[0])["stream"] == "stderr", messages

        # Commands run through the SDK are logged with their user and how they ended, but
        # not their output: only the start command's output is.
        sbx.commands.run("echo ran-by-sdk")
        status, entries = read_logs(sbx.sandbox_id)
        run = next(e for e in events(entries, "process_start") if "ran-by-sdk" in e.message)
        assert fields(run)["user"] == "user" and "as user: /bin/bash -l -c" in run.message, run
        ended = [e for e in events(entries, "process_end")
                 if fields(e)["pid"] == fields(run)["pid"]]
        assert ended and fields(ended[0])["exit_code"] == "0", ended
        assert ended[0].level == LogLevel.INFO
        assert not any(e.message == "ran-by-sdk" for e in entries)

        # A paused sandbox's log reads as it was; after the resume it goes on.
        status, before = read_logs(sbx.sandbox_id)
        sbx.pause()
        status, paused = read_logs(sbx.sandbox_id)
        assert status == 200, paused
        assert [e.message for e in paused] == [e.message for e in before]
        sbx = Sandbox.connect(sbx.sandbox_id)
        sbx.commands.run("echo after-resume")
        status, resumed = read_logs(sbx.sandbox_id)
        assert status == 200 and [e.message for e in resumed[:len(before)]] == \
            [e.message for e in before]
        assert any("after-resume" in e.message for e in resumed[len(before):])
    finally:
        sbx.kill()


def test_log_pages_filter_and_read_backward(server, sandbox, other_key):
    with pytest.raises(Exception):
        sandbox.commands.run("exit 3")
    sandbox.commands.run("echo marker-one")
    status, everything = read_logs(sandbox.sandbox_id)
    assert status == 200 and len(everything) >= 5, everything

    # A failed command's end is a warning, and `level` keeps warnings and worse.
    status, warnings = read_logs(sandbox.sandbox_id, level=LogLevel.WARN)
    assert warnings and all(e.level in (LogLevel.WARN, LogLevel.ERROR) for e in warnings)
    assert any(fields(e).get("exit_code") == "3" for e in warnings), warnings

    # Backward reads newest first; limit and cursor page; search matches messages.
    status, newest = read_logs(sandbox.sandbox_id, direction=LogsDirection.BACKWARD, limit=2)
    assert [e.message for e in newest] == [e.message for e in everything[::-1][:2]]
    third = everything[2].timestamp
    status, later = read_logs(sandbox.sandbox_id, cursor=int(third.timestamp() * 1000))
    assert later and all(e.timestamp >= third for e in later)
    assert len(later) <= len(everything) - 2
    status, found = read_logs(sandbox.sandbox_id, search="marker-one")
    assert len(found) == 1 and "echo marker-one" in found[0].message, found

    # E2B's first version: lines and entries.
    res = logs_v1.sync_detailed(sandbox.sandbox_id, client=get_api_client(ConnectionConfig()),
                                limit=3)
    assert res.status_code == 200, res.content
    assert len(res.parsed.logs) == 3 and len(res.parsed.log_entries) == 3
    assert res.parsed.logs[0].line == everything[0].message

    # Another key's sandbox and an unknown one are not found; bad queries are 400.
    assert read_logs(sandbox.sandbox_id, api_key=other_key)[0] == 404
    assert read_logs("nosuchsandbox0000000")[0] == 404
    for query in ("limit=0", "direction=sideways", "level=fatal", "cursor=soon"):
        status, body = server.api("GET", f"/v2/sandboxes/{sandbox.sandbox_id}/logs?{query}")
        assert (status, body["code"]) == (400, 400), (query, body)

    # Through the npm SDK's API client too.
    js = """
      import { ApiClient, ConnectionConfig } from 'e2b'
      const client = new ApiClient(new ConnectionConfig())
      const res = await client.api.GET('/v2/sandboxes/{sandboxID}/logs', {
        params: { path: { sandboxID: process.argv[1] }, query: { search: 'marker-one' } } })
      console.log(JSON.stringify({ status: res.response.status,
                                   messages: res.data.logs.map(e => e.message) }))
    """
    got = server.js(js, sandbox.sandbox_id)
    assert got["status"] == 200 and len(got["messages"]) == 1, got
    assert "marker-one" in got["messages"][0], got
