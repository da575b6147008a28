"""Lifecycle through the stock SDK and the raw API: list by metadata, kill, timeouts, bad input."""

import concurrent.futures
import json
import subprocess
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from e2b import (
    AuthenticationException,
    NotEnoughSpaceException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
)
from e2b.api.client.api.sandboxes import post_sandboxes_sandbox_id_refreshes as refreshes
from e2b.api.client.models import Error, SandboxRefreshRequest
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import NotFoundException
from e2b.sandbox_sync.paginator import get_api_client

from conftest import API_KEY
from test_tenants import wait_for_port


def listed_ids(metadata):
    paginator = Sandbox.list(query=SandboxQuery(metadata=metadata))
    ids = []
    while True:
        ids += [s.sandbox_id for s in paginator.next_items()]
        if not paginator.has_next:
            return ids


def test_list_by_metadata(sandbox_factory):
    tag = uuid.uuid4().hex
    a = sandbox_factory(metadata={"suite": tag, "role": "a b/c"})
    b = sandbox_factory(metadata={"suite": tag, "role": "other"})
    assert sorted(listed_ids({"suite": tag})) == sorted([a.sandbox_id, b.sandbox_id])
    assert listed_ids({"suite": tag, "role": "a b/c"}) == [a.sandbox_id]
    assert listed_ids({"suite": "no-such-" + tag}) == []


def test_list_paginates(server, sandbox_factory):
    tag = uuid.uuid4().hex
    made = {sandbox_factory(metadata={"page": tag}).sandbox_id for _ in range(3)}
    paginator = Sandbox.list(query=SandboxQuery(metadata={"page": tag}), limit=2)
    first = paginator.next_items()
    assert len(first) == 2 and paginator.has_next
    rest = paginator.next_items()
    assert {s.sandbox_id for s in first + rest} == made
    assert not paginator.has_next


def test_list_orders_filters_and_pages_by_start_time(sandbox_factory):
    """Newest first by default; `order="asc"`; `started_after`; the template filter; running
    and paused both by default; and pages that stay right when a listed sandbox is killed
    between them."""
    tag = uuid.uuid4().hex
    made = []
    for _ in range(3):  # within a second or so: start times have their fractions
        made.append(sandbox_factory(metadata={"order": tag}))
    ids = [s.sandbox_id for s in made]

    def listed(limit=None, order=None, **query):
        paginator = Sandbox.list(query=SandboxQuery(metadata={"order": tag}, **query),
                                 limit=limit, order=order)
        out = []
        while paginator.has_next:
            out += [s.sandbox_id for s in paginator.next_items()]
        return out

    assert listed() == ids[::-1]
    assert listed(order="asc") == ids
    assert listed(limit=1) == ids[::-1]
    assert listed(started_after=made[1].get_info().started_at) == ids[:0:-1]
    assert listed(template="base") == ids[::-1]
    assert listed(template="no-such-template") == []

    made[0].pause()
    assert listed() == ids[::-1], "paused ones are listed too"
    assert listed(state=[SandboxState.RUNNING]) == ids[:0:-1]

    paginator = Sandbox.list(query=SandboxQuery(metadata={"order": tag}), limit=1)
    assert [s.sandbox_id for s in paginator.next_items()] == [ids[2]]
    made[1].kill()
    assert [s.sandbox_id for s in paginator.next_items()] == [ids[0]]
    assert not paginator.has_next


def test_paginate_running_and_paused_sandboxes(sandbox_factory):
    """E2B's test of that name: running and paused are one list, newest first, so a first page
    of one is the newest sandbox whatever its state. The two are made within the same second,
    which whole-second start times could not order."""
    tag = uuid.uuid4().hex
    older = sandbox_factory(metadata={"both": tag})
    newer = sandbox_factory(metadata={"both": tag})
    newer.pause()
    started = [s.get_info().started_at for s in (older, newer)]
    assert started[0] < started[1], started
    assert started[1] - started[0] < timedelta(seconds=5), "made one after the other"

    query = SandboxQuery(metadata={"both": tag}, state=[SandboxState.RUNNING, SandboxState.PAUSED])
    paginator = Sandbox.list(query=query, limit=1)
    first = paginator.next_items()
    assert [(s.sandbox_id, s.state) for s in first] == [(newer.sandbox_id, SandboxState.PAUSED)]
    assert paginator.has_next and paginator.next_token
    second = paginator.next_items()
    assert [(s.sandbox_id, s.state) for s in second] == [(older.sandbox_id, SandboxState.RUNNING)]
    assert not paginator.has_next and paginator.next_token is None
    assert [s.started_at for s in first + second] == started[::-1], "the fractions are listed too"


def test_the_js_sdk_lists_newest_first_and_never_a_killed_sandbox(server):
    js = """
      import { Sandbox } from 'e2b'
      const metadata = { js: process.argv[1] }
      const ids = async (opts = {}) => (await Sandbox.list({ query: { metadata }, ...opts })
        .nextItems()).map((s) => s.sandboxId)
      const a = await Sandbox.create({ metadata })
      const b = await Sandbox.create({ metadata })
      const before = await ids()
      const asc = await ids({ order: 'asc' })
      await b.kill()
      const after = await ids()
      let info = 'listed'
      try { await Sandbox.getInfo(b.sandboxId) } catch (e) { info = e.constructor.name }
      await a.kill()
      console.log(JSON.stringify({ order: [a.sandboxId, b.sandboxId], before, asc, after, info }))
    """
    got = server.js(js, uuid.uuid4().hex)
    a, b = got["order"]
    assert got["before"] == [b, a] and got["asc"] == [a, b], got
    assert got["after"] == [a] and got["info"] == "SandboxNotFoundError", got


def test_bad_list_queries_are_400(server):
    for query, named in [("order=sideways", "sideways"), ("state=asleep", "asleep"),
                         ("startedAfter=yesterday", "yesterday"),
                         ("nextToken=garbage", "nextToken")]:
        status, body = server.api("GET", f"/v2/sandboxes?{query}")
        assert (status, body["code"]) == (400, 400) and named in body["message"], body


def test_kill_then_everything_says_not_found(sandbox):
    sandbox_id = sandbox.sandbox_id
    assert sandbox.kill() is True
    # Gone at once for every view, while the host tears it down.
    assert sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox_id)
    assert not sandbox.is_running()
    assert Sandbox.kill(sandbox_id) is False
    with pytest.raises(SandboxException) as exc:
        sandbox.commands.run("echo hi")
    assert "not found" in str(exc.value).lower() or "not running" in str(exc.value).lower()
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandbox_id)


def test_timeout_kills_the_sandbox(sandbox_factory):
    sbx = sandbox_factory(timeout=3)
    assert sbx.commands.run("echo alive").stdout == "alive\n"
    deadline = time.monotonic() + 30
    while sbx.is_running() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not sbx.is_running()


def test_set_timeout_extends_life(sandbox_factory):
    sbx = sandbox_factory(timeout=3)
    sbx.set_timeout(120)
    time.sleep(5)
    assert sbx.is_running()
    end = sbx.get_info().end_at
    assert end.timestamp() - time.time() > 60


def test_refresh_lengthens_a_life_and_never_shortens_it(sandbox_factory, other_key):
    """`POST /sandboxes/{id}/refreshes` through the SDK's generated client: 204, the deadline
    moves out to `duration` from now, a shorter refresh leaves it, and another key's refresh
    is a 404 that changes nothing."""
    sbx = sandbox_factory(timeout=30)

    def refresh(api_key=None, **body):
        config = ConnectionConfig(api_key=api_key) if api_key else ConnectionConfig()
        return refreshes.sync_detailed(sbx.sandbox_id, client=get_api_client(config),
                                       body=SandboxRefreshRequest(**body))

    before = sbx.get_info().end_at
    assert refresh(duration=600).status_code == 204
    extended = sbx.get_info().end_at
    assert extended - before > timedelta(seconds=500), (before, extended)
    assert refresh(duration=60).status_code == 204
    assert refresh().status_code == 204, "duration is optional"
    assert sbx.get_info().end_at == extended, "a shorter refresh shortens nothing"

    other = refresh(api_key=other_key, duration=3000)
    assert other.status_code == 404 and isinstance(other.parsed, Error), other
    assert sbx.get_info().end_at == extended


@pytest.mark.newest_sdk
def test_killing_a_sandbox_mid_command_ends_the_stream(sandbox_factory):
    from e2b.exceptions import SandboxNotRunningException

    sbx = sandbox_factory()
    handle = sbx.commands.run("sleep 600", background=True)
    Sandbox.kill(sbx.sandbox_id)
    # The stream ends with E2B proxy's "was not found", which the SDK reads as the sandbox gone.
    with pytest.raises(SandboxNotRunningException) as exc:
        handle.wait()
    assert "The sandbox was killed or reached its timeout" in str(exc.value), exc.value


def test_get_host_names_a_port_the_proxy_serves(server, restarted):
    """With `--domain localhost:PORT`, `get_host(8080)` is `8080-{id}.localhost:PORT`, which
    curl (as browsers) sends to loopback, and the server's proxy to the sandbox's port 8080."""
    domain = f"localhost:{server.port}"
    restarted("--domain", domain)
    sbx = Sandbox.create()
    try:
        sbx.commands.run("cd /tmp && echo served > index.html && python3 -m http.server 8080",
                         background=True)
        wait_for_port(sbx, 8080)
        host = sbx.get_host(8080)
        assert host == f"8080-{sbx.sandbox_id}.{domain}"
        assert Sandbox.get_info(sbx.sandbox_id).sandbox_domain == domain
        got = subprocess.run(["curl", "-sS", f"http://{host}/index.html"],
                             capture_output=True, text=True, timeout=30)
        assert got.stdout == "served\n", got.stderr
    finally:
        sbx.kill()


def test_connect_returns_a_working_sandbox(sandbox):
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.commands.run("echo via connect").stdout == "via connect\n"


# ---------------------------------------------------------------- bad input


def test_unknown_template_is_a_clear_404(server):
    status, body = server.api("POST", "/v2/sandboxes", {"templateID": "no-such-template"})
    assert status == 404
    assert body["code"] == 404 and "no-such-template" in body["message"]
    with pytest.raises(SandboxException) as exc:
        Sandbox.create("no-such-template")
    assert "no-such-template" in str(exc.value)


def test_unknown_sandbox(server):
    status, body = server.api("GET", "/sandboxes/doesnotexist123")
    assert (status, body["code"]) == (404, 404)
    status, body = server.api("DELETE", "/sandboxes/doesnotexist123")
    assert status == 404
    status, body = server.api("POST", "/sandboxes/doesnotexist123/timeout", {"timeout": 10})
    assert status == 404
    # Sandbox traffic for an unknown id answers as E2B's proxy does.
    status, body = server.api("GET", "/health", key=None, headers={"E2b-Sandbox-Id": "doesnotexist123"})
    assert status == 502 and body["message"] == "The sandbox was not found"


def test_missing_or_wrong_api_key_is_401(server):
    for key in (None, "e2b_" + "0" * 40):
        status, body = server.api("GET", "/v2/sandboxes", key=key)
        assert status == 401
        assert body["code"] == 401 and body["message"]
    with pytest.raises(AuthenticationException):
        Sandbox.create("base", api_key="e2b_" + "1" * 40)


def test_malformed_body_is_400_and_the_server_carries_on(server, sandbox):
    status, body = server.api("POST", "/v2/sandboxes", raw=b"{not json")
    assert status == 400 and body["code"] == 400 and "JSON" in body["message"]
    status, body = server.api("POST", "/v2/sandboxes", {"timeout": 5})
    assert status == 400
    status, body = server.api("POST", "/v2/sandboxes", {"templateID": "base", "timeout": 10**9})
    assert status == 400
    status, body = server.api("POST", f"/sandboxes/{sandbox.sandbox_id}/timeout", raw=b"[]")
    assert status == 400
    assert sandbox.commands.run("echo fine").stdout == "fine\n"


def test_sandbox_routes_need_the_access_token(server, sandbox):
    status, body = server.api(
        "POST", "/filesystem.Filesystem/Stat", {"path": "/"}, key=None,
        headers={"E2b-Sandbox-Id": sandbox.sandbox_id},
    )
    assert status == 401
    # The agent's internal routes are never reachable through the proxy.
    status, body = server.api(
        "POST", "/init", {"accessToken": "mine"}, key=None,
        headers={"E2b-Sandbox-Id": sandbox.sandbox_id},
    )
    assert status == 404


@pytest.mark.newest_sdk
def test_upload_larger_than_free_space_is_507(sandbox):
    # /dev/shm is a 64 MiB tmpfs inside every sandbox: a real filesystem with little free space.
    free = int(sandbox.commands.run("df --output=avail -B1 /dev/shm | tail -1").stdout)
    assert 0 < free <= 256 * 1024 * 1024
    too_big = free + 16 * 1024 * 1024

    # Known length (multipart): refused before anything is written.
    with pytest.raises(NotEnoughSpaceException):
        sandbox.files.write("/dev/shm/known.bin", b"\0" * too_big)

    # Unknown length (a stream): the disk fills mid-write; the partial file is removed.
    def chunks():
        block = b"\0" * (4 * 1024 * 1024)
        for _ in range(too_big // len(block) + 1):
            yield block

    with pytest.raises(NotEnoughSpaceException):
        sandbox.files.write("/dev/shm/streamed.bin", chunks())
    assert not sandbox.files.exists("/dev/shm/known.bin")
    assert not sandbox.files.exists("/dev/shm/streamed.bin")
    assert int(sandbox.commands.run("df --output=avail -B1 /dev/shm | tail -1").stdout) == free
    assert sandbox.commands.run("echo still ok").stdout == "still ok\n"


def test_routing_by_host_header(server, sandbox):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/health", headers={"Host": f"49983-{sandbox.sandbox_id}.airlock.test"})
    assert conn.getresponse().status == 204
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/health", headers={"Host": "49983-nosuchsandbox.airlock.test"})
    resp = conn.getresponse()
    assert resp.status == 502 and b"The sandbox was not found" in resp.read()


class PoolWatch:
    """The sandboxes on the host that no one has been handed (the pools', and golden images'
    in the making), by template: what a bundle's rootfs mount is named after."""

    def __init__(self, server):
        self.bundles = server.data_dir / "gvisor" / "bundles"
        self.handed = set()  # a killed sandbox's bundle may outlive it for a moment

    def templates(self):
        listed = {s.sandbox_id for s in Sandbox.list(limit=1000).next_items()} | self.handed
        templates = []
        for bundle in self.bundles.iterdir():
            try:
                root = json.loads((bundle / "config.json").read_text())["root"]["path"]
            except (OSError, ValueError):
                continue  # going away
            if bundle.name not in listed:
                templates.append(Path(root).name.rsplit("-", 1)[0])
        return sorted(templates)

    def settled(self, count):
        """`count(templates)` once it has stayed the same for 10 s (within 2 minutes)."""
        last, since = None, time.time()
        for _ in range(240):
            now = count(self.templates())
            if now != last:
                last, since = now, time.time()
            elif time.time() - since >= 10:
                return now
            time.sleep(0.5)
        raise AssertionError(f"the pools did not settle: {self.templates()}")

    def wait_for(self, done, what):
        """Waits up to 2 minutes for `done(templates)`."""
        for _ in range(240):
            if done(self.templates()):
                return
            time.sleep(0.5)
        raise AssertionError(f"{what}: {self.templates()}")


@pytest.mark.server_only
def test_an_unused_templates_pool_is_emptied_and_filled_again_when_wanted(server, restarted):
    """`--pool-idle-secs`: a template nobody creates sandboxes of loses its pool (its idle
    sandboxes cost memory and CPU); a create still works (from the golden image) and makes
    the pool fill again."""
    pools = PoolWatch(server)
    restarted("--pool-idle-secs", "20")
    pools.wait_for(lambda pooled: not pooled, "the pools of unused templates were not emptied")
    sbx = Sandbox.create("base")
    pools.handed.add(sbx.sandbox_id)
    try:
        assert sbx.commands.run("echo from the golden image").stdout == "from the golden image\n"
    finally:
        sbx.kill()
    pools.wait_for(lambda pooled: len(pooled) >= 1, "base's pool was not filled again")


@pytest.mark.server_only
def test_a_pool_grows_with_demand_and_shrinks_back(server, restarted):
    """A create that finds its template's pool empty makes the pool keep one more (up to
    `--pool-max`), so the next burst finds them ready; with no create finding it empty for
    `--pool-shrink-secs`, the pool halves what it keeps beyond `--pool-size`."""
    pools = PoolWatch(server)
    # A ready sandbox goes only once it has waited --pool-min-age-secs: as long as a period.
    restarted("--pool-shrink-secs", "15", "--pool-max", "6", "--pool-min-age-secs", "15")
    # Templates built by other tests may share base's root filesystem, and so count as "base"
    # here: their pools are counted once they have settled, and must stay as they are.
    others = pools.settled(lambda pooled: pooled.count("base")) - 2
    with concurrent.futures.ThreadPoolExecutor(10) as burst:
        sandboxes = list(burst.map(lambda _: Sandbox.create("base"), range(10)))
    pools.handed.update(s.sandbox_id for s in sandboxes)
    try:
        for sbx in sandboxes:
            assert sbx.commands.run("echo ok").stdout == "ok\n"
    finally:
        for sbx in sandboxes:
            sbx.kill()
    # At most a few came from the pool (two, and any it refilled meanwhile); the rest found it
    # empty, more than the four it takes to reach --pool-max: it grows to that, not past it.
    pools.wait_for(lambda pooled: pooled.count("base") - others == 6,
                   "base's pool did not grow to 6")
    pools.wait_for(lambda pooled: pooled.count("base") - others == 2,
                   "base's pool did not shrink back to 2")


@pytest.mark.server_only
def test_the_pools_share_a_memory_budget(server, restarted):
    """`--pool-memory-mb`: the pools' ready sandboxes together hold at most about this much
    memory. With room for one (an idle sandbox holds about 20 MiB), one sandbox is pooled, and
    a create of a template moves it to that template (at once here: by default a ready
    sandbox moves only once it has waited a minute, `--pool-min-age-secs`); with the default
    budget (the positive control), the pools hold more."""
    pools = PoolWatch(server)
    pools.wait_for(lambda pooled: len(pooled) >= 2, "the default budget holds more than one")
    restarted("--pool-memory-mb", "1", "--pool-min-age-secs", "0")
    pools.wait_for(lambda pooled: len(pooled) == 1,
                   "the pools did not settle on one ready sandbox")
    wanted = "code-interpreter-v1" if pools.templates() != ["code-interpreter-v1"] else "base"
    sbx = Sandbox.create(wanted)
    pools.handed.add(sbx.sandbox_id)
    sbx.kill()
    pools.wait_for(lambda pooled: pooled == [wanted],
                   "the one ready sandbox did not move to the template created from last")
