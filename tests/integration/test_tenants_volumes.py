"""Tenants and volumes (issue 31): one key's volume cannot take the server down, nor fill the
host's disk. A path deeper or longer than the caps is refused at the edge; a tree planted deeper
than any cap by a sandbox is removed without recursion and without following its links; each key
is held to a number of volumes and to a total size, and a volume the disk cannot hold is refused."""

import os
import shutil
import urllib.request
import uuid

import pytest
from e2b import Sandbox, Volume

from conftest import airlock_key, volume_name

# The caps docs/design.md documents for volume paths.
MAX_DEPTH = 128
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


@pytest.fixture
def alive(server):
    """`alive()` says whether the server still runs and answers; a test that brought it down
    leaves it started again for the tests after it."""

    def check():
        if server.proc is None or server.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
                return r.status == 200
        except OSError:
            return False

    yield check
    if not check():
        server.stop()
        server.start()


def content(server, vol, method, route, path, extra=""):
    """A raw volume content API call with the volume's token; returns (status, body)."""
    return server.api(method, f"/volumecontent/{vol.volume_id}/{route}?path={path}{extra}",
                      key=None, headers={"Authorization": f"Bearer {vol.token}"})


def test_a_deep_make_dir_is_refused_and_the_server_stays_up(server, volume, other_key, alive):
    theirs = Volume.create(volume_name(), api_key=other_key)
    try:
        theirs.write_file("data.txt", "the other key's data")

        deep = "a/" * 8000
        made = content(server, volume, "POST", "dir", deep, "&force=true")
        # Before the caps, the tree was made, and removing it overflowed the worker's stack.
        try:
            removed = content(server, volume, "DELETE", "path", "a")
        except OSError as e:  # the connection drops if the server dies
            removed = e
        assert alive(), f"the server died: make_dir {made[0]}, delete {removed!r}"
        assert made[0] == 400 and f"{MAX_DEPTH} levels" in made[1]["message"], made
        assert not volume.exists("a"), "nothing of the refused tree is left"

        for path, cap in [("x" * (MAX_PATH_BYTES + 1), f"{MAX_PATH_BYTES} bytes"),
                          ("ok/" + "n" * (MAX_NAME_BYTES + 1), f"{MAX_NAME_BYTES} bytes"),
                          ("/".join(["b"] * (MAX_DEPTH + 1)), f"{MAX_DEPTH} levels")]:
            for method, route in [("POST", "dir"), ("PUT", "file"), ("GET", "path"),
                                  ("DELETE", "path")]:
                status, body = content(server, volume, method, route, path, "&force=true")
                assert status == 400 and cap in body["message"], (method, route, cap, body)
                assert body["code"] == 400, body
        status, body = content(server, volume, "GET", "dir", "/", f"&depth={MAX_DEPTH + 1}")
        assert status == 400 and f"{MAX_DEPTH}" in body["message"], body

        # Positive control: up to the caps works, and so does removing it.
        at_cap = "/".join(["c"] * MAX_DEPTH)
        status, body = content(server, volume, "POST", "dir", at_cap, "&force=true")
        assert status == 201 and body["path"] == "/" + at_cap, body
        long_name = "n" * MAX_NAME_BYTES
        volume.write_file(f"c/{long_name}", "long name")
        assert volume.read_file(f"c/{long_name}") == "long name"
        listed = volume.list("/", depth=MAX_DEPTH)
        assert len(listed) == MAX_DEPTH + 1 and "/" + at_cap in [e.path for e in listed]
        volume.remove("c")
        assert not volume.exists("c")

        assert theirs.read_file("data.txt") == "the other key's data"
        assert alive()
    finally:
        if alive():
            Volume.destroy(theirs.volume_id, api_key=other_key)


# Plants, in the volume mounted at /mnt/v, TOP/d/d/... LEVELS deep, with files and directories
# whose names are not UTF-8 along it. At its bottom goes a file, or, moved there, the tree JOIN
# that an earlier sandbox planted (one sandbox's gofer runs out of descriptors near 20,000
# levels); then a relative link at TOP/d/d/d to `keepdir`, a sibling of TOP, which a removal
# that followed links would empty.
PLANT = r"""
import os, sys
top, levels, join = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
os.chdir("/mnt/v")
os.mkdir(top)
os.chdir(top)
for i in range(levels):
    if i % 2500 == 1:
        with open(b"\xff\xfe-file", "w") as f:
            f.write("not utf-8")
        os.mkdir(b"\xff-dir")
        os.mkdir(b"\xff-dir/\xfe\xfd")
    os.mkdir("d")
    os.chdir("d")
if join:
    os.rename("/mnt/v/" + join[0], "d")
    os.symlink("../../../../keepdir", f"/mnt/v/{top}/d/d/d/link")
else:
    with open("bottom", "w") as f:
        f.write("the bottom")
print("planted", levels)
"""


def host_depth(top):
    """How many `d` deep the tree at `top` goes, walked on the host by descriptors."""
    fd, levels = os.open(top, os.O_RDONLY | os.O_DIRECTORY), 0
    try:
        while True:
            try:
                deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return levels
            os.close(fd)
            fd, levels = deeper, levels + 1
    finally:
        os.close(fd)


def test_a_tree_a_sandbox_planted_deeper_than_any_cap_is_removed(server, volume, alive):
    volume.write_file("keep.txt", "a sibling")
    volume.write_file("keepdir/file", "behind a link", force=True)
    for args in ["lower 10000", "deep 10000 lower"]:
        sbx = Sandbox.create("base", volume_mounts={"/mnt/v": volume})
        try:
            sbx.files.write("/tmp/plant.py", PLANT)
            out = sbx.commands.run(f"python3 /tmp/plant.py {args}", timeout=300)
            assert out.stdout.strip() == "planted 10000", out
        finally:
            sbx.kill()
    # Positive control: the link leads to keepdir, so following it reaches the file.
    sbx = Sandbox.create("base", volume_mounts={"/mnt/v": volume})
    try:
        assert sbx.commands.run("cat /mnt/v/deep/d/d/d/link/file").stdout == "behind a link"
    finally:
        sbx.kill()
    host_root = server.data_dir / "volumes" / volume.volume_id
    assert host_depth(host_root / "deep") == 20_001

    failure = None
    try:
        volume.remove("deep")
    except Exception as e:  # the connection drops if the server dies
        failure = e
    assert alive(), f"the server died removing the tree: {failure!r}"
    assert failure is None, failure
    assert not volume.exists("deep"), "the tree is gone"
    assert volume.read_file("keep.txt") == "a sibling"
    assert volume.read_file("keepdir/file") == "behind a link", "the link was not followed"
    assert sorted(e.path for e in volume.list("/", depth=2)) == \
        ["/keep.txt", "/keepdir", "/keepdir/file"]
    # Nothing the removal moved aside is left behind either.
    assert sorted(p.name for p in host_root.iterdir()) == ["keep.txt", "keepdir"]


def test_names_that_are_not_utf8_are_listed_and_removed(server, volume, alive):
    sbx = Sandbox.create("base", volume_mounts={"/mnt/v": volume})
    try:
        sbx.files.write("/tmp/odd.py", "import os\n"
                        "os.makedirs(b'/mnt/v/odd/\\xff-dir/\\xfe')\n"
                        "open(b'/mnt/v/odd/\\xff\\xfe-file', 'w').write('x')\n"
                        "os.symlink('..', b'/mnt/v/odd/\\xff-dir/up')\n")
        sbx.commands.run("python3 /tmp/odd.py")
        assert sbx.commands.run("ls /mnt/v/odd | wc -l").stdout.strip() == "2"
    finally:
        sbx.kill()
    listed = volume.list("odd", depth=3)
    kinds = sorted(e.type for e in listed)
    assert kinds == ["directory", "directory", "file", "symlink"], listed
    volume.remove("odd")
    assert alive() and not volume.exists("odd")


def test_each_key_is_held_to_a_number_of_volumes_and_a_total_size(server, restarted, other_key):
    mine = airlock_key(server, "create", "--name", f"vols-{uuid.uuid4().hex[:6]}")
    made = []

    def create(key):
        status, body = server.api("POST", "/volumes", {"name": volume_name()}, key=key)
        if status == 201:
            made.append((body["volumeID"], key))
        return status, body

    try:
        restarted("--volume-size-mb", "8", "--key-max-volumes", "2")
        # Positive control: up to the cap works.
        assert [create(mine)[0] for _ in range(2)] == [201, 201]
        status, body = create(mine)
        assert status == 429 and body["code"] == 429, body
        assert "2 volumes" in body["message"] and "--key-max-volumes" in body["message"], body
        # The cap is each key's: another key still makes one.
        assert create(other_key)[0] == 201

        restarted("--volume-size-mb", "8", "--key-max-volumes", "10", "--key-max-volume-mb", "20")
        status, body = create(mine)
        assert status == 507 and body["code"] == 507, body
        assert "20 MiB" in body["message"] and "--key-max-volume-mb" in body["message"], body
        # With room for it again, the same create works.
        volume_id, key = made.pop(0)
        assert Volume.destroy(volume_id, api_key=key) is True
        assert create(mine)[0] == 201

        # A volume larger than the free disk is refused; nothing is left of it.
        free_mb = shutil.disk_usage(server.data_dir).free >> 20
        restarted("--volume-size-mb", str(free_mb + 10_240), "--key-max-volume-mb", str(1 << 40))
        before = sorted(p.name for p in (server.data_dir / "volumes").iterdir())
        status, body = create(other_key)
        assert status == 507 and "free" in body["message"], body
        assert sorted(p.name for p in (server.data_dir / "volumes").iterdir()) == before
    finally:
        for volume_id, key in made:
            Volume.destroy(volume_id, api_key=key)
