"""`airlock mcp` (stdio) and `/mcp` (streamable HTTP), driven by the official Python MCP client
(`mcp` from PyPI): the tools a model sees, state across calls, charts as images, errors as tool
errors, files both ways, and bad input that leaves the session working."""

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request

import pytest
from conftest import AIRLOCK, API_KEY

# The MCP server does not use the e2b SDK, so one run covers it; the `mcp` client is pinned
# with the newest SDKs only (tests/requirements.txt).
pytestmark = pytest.mark.newest_sdk

PNG = b"\x89PNG\r\n\x1a\n"
TOOLS = {"run_code", "run_command", "read_file", "write_file", "list_files", "upload",
         "download", "create_sandbox", "kill_sandbox"}


def stdio(server, key=API_KEY, cwd=None, args=()):
    from mcp import StdioServerParameters
    return StdioServerParameters(command=str(AIRLOCK), args=["--url", server.url, "mcp", *args],
                                 env={"AIRLOCK_API_KEY": key}, cwd=cwd)


def http(server, key=API_KEY):
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    return streamable_http_client(f"{server.url}/mcp",
                                  http_client=create_mcp_http_client(headers={"X-API-Key": key}))


# Each transport with the protocol its clients speak: stdio with the initialize handshake
# (Claude Desktop's), HTTP both with sessions (the handshake) and without (2026-07-28).
CONNECTIONS = {
    "stdio": (stdio, "legacy"),
    "http-session": (http, "legacy"),
    "http-stateless": (http, "auto"),
}


def session(server, connection, steps, key=API_KEY, **how):
    """Runs `await steps(client)` in one MCP session over `connection` (made with `how`, e.g.
    stdio's cwd); returns its result."""
    from mcp import Client
    make, mode = CONNECTIONS[connection]

    async def main():
        async with Client(make(server, key, **how), mode=mode) as client:
            return await steps(client)
    return asyncio.run(main())


def text_of(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


@pytest.fixture(params=list(CONNECTIONS))
def connection(request, server):
    yield request.param
    # Sessionless calls share one sandbox per key, which outlives the test: not left behind.
    from e2b import Sandbox, SandboxQuery
    for s in Sandbox.list(query=SandboxQuery(metadata={"airlock-mcp": "shared"})).next_items():
        Sandbox.kill(s.sandbox_id)


def test_initialize_and_list_tools(server, connection):
    async def steps(client):
        return (await client.list_tools()).tools
    tools = session(server, connection, steps)
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert len(tool.description) > 40, tool
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["properties"], tool
    run_code = next(t for t in tools if t.name == "run_code")
    assert run_code.input_schema["required"] == ["code"]


def test_run_code_keeps_state_returns_charts_and_errors_as_tool_errors(server, connection):
    async def steps(client):
        first = await client.call_tool("run_code", {"code": "x = 41\nprint('set')"})
        second = await client.call_tool("run_code", {"code": "x + 1"})
        chart = await client.call_tool("run_code", {"code": (
            "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 3])\nplt.show()")})
        error = await client.call_tool("run_code", {"code": "def f():\n    return 1 / 0\nf()"})
        after = await client.call_tool("run_code", {"code": "x"})
        return first, second, chart, error, after
    first, second, chart, error, after = session(server, connection, steps)
    assert not first.is_error and "set" in text_of(first)
    assert not second.is_error and "42" in text_of(second)
    images = [c for c in chart.content if c.type == "image"]
    assert not chart.is_error and len(images) == 1, chart
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(PNG)
    # The model gets the error and where it happened, without the terminal's colours.
    assert error.is_error
    assert "ZeroDivisionError" in text_of(error) and "return 1 / 0" in text_of(error)
    assert "\x1b[" not in text_of(error)
    assert not after.is_error and "41" in text_of(after)


def test_files_go_both_ways(server, connection, tmp_path):
    blob = bytes(range(256)) * 40

    async def steps(client):
        wrote = await client.call_tool("write_file", {"path": "/home/user/notes/a.txt",
                                                      "content": "héllo\n"})
        read = await client.call_tool("read_file", {"path": "/home/user/notes/a.txt"})
        listed = await client.call_tool("list_files", {"path": "/home/user/notes"})
        up = await client.call_tool("upload", {"path": "data.bin",
                                               "content_base64": base64.b64encode(blob).decode()})
        down = await client.call_tool("download", {"path": "/home/user/data.bin"})
        used = await client.call_tool("run_code", {"code": (
            "import hashlib; hashlib.sha256(open('/home/user/data.bin','rb').read()).hexdigest()")})
        binary = await client.call_tool("read_file", {"path": "/home/user/data.bin"})
        return wrote, read, listed, up, down, used, binary
    wrote, read, listed, up, down, used, binary = session(server, connection, steps)
    assert not wrote.is_error and text_of(read) == "héllo\n"
    assert "/home/user/notes/a.txt" in text_of(listed)
    assert not up.is_error, text_of(up)
    [resource] = [c for c in down.content if c.type == "resource"]
    assert base64.b64decode(resource.resource.blob) == blob
    import hashlib
    assert hashlib.sha256(blob).hexdigest() in text_of(used)
    assert binary.is_error and "download" in text_of(binary)


def test_local_files_are_the_callers_only_over_stdio(server, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "in.csv").write_text("city,salary\nOslo,1\n")
    (files / "out").mkdir()

    async def steps(client):
        up = await client.call_tool("upload", {"path": "in.csv", "local_path": "in.csv"})
        down = await client.call_tool("download", {"path": "in.csv",
                                                   "local_path": str(files / "out" / "got.csv")})
        return up, down
    # Relative to the directory it started in, or absolute inside it.
    up, down = session(server, "stdio", steps, cwd=files)
    assert not up.is_error and not down.is_error, (text_of(up), text_of(down))
    assert (files / "out" / "got.csv").read_text() == (files / "in.csv").read_text()

    # Over HTTP the server's files are not the caller's: refused, and nothing is written.
    async def remote(client):
        return (await client.call_tool("upload", {"path": "x", "local_path": "/etc/shadow"}),
                await client.call_tool("download", {"path": "in.csv",
                                                    "local_path": str(tmp_path / "leak")}))
    for result in session(server, "http-session", remote):
        assert result.is_error and "stdio" in text_of(result)
    assert not (tmp_path / "leak").exists()


def test_local_paths_stay_in_the_files_dir(server, tmp_path):
    """Issue 31: a model (or a prompt injected into it) names the local paths, so they must not
    reach the user's other files: absolute paths elsewhere, `..`, and symlinks that lead out
    are tool errors, both in the directory `airlock mcp` started in and in `--files-dir`."""
    secret = tmp_path / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("PRIVATE KEY 9f2c")
    files = tmp_path / "files"
    (files / "sub").mkdir(parents=True)
    (files / "ok.txt").write_text("fine to send")
    (files / "key").symlink_to(secret)
    (files / "ssh").symlink_to(secret.parent)
    (files / "sub" / "up").symlink_to(tmp_path / "home")

    async def steps(client):
        await client.call_tool("write_file", {"path": "/home/user/from-sandbox", "content": "x"})
        results = {}
        for local in [str(secret), "../home/.ssh/id_ed25519", "sub/../../home/.ssh/id_ed25519",
                      "key", "ssh/id_ed25519", "sub/up/.ssh/id_ed25519"]:
            results[f"upload {local}"] = await client.call_tool(
                "upload", {"path": "/home/user/stolen", "local_path": local})
        stolen = await client.call_tool("read_file", {"path": "/home/user/stolen"})
        for local in [str(tmp_path / "home" / "planted"), "../home/planted",
                      "ssh/authorized_keys", "sub/up/planted", "key"]:
            results[f"download {local}"] = await client.call_tool(
                "download", {"path": "/home/user/from-sandbox", "local_path": local})
        ok = await client.call_tool("upload", {"path": "/home/user/ok.txt",
                                               "local_path": "ok.txt"})
        back = await client.call_tool("download", {"path": "/home/user/ok.txt",
                                                   "local_path": "sub/back.txt"})
        return results, stolen, ok, back

    for how in ({"cwd": files}, {"args": ["--files-dir", str(files)]}):
        results, stolen, ok, back = session(server, "stdio", steps, **how)
        for what, result in results.items():
            assert result.is_error, (how, what, text_of(result))
            assert "outside" in text_of(result), (how, what, text_of(result))
        assert "9f2c" not in text_of(stolen), how
        assert stolen.is_error, (how, text_of(stolen))
        assert secret.read_text() == "PRIVATE KEY 9f2c"
        assert sorted(p.name for p in (tmp_path / "home").iterdir()) == [".ssh"]
        assert sorted(p.name for p in secret.parent.iterdir()) == ["id_ed25519"]
        # The positive control: a file of the directory goes in and comes back.
        assert not ok.is_error and not back.is_error, (text_of(ok), text_of(back))
        assert (files / "sub" / "back.txt").read_text() == "fine to send"
        (files / "sub" / "back.txt").unlink()


def test_bad_input_gets_tool_errors_and_the_session_goes_on(server, connection):
    async def steps(client):
        results = {
            "missing": await client.call_tool("run_code", {}),
            "wrong type": await client.call_tool("run_code", {"code": 5}),
            "unknown tool": await client.call_tool("rm_rf", {}),
            "timeout": await client.call_tool("run_code", {
                "code": "y = 7\nimport time\ntime.sleep(60)", "timeout": 3}),
            "over the cap": await client.call_tool("run_code", {"code": "print('a' * 500_000)"}),
            "no such sandbox": await client.call_tool("run_code", {
                "code": "1", "sandbox_id": "nosuchsandbox1234"}),
        }
        results["after"] = await client.call_tool("run_code", {"code": "y * 6"})
        return results
    r = session(server, connection, steps)
    assert r["missing"].is_error and "missing field `code`" in text_of(r["missing"])
    assert r["wrong type"].is_error and "invalid type" in text_of(r["wrong type"])
    assert r["unknown tool"].is_error and "run_code" in text_of(r["unknown tool"])
    assert r["timeout"].is_error and "timeout of 3 s" in text_of(r["timeout"])
    capped = text_of(r["over the cap"])
    assert not r["over the cap"].is_error and "more bytes cut" in capped
    assert 30_000 < len(capped) < 40_000
    assert r["no such sandbox"].is_error and "nosuchsandbox1234" in text_of(r["no such sandbox"])
    # The interrupted run left its variable, and the kernel answers again.
    assert not r["after"].is_error and "42" in text_of(r["after"]), text_of(r["after"])


def test_a_killed_sandbox_is_a_tool_error_then_a_fresh_one(server, connection):
    from e2b import Sandbox

    async def steps(client):
        first = await client.call_tool("run_code", {"code": "z = 1"})
        killed = [s.sandbox_id for s in Sandbox.list().next_items()
                  if s.metadata.get("airlock-mcp")]
        for sandbox_id in killed:
            Sandbox.kill(sandbox_id)
        gone = await client.call_tool("run_code", {"code": "z"})
        fresh = await client.call_tool("run_code", {"code": "'z' in globals()"})
        return first, killed, gone, fresh
    first, killed, gone, fresh = session(server, connection, steps)
    assert not first.is_error and killed
    assert gone.is_error
    if connection == "http-stateless":
        # No session remembers the sandbox: the call ran in a fresh one, where `z` is not.
        assert "NameError" in text_of(gone), text_of(gone)
    else:
        assert "fresh sandbox" in text_of(gone), text_of(gone)
    assert not fresh.is_error and "False" in text_of(fresh)


def test_create_sandbox_makes_the_default_and_kill_sandbox_ends_it(server, connection):
    async def steps(client):
        created = await client.call_tool("create_sandbox", {"timeout": 120})
        host = await client.call_tool("run_command", {"command": "hostname"})
        killed = await client.call_tool("kill_sandbox", {})
        again = await client.call_tool("run_command", {"command": "hostname"})
        return created, host, killed, again
    created, host, killed, again = session(server, connection, steps)
    assert not created.is_error, text_of(created)
    sandbox_id = text_of(created).split()[2]  # "started sandbox ID from template ..."
    # The hostname of a sandbox is its id: the next call went to the new sandbox.
    assert not host.is_error and sandbox_id in text_of(host), text_of(host)
    assert text_of(killed) == f"killed sandbox {sandbox_id}"
    assert not again.is_error and sandbox_id not in text_of(again)


@pytest.mark.parametrize("connection", ["stdio", "http-session"])
def test_a_session_kills_its_sandbox_when_it_ends(server, connection):
    from e2b import Sandbox

    def session_sandboxes():
        return [s.sandbox_id for s in Sandbox.list().next_items()
                if s.metadata.get("airlock-mcp") == "session"]

    async def steps(client):
        await client.call_tool("run_code", {"code": "1"})
        return session_sandboxes()
    [started] = session(server, connection, steps)
    # An HTTP session ends with the client's DELETE; its sandbox is killed just after.
    deadline = time.time() + 30
    while started in session_sandboxes() and time.time() < deadline:
        time.sleep(0.2)
    assert started not in session_sandboxes()


def test_http_needs_a_key_and_keeps_keys_apart(server, other_key):
    for headers in ({}, {"X-API-Key": "e2b_" + "0" * 40}):
        req = urllib.request.Request(f"{server.url}/mcp", data=b"{}", headers=headers,
                                     method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401
        assert json.loads(e.value.read())["code"] == 401

    from e2b import Sandbox
    mine = Sandbox.create()
    try:
        async def use(client):
            return await client.call_tool("run_command", {"command": "echo here",
                                                          "sandbox_id": mine.sandbox_id})
        # The positive control: the owner's key reaches it through MCP.
        assert "here" in text_of(session(server, "http-session", use))
        theirs = session(server, "http-session", use, key=other_key)
        assert theirs.is_error and "here" not in text_of(theirs)
        assert "not found" in text_of(theirs).lower(), text_of(theirs)
        # Bearer works as X-API-Key does.
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        async def bearer():
            client = create_mcp_http_client(headers={"Authorization": f"Bearer {API_KEY}"})
            async with Client(streamable_http_client(f"{server.url}/mcp", http_client=client),
                              mode="legacy") as c:
                return await use(c)
        assert "here" in text_of(asyncio.run(bearer()))
    finally:
        mine.kill()
