"""envd 0.6 through the stock SDKs: file metadata (`user.e2b.*` extended attributes) on
`files.write` and `write_files`, multipart and octet-stream, shown by `get_info`, `list` and
`rename`; `watch_dir(..., include_entry=True)`; and entries as envd 0.6 reports them (a
directory's own size, a symlink's target type)."""

import asyncio
import io
import json
import time

import pytest
from e2b import AsyncSandbox, FileType, FilesystemEventType
from e2b.exceptions import InvalidArgumentException, NotFoundException


def envd(server, sbx, method, path, body, headers=None):
    """A raw request to the sandbox's agent through the server: (status, body text)."""
    return server.sandbox_port(sbx.sandbox_id, 49983, path, method, body,
                               {"X-Access-Token": sbx._envd_access_token, **(headers or {})})


def test_metadata_is_kept_shown_and_replaced(sandbox):
    info = sandbox.files.write("meta/a.txt", "alpha", metadata={"Author": "ada", "purpose": "x y"})
    # Keys are lowercased; the answer is what the file now holds.
    assert info.metadata == {"author": "ada", "purpose": "x y"}, info
    assert sandbox.files.get_info("meta/a.txt").metadata == info.metadata
    [listed] = sandbox.files.list("meta")
    assert listed.metadata == info.metadata
    moved = sandbox.files.rename("meta/a.txt", "meta/b.txt")
    assert moved.metadata == info.metadata

    # They are extended attributes inside the sandbox: visible to its programs, and ones set
    # there show up too, while attributes outside `user.e2b.` do not.
    attrs = sandbox.commands.run(
        "python3 -c \"import os; p='meta/b.txt'; os.setxattr(p, 'user.e2b.tool', b'py');"
        " os.setxattr(p, 'user.other', b'hidden'); print(sorted(os.listxattr(p)))\"").stdout
    assert "user.e2b.author" in attrs and "user.other" in attrs, attrs
    assert sandbox.files.get_info("meta/b.txt").metadata == {
        "author": "ada", "purpose": "x y", "tool": "py"}

    # An upload replaces the whole set; one without metadata clears it.
    again = sandbox.files.write("meta/b.txt", "beta", metadata={"stage": "2"})
    assert again.metadata == {"stage": "2"}
    assert sandbox.files.write("meta/b.txt", "gamma").metadata is None
    assert sandbox.files.get_info("meta/b.txt").metadata is None
    # ... and leaves the other attributes alone.
    assert "user.other" in sandbox.commands.run(
        "python3 -c \"import os; print(os.listxattr('meta/b.txt'))\"").stdout

    # Several files at once, multipart or octet-stream (streamed), all get the same set.
    many = sandbox.files.write_files(
        [{"path": "meta/c.txt", "data": "c"}, {"path": "meta/d.bin", "data": b"d"}],
        metadata={"batch": "7"})
    assert [(w.name, w.metadata) for w in many] == [("c.txt", {"batch": "7"}),
                                                     ("d.bin", {"batch": "7"})]
    streamed = sandbox.files.write("meta/e.bin", io.BytesIO(b"e" * 100_000),
                                   metadata={"via": "octet-stream"})
    assert streamed.metadata == {"via": "octet-stream"}
    assert sandbox.files.read("meta/e.bin", format="bytes") == b"e" * 100_000

    # Metadata survives a pause with the file.
    sandbox.pause()
    sandbox.connect()
    assert sandbox.files.get_info("meta/e.bin").metadata == {"via": "octet-stream"}


def test_bad_metadata_is_refused_and_writes_nothing(server, sandbox):
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write("meta/bad.txt", "x", metadata={"bad key": "v"})
    # The SDK checks first; the agent checks too, for any client.
    status, body = envd(server, sandbox, "POST", "/files?path=/home/user/meta/bad.txt", b"x",
                        {"Content-Type": "application/octet-stream",
                         "X-Metadata-Note": "caf\u00e9".encode().decode("latin-1")})
    assert status == 400 and "printable US-ASCII" in json.loads(body)["message"], body
    status, body = envd(server, sandbox, "POST", "/files?path=/home/user/meta/long.txt", b"x",
                        {"Content-Type": "application/octet-stream",
                         "X-Metadata-Big": "v" * (64 * 1024 + 1)})
    assert status in (400, 431), (status, body)
    assert not sandbox.files.exists("meta/bad.txt")
    assert not sandbox.files.exists("meta/long.txt")


@pytest.mark.newest_sdk
def test_entries_report_directory_sizes_and_symlink_targets(server, sandbox):
    sandbox.files.write("links/target.txt", "12345")
    sandbox.commands.run("cd links && ln -s target.txt file-link && ln -s /tmp dir-link"
                         " && ln -s nowhere dangling")
    # A directory's size is its own, as stat says.
    size = int(sandbox.commands.run("stat -c %s links").stdout)
    assert sandbox.files.get_info("links").size == size
    link = sandbox.files.get_info("links/file-link")
    assert link.type == FileType.SYMLINK and link.symlink_target == "/home/user/links/target.txt"
    # On the wire (envd 0.6): the target's type, with the link marked as a link.
    for name, kind in [("file-link", "FILE_TYPE_FILE"), ("dir-link", "FILE_TYPE_DIRECTORY"),
                       ("dangling", "FILE_TYPE_UNSPECIFIED")]:
        status, body = envd(server, sandbox, "POST", "/filesystem.Filesystem/Stat",
                            json.dumps({"path": f"/home/user/links/{name}"}),
                            {"Content-Type": "application/json"})
        entry = json.loads(body)["entry"]
        assert status == 200 and entry["isSymlink"] is True, entry
        assert entry.get("type", "FILE_TYPE_UNSPECIFIED") == kind, entry
        assert entry["permissions"] == "Lrwxrwxrwx", entry
    names = {e.name: e.type for e in sandbox.files.list("links")}
    assert names["file-link"] == FileType.SYMLINK and names["target.txt"] == FileType.FILE
    # The SDK leaves out entries of unknown type, so a dangling link, as with E2B's envd.
    assert "dangling" not in names, names


def test_watch_events_carry_entries(sandbox):
    sandbox.files.make_dir("watched")
    handle = sandbox.files.watch_dir("watched", include_entry=True)
    try:
        sandbox.files.write("watched/new.txt", "hello", metadata={"k": "v"})
        deadline, events = time.monotonic() + 10, []
        while time.monotonic() < deadline and not any(e.entry for e in events):
            events += handle.get_new_events()
            time.sleep(0.2)
    finally:
        handle.stop()
    with_entry = [e for e in events if e.entry and e.name == "new.txt"]
    assert with_entry, events
    entry = with_entry[-1].entry
    assert entry.path == "/home/user/watched/new.txt" and entry.type == FileType.FILE
    assert entry.owner == "user"


def test_async_watch_events_carry_entries(sandbox):
    async def run():
        sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
        await sbx.files.make_dir("awatched")
        events = []
        handle = await sbx.files.watch_dir("awatched", events.append, include_entry=True)
        await sbx.files.write("awatched/a.txt", "12345")
        await sbx.files.remove("awatched/a.txt")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                e.type == FilesystemEventType.REMOVE for e in events):
            await asyncio.sleep(0.2)
        await handle.stop()
        return events
    events = asyncio.run(run())
    written = [e for e in events if e.type == FilesystemEventType.WRITE and e.entry]
    assert written and written[-1].entry.name == "a.txt", events
    # A removed entry has no info to give.
    removed = [e for e in events if e.type == FilesystemEventType.REMOVE]
    assert removed and removed[-1].entry is None, events


def test_metadata_and_entries_from_node(server, sandbox):
    js = """
      import { Sandbox } from 'e2b'
      const sbx = await Sandbox.connect(process.argv[1])
      const w = await sbx.files.write('node/m.txt', 'hi', { metadata: { From: 'node' } })
      const info = await sbx.files.getInfo('node/m.txt')
      const events = []
      const handle = await sbx.files.watchDir('node', e => events.push(e), { includeEntry: true })
      await sbx.files.write('node/n.txt', 'there')
      const written = () => events.find(e => e.type === 'write' && e.entry)
      for (let i = 0; i < 50 && !written(); i++) await new Promise(r => setTimeout(r, 200))
      await handle.stop()
      const entry = written()?.entry
      console.log(JSON.stringify({ written: w.metadata, info: info.metadata,
                                   entry: entry && { name: entry.name, size: entry.size } }))
    """
    got = server.js(js, sandbox.sandbox_id)
    assert got["written"] == {"from": "node"} and got["info"] == {"from": "node"}, got
    assert got["entry"] == {"name": "n.txt", "size": 5}, got


def test_streams_that_cannot_start_say_why_as_envd_does(server, sandbox):
    # envd answers a stream it cannot start with the error at the stream's end (HTTP 200), so
    # the SDKs see its code: not found, where an HTTP 404 reads as "unimplemented".
    js = """
      import { Sandbox } from 'e2b'
      const sbx = await Sandbox.connect(process.argv[1])
      const outcome = async (call) => {
        try { await call(); return 'no error' } catch (e) { return `${e.name}: ${e.message}` }
      }
      console.log(JSON.stringify({
        watch: await outcome(() => sbx.files.watchDir('/no/such/dir', () => {})),
        connect: await outcome(() => sbx.commands.connect(999999)),
        cwd: await outcome(() => sbx.commands.run('pwd', { cwd: '/no/such/dir' })),
        control: await outcome(() => sbx.files.read('/no/such/file')),
      }))
    """
    got = server.js(js, sandbox.sandbox_id)
    assert got["control"].startswith("FileNotFoundError"), got  # what the SDK says for a file
    assert got["watch"].startswith("FileNotFoundError") and "/no/such/dir" in got["watch"], got
    assert got["connect"].startswith("NotFoundError"), got
    assert "does not exist" in got["cwd"] and "unimplemented" not in got["cwd"], got

    async def watch_missing():
        sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
        with pytest.raises(NotFoundException):
            await sbx.files.watch_dir("/no/such/dir", lambda e: None)

    asyncio.run(watch_missing())
