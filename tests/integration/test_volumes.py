"""Volumes through the stock SDK: `Volume.create/list/get_info/destroy` with the API key, and a
volume's files through the volume content API with the volume's own token
(`E2B_VOLUME_API_URL` points at Airlock's one port)."""

import os
import uuid

import pytest
from e2b import CommandExitException, Sandbox, Volume
from e2b.exceptions import NotFoundException

from conftest import volume_name


def test_a_volume_is_created_listed_and_destroyed(server):
    name = volume_name()
    vol = Volume.create(name)
    assert vol.name == name and vol.volume_id and vol.token
    assert (vol.volume_id, name) in [(v.volume_id, v.name) for v in Volume.list()]
    info = Volume.get_info(vol.volume_id)
    assert info.name == name and info.token == vol.token

    status, body = server.api("GET", "/volumes", key=None)
    assert status == 401, body
    status, body = server.api("POST", "/volumes", {"name": name})
    assert status == 409 and "exists already" in body["message"], body
    status, body = server.api("POST", "/volumes", {"name": "Not/A Name"})
    assert status == 400 and "invalid volume name" in body["message"], body

    assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    assert vol.volume_id not in [v.volume_id for v in Volume.list()]
    with pytest.raises(NotFoundException):
        Volume.get_info(vol.volume_id)


def test_files_round_trip_with_directories_and_metadata(volume):
    volume.make_dir("data/raw", force=True)
    written = volume.write_file("data/raw/a.csv", "x,y\n1,2\n")
    assert written.path == "/data/raw/a.csv" and written.size == 8 and written.type == "file"
    assert written.uid == 1000 and written.gid == 1000, "new entries belong to the sandbox user"
    assert volume.read_file("data/raw/a.csv") == "x,y\n1,2\n"
    assert volume.read_file("data/raw/a.csv", format="bytes") == b"x,y\n1,2\n"

    binary = os.urandom(3 * 1024 * 1024 + 7)
    volume.write_file("blob.bin", binary, mode=0o600)
    assert volume.read_file("blob.bin", format="bytes") == binary
    assert volume.get_info("blob.bin").mode == 0o600

    # A file written again is replaced.
    volume.write_file("data/raw/a.csv", "replaced")
    assert volume.read_file("data/raw/a.csv") == "replaced"

    top = {e.path: e.type for e in volume.list("/")}
    assert top == {"/blob.bin": "file", "/data": "directory"}, top
    deep = [e.path for e in volume.list("/", depth=3)]
    assert deep == ["/blob.bin", "/data", "/data/raw", "/data/raw/a.csv"], deep

    changed = volume.update_metadata("blob.bin", mode=0o644, uid=0)
    assert changed.mode == 0o644 and changed.uid == 0
    assert volume.exists("data/raw/a.csv") and not volume.exists("nope.txt")

    volume.remove("data")
    assert not volume.exists("data/raw/a.csv") and not volume.exists("data")
    assert [e.path for e in volume.list("/")] == ["/blob.bin"]


def test_bad_paths_and_missing_entries_are_clear_errors(server, volume):
    headers = {"Authorization": f"Bearer {volume.token}"}
    base = f"/volumecontent/{volume.volume_id}"

    def call(method, route, path, body=None):
        query = "" if path is None else f"?path={path}"
        return server.api(method, f"{base}/{route}{query}", body, key=None, headers=headers)

    status, body = call("GET", "path", "nope.txt")
    assert status == 404 and "not found" in body["message"], body
    status, body = call("GET", "file", "../../etc/passwd")
    assert status == 400 and "'..'" in body["message"], body
    status, body = call("GET", "path", None)
    assert status == 400 and "path" in body["message"], body
    status, body = call("DELETE", "path", "/")
    assert status == 400 and "root" in body["message"], body
    status, body = call("POST", "dir", "a/b/c")
    assert status == 404, body
    status, body = call("POST", "dir", "a")
    assert status == 201, body
    status, body = call("POST", "dir", "a")
    assert status == 409 and "exists already" in body["message"], body
    status, body = call("GET", "file", "a")
    assert status == 400 and "is a directory" in body["message"], body
    for depth in ["x", "0"]:
        status, body = call("GET", "dir", f"/&depth={depth}")
        assert status == 400 and "depth" in body["message"], (depth, body)


def test_a_volume_is_its_keys_alone_and_its_token_guards_its_files(server, volume, other_key):
    # Another key does not see it, cannot read its token, and cannot delete it.
    assert volume.volume_id not in [v.volume_id for v in Volume.list(api_key=other_key)]
    with pytest.raises(NotFoundException):
        Volume.get_info(volume.volume_id, api_key=other_key)
    assert Volume.destroy(volume.volume_id, api_key=other_key) is False

    volume.write_file("secret.txt", "mine")
    # The content API wants this volume's token: none, a wrong one, or another volume's is 401.
    other = Volume.create(volume_name(), api_key=other_key)
    try:
        path = f"/volumecontent/{volume.volume_id}/file?path=secret.txt"
        for headers in [{}, {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Bearer {other.token}"}]:
            status, body = server.api("GET", path, key=None, headers=headers)
            assert status == 401 and "token" in body["message"], (headers, body)
        # Positive control: with its own token, the file reads.
        assert volume.read_file("secret.txt") == "mine"
    finally:
        Volume.destroy(other.volume_id, api_key=other_key)


def test_symlinks_cannot_lead_out_of_the_volume(server, volume):
    """A sandbox that mounts a volume can plant any symlink in it; the server, which runs as
    root, must resolve it inside the volume. The link is planted on the host here, as a mount
    would leave it."""
    volume.write_file("inside.txt", "inside")
    root = server.data_dir / "volumes" / volume.volume_id
    secret = server.data_dir / f"outside-{uuid.uuid4().hex[:6]}.txt"
    secret.write_text("host secret")
    try:
        os.symlink(str(secret), root / "escape")
        os.symlink("../../..", root / "up")
        os.symlink("/inside.txt", root / "absolute-inside")
        # Positive control: the host itself follows the link to the secret.
        assert (root / "escape").read_text() == "host secret"

        # Through the volume, `/` is the volume's root: the links lead nowhere outside it.
        with pytest.raises(NotFoundException):
            volume.read_file("escape")
        assert volume.read_file("absolute-inside") == "inside"
        with pytest.raises(NotFoundException):
            volume.read_file(f"up/{secret.name}")
        info = volume.get_info("escape")
        assert info.type == "symlink" and info.target == str(secret)
        # Writing through the link replaces the link; the host file is untouched.
        volume.write_file("escape", "overwritten")
        assert secret.read_text() == "host secret"
        status, body = server.api("PATCH", f"/volumecontent/{volume.volume_id}/path?path=absolute-inside",
                                  {"mode": 0o777}, key=None,
                                  headers={"Authorization": f"Bearer {volume.token}"})
        assert status == 400 and "symlink" in body["message"], body
        volume.remove("up")
        assert secret.exists() and (server.data_dir / "volumes").exists()
    finally:
        secret.unlink()


def test_the_size_limit_holds_for_uploads_and_for_sandboxes(server, restarted):
    restarted("--volume-size-mb", "8")
    vol = Volume.create(volume_name())
    try:
        vol.write_file("keep.bin", b"k" * (1024 * 1024))
        status, body = server.api("PUT", f"/volumecontent/{vol.volume_id}/file?path=keep.bin",
                                  key=None, raw=b"x" * (12 * 1024 * 1024),
                                  headers={"Authorization": f"Bearer {vol.token}"})
        assert status == 507 and "8 MB" in body["message"], body
        assert vol.read_file("keep.bin", format="bytes") == b"k" * (1024 * 1024)
        assert [e.path for e in vol.list("/")] == ["/keep.bin"], "no partial upload is left"

        # A sandbox that mounts it is held to the same size.
        sbx = Sandbox.create("base", volume_mounts={"/mnt/v": vol})
        try:
            out = sbx.commands.run("dd if=/dev/zero of=/mnt/v/fill bs=1M count=20",
                                   timeout=120)
        except CommandExitException as e:
            out = e
        assert out.exit_code != 0 and "No space left on device" in out.stderr, out.stderr
        assert sbx.commands.run("echo still-here").stdout == "still-here\n"
        sbx.kill()
        assert vol.read_file("keep.bin", format="bytes") == b"k" * (1024 * 1024)
    finally:
        Volume.destroy(vol.volume_id)
