"""Files through the stock SDK: write, read, list, exists, rename, remove, make_dir, watch, and
a 40 MiB round trip."""

import hashlib
import os
import time

import pytest
from e2b import FileType, NotFoundException


def test_write_read_list_exists(sandbox):
    info = sandbox.files.write("notes/a.txt", "alpha")
    assert info.path == "/home/user/notes/a.txt"
    assert sandbox.files.read("notes/a.txt") == "alpha"
    assert sandbox.files.read("/home/user/notes/a.txt", format="bytes") == b"alpha"
    assert sandbox.files.exists("notes/a.txt")
    assert not sandbox.files.exists("notes/nope.txt")
    entries = sandbox.files.list("notes")
    assert [(e.name, e.type) for e in entries] == [("a.txt", FileType.FILE)]
    # Written files belong to the sandbox user, like the rest of their home.
    assert sandbox.commands.run("stat -c %U notes/a.txt").stdout == "user\n"


def test_make_dir_rename_remove(sandbox):
    assert sandbox.files.make_dir("d1/d2") is True
    assert sandbox.files.make_dir("d1/d2") is False
    sandbox.files.write("d1/d2/f", "x")
    moved = sandbox.files.rename("d1/d2/f", "d1/g")
    assert moved.path == "/home/user/d1/g"
    assert sandbox.files.read("d1/g") == "x"
    sandbox.files.remove("d1")
    assert not sandbox.files.exists("d1")


def test_get_info(sandbox):
    sandbox.files.write("info.txt", "12345")
    info = sandbox.files.get_info("info.txt")
    assert info.size == 5
    assert info.type == FileType.FILE
    assert info.permissions == "-rw-r--r--"
    assert info.owner == "user"


def test_pseudo_files_read_to_their_end(sandbox):
    # /proc reports a size of 0 for files that hold text; E2B reads them to their end (its
    # filesystem-only pause tests read boot_id this way).
    shown = sandbox.commands.run("cat /proc/sys/kernel/random/boot_id").stdout
    assert len(shown.strip()) == 36  # the control: the file does hold a UUID
    assert sandbox.files.read("/proc/sys/kernel/random/boot_id") == shown
    assert sandbox.files.get_info("/proc/sys/kernel/random/boot_id").size == 0
    # An empty file is still empty; other pseudo-files read whole too.
    sandbox.files.write("empty.txt", "")
    assert sandbox.files.read("empty.txt") == ""
    assert "\nPid:" in sandbox.files.read("/proc/self/status")


def test_missing_paths_are_not_found(sandbox):
    with pytest.raises(NotFoundException):
        sandbox.files.read("/nope/missing.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.list("/nope")
    with pytest.raises(NotFoundException):
        sandbox.files.rename("/nope/a", "/tmp/b")
    with pytest.raises(NotFoundException):
        sandbox.files.get_info("/nope")


def test_watch_dir(sandbox):
    sandbox.files.make_dir("watched")
    handle = sandbox.files.watch_dir("watched")
    try:
        sandbox.files.write("watched/new.txt", "hi")
        deadline = time.monotonic() + 10
        names = set()
        while time.monotonic() < deadline and "new.txt" not in names:
            names |= {e.name for e in handle.get_new_events()}
            time.sleep(0.2)
        assert "new.txt" in names
    finally:
        handle.stop()


def test_40_mib_round_trip(sandbox):
    payload = os.urandom(40 * 1024 * 1024)
    sandbox.files.write("big.bin", payload)
    digest = sandbox.commands.run("sha256sum big.bin").stdout.split()[0]
    assert digest == hashlib.sha256(payload).hexdigest()
    back = sandbox.files.read("big.bin", format="bytes")
    assert len(back) == len(payload)
    assert hashlib.sha256(back).hexdigest() == digest


def test_two_sandboxes_cannot_see_each_others_files(sandbox_factory):
    a = sandbox_factory()
    b = sandbox_factory()
    a.files.write("/tmp/secret.txt", "only a")
    a.commands.run("echo mine > /home/user/mine.txt")
    assert not b.files.exists("/tmp/secret.txt")
    assert not b.files.exists("/home/user/mine.txt")
    assert b.commands.run("ls /tmp /home/user").stdout.count("secret") == 0
    # And neither reaches the other over the network.
    b_ip = b.commands.run("hostname -I").stdout.split()[0]
    r = a.commands.run(f"curl -s -m 3 http://{b_ip}:49983/health || echo unreachable")
    assert "unreachable" in r.stdout


def test_sandbox_cannot_open_connections_to_the_host(sandbox):
    import socket
    import threading

    # A service on the host that listens on every address, as many real ones do.
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    port = listener.getsockname()[1]
    reached = []
    threading.Thread(target=lambda: reached.append(listener.accept()), daemon=True).start()
    try:
        gateway = sandbox.commands.run("ip route | awk '/default/ {print $3}'").stdout.strip()
        assert gateway.startswith("10.77.")
        r = sandbox.commands.run(f"curl -s -m 3 http://{gateway}:{port}/ || echo blocked")
        assert "blocked" in r.stdout
        assert reached == []
    finally:
        listener.close()


def test_signed_urls_work_without_any_header_and_expire(sandbox):
    import urllib.error
    import urllib.request

    sandbox.files.write("shared.txt", "signed content")
    url = sandbox.download_url("shared.txt", use_signature_expiration=60)
    assert "signature=" in url
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == b"signed content"

    expired = sandbox.download_url("shared.txt", use_signature_expiration=-10)
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(expired, timeout=30)
    assert exc.value.code == 401
    assert b"signature is already expired" in exc.value.read()

    forged = url.replace("signature=v1_", "signature=v1_x")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(forged, timeout=30)
    assert exc.value.code == 401
