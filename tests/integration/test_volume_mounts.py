"""Volumes mounted in sandboxes (`Sandbox.create(volume_mounts={path: volume})`): the files are
the volume's, shared by every sandbox that mounts it and by the volume content API, kept when the
sandboxes go, through pauses and in snapshots' sandboxes, and held to the volume's size."""

import asyncio
import time

import pytest
from e2b import AsyncSandbox, AsyncVolume, CommandExitException, Sandbox, Volume
from e2b.exceptions import SandboxException

from conftest import host_leftovers, volume_name


def test_a_volume_is_shared_by_its_sandboxes_and_outlives_them(server, volume):
    volume.write_file("from-api.txt", "written through the content API")
    a = Sandbox.create("base", volume_mounts={"/mnt/data": volume})
    b = Sandbox.create("base", volume_mounts={"/home/user/shared": volume.name})
    try:
        assert a.commands.run("cat /mnt/data/from-api.txt").stdout == \
            "written through the content API"
        # The sandbox's default user owns the volume's root and writes to it.
        a.commands.run("echo from-a > /mnt/data/a.txt && mkdir -p /mnt/data/dir")
        assert b.files.read("/home/user/shared/a.txt") == "from-a\n"
        assert volume.read_file("a.txt") == "from-a\n"
        assert sorted(e.name for e in b.files.list("/home/user/shared")) == \
            ["a.txt", "dir", "from-api.txt"]
        # Changes from the content API show at once in a running sandbox.
        volume.write_file("later.txt", "later")
        assert a.files.read("/mnt/data/later.txt") == "later"
        assert a.get_info().volume_mounts == [{"name": volume.name, "path": "/mnt/data"}]

        # The volume's files are not the sandbox's disk: its own files stay its own.
        a.files.write("/home/user/own.txt", "a's own")
        assert not b.files.exists("/home/user/own.txt")

        # A volume in use is not deleted under its sandboxes.
        status, body = server.api("DELETE", f"/volumes/{volume.volume_id}")
        assert status == 409, body
        assert a.sandbox_id in body["message"] or b.sandbox_id in body["message"], body
    finally:
        a.kill()
        b.kill()
    assert volume.read_file("a.txt") == "from-a\n", "the files outlive the sandboxes"
    assert volume.get_info("dir").type == "directory"
    # The host lets go of the volume once the sandboxes are torn down.
    ids = (a.sandbox_id, b.sandbox_id)
    deadline = time.monotonic() + 30
    while [m for m in host_leftovers(server.data_dir)["mounts"] if any(i in m for i in ids)]:
        assert time.monotonic() < deadline, host_leftovers(server.data_dir)["mounts"]
        time.sleep(0.2)


def test_mounts_survive_pause_resume_and_snapshots(server):
    volume = Volume.create(volume_name())
    sbx = Sandbox.create("base", volume_mounts={"/data": volume})
    copy = None
    try:
        sbx.files.write("/data/before.txt", "before the pause")
        sbx.pause()
        # A paused sandbox still holds its volume.
        status, body = server.api("DELETE", f"/volumes/{volume.volume_id}")
        assert status == 409 and sbx.sandbox_id in body["message"], body
        volume.write_file("while-paused.txt", "while paused")
        sbx = Sandbox.connect(sbx.sandbox_id)
        assert sbx.files.read("/data/before.txt") == "before the pause"
        assert sbx.files.read("/data/while-paused.txt") == "while paused"
        sbx.files.write("/data/after.txt", "after the resume")
        assert volume.read_file("after.txt") == "after the resume"

        # A snapshot holds where the volume is mounted, not its files: its sandboxes see the
        # volume as it is now.
        snap = sbx.create_snapshot()
        volume.write_file("after-snapshot.txt", "after the snapshot")
        copy = Sandbox.create(snap.snapshot_id)
        assert copy.files.read("/data/after-snapshot.txt") == "after the snapshot"
        copy.files.write("/data/from-copy.txt", "from the copy")
        assert sbx.files.read("/data/from-copy.txt") == "from the copy"
        assert copy.get_info().volume_mounts == [{"name": volume.name, "path": "/data"}]
        status, body = server.api("POST", "/v2/sandboxes", {
            "templateID": snap.snapshot_id,
            "volumeMounts": [{"name": volume.name, "path": "/other"}]})
        assert status == 400 and "snapshot's volumes" in body["message"], body
        copy.kill()
        copy = None
        sbx.kill()

        # With the volume gone, its snapshot cannot start a sandbox.
        assert Volume.destroy(volume.volume_id) is True
        status, body = server.api("POST", "/v2/sandboxes", {"templateID": snap.snapshot_id})
        assert status == 404 and volume.name in body["message"], body
        Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        for s in (copy, sbx):
            if s is not None:
                try:
                    s.kill()
                except Exception:
                    pass
        Volume.destroy(volume.volume_id)


def test_bad_mounts_are_refused_and_leave_no_sandbox(server, volume, other_key):
    theirs = Volume.create(volume_name(), api_key=other_key)
    try:
        before = {s.sandbox_id for s in Sandbox.list().next_items()}
        with pytest.raises(SandboxException, match="404: volume 'no-such-volume' not found"):
            Sandbox.create("base", volume_mounts={"/mnt/x": "no-such-volume"})
        # Another key's volume is not found, exactly as a missing one.
        with pytest.raises(SandboxException, match=f"404: volume '{theirs.name}' not found"):
            Sandbox.create("base", volume_mounts={"/mnt/x": theirs.name})
        for mounts, problem in [
            ([{"name": volume.name, "path": "relative"}], "absolute"),
            ([{"name": volume.name, "path": "/"}], "root"),
            ([{"name": volume.name, "path": "/mnt/../etc"}], "plain path"),
            ([{"name": volume.name, "path": "/proc/x"}], "system"),
            ([{"name": volume.name, "path": "/opt/airlock"}], "system"),
            ([{"name": volume.name, "path": "/a"}, {"name": volume.name, "path": "/a/"}],
             "two volumes"),
            ([{"name": volume.name, "path": f"/m{i}"} for i in range(9)], "at most 8"),
        ]:
            status, body = server.api("POST", "/v2/sandboxes",
                                      {"templateID": "base", "volumeMounts": mounts})
            assert status == 400 and problem in body["message"], (mounts, body)
        # A path the template has as a file is found out inside the sandbox.
        status, body = server.api("POST", "/v2/sandboxes", {
            "templateID": "base", "volumeMounts": [{"name": volume.name, "path": "/etc/passwd"}]})
        assert status == 400 and "is not a directory" in body["message"], body
        assert {s.sandbox_id for s in Sandbox.list().next_items()} == before
        # Positive control: the same volume at a good path mounts.
        sbx = Sandbox.create("base", volume_mounts={"/mnt/x": volume})
        assert sbx.commands.run("ls /mnt/x").exit_code == 0
        sbx.kill()
    finally:
        Volume.destroy(theirs.volume_id, api_key=other_key)


def test_node_sdk_mounts_a_volume(server, volume):
    js = """
    import { Sandbox, Volume } from 'e2b'
    const volume = await Volume.getInfo(process.argv[1])
    const sbx = await Sandbox.create('base', { volumeMounts: { '/mnt/v': volume } })
    await sbx.files.write('/mnt/v/from-node.txt', 'from node')
    const info = await sbx.getInfo()
    await sbx.kill()
    console.log(JSON.stringify({ mounts: info.volumeMounts }))
    """
    got = server.js(js, volume.volume_id)
    assert got == {"mounts": [{"name": volume.name, "path": "/mnt/v"}]}, got
    assert volume.read_file("from-node.txt") == "from node"


def test_the_hub_cannot_be_written_even_by_root(server, volume):
    """Every sandbox has the volumes' hub at /opt/airlock, a host directory: a write there
    would land on the host's disk outside any limit, and one to the agent would replace it."""
    sbx = Sandbox.create("base", volume_mounts={"/mnt/v": volume})
    try:
        script = ("for f in /opt/airlock/planted /opt/airlock/volumes/planted "
                  "/opt/airlock/airlock-agent /mnt/v/planted /opt/planted; do "
                  "if (echo x > $f) 2>/dev/null; then echo \"$f written\"; "
                  "else echo \"$f refused\"; fi; done")
        out = sbx.commands.run(script, user="root").stdout.splitlines()
        assert out == [
            "/opt/airlock/planted refused",
            "/opt/airlock/volumes/planted refused",
            "/opt/airlock/airlock-agent refused",
            # Positive controls: root writes to the volume and to its own disk.
            "/mnt/v/planted written",
            "/opt/planted written",
        ], out
        with pytest.raises(CommandExitException, match="Read-only file system"):
            sbx.commands.run("sudo mkdir /opt/airlock/d")
    finally:
        sbx.kill()
    assert volume.read_file("planted") == "x\n"


def test_async_sdk_mounts_a_volume(server):
    async def main():
        vol = await AsyncVolume.create(volume_name())
        try:
            await vol.write_file("in.txt", "from the async content API")
            sbx = await AsyncSandbox.create("base", volume_mounts={"/mnt/a": vol})
            try:
                seen = (await sbx.commands.run("cat /mnt/a/in.txt")).stdout
                await sbx.files.write("/mnt/a/out.txt", "from the async sandbox")
            finally:
                await sbx.kill()
            return seen, await vol.read_file("out.txt")
        finally:
            await AsyncVolume.destroy(vol.volume_id)

    assert asyncio.run(main()) == ("from the async content API", "from the async sandbox")
