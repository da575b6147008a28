"""The host's side of Airlock against clients without a key and against the host's own users:
the API port's bounds (idle and slow connections, oversized heads and bodies, the connection
cap), uploads refused before they are read, a data dir that is not the server's own, and the
host's forwarding switch given back at a clean shutdown."""

import http.client
import json
import os
import resource
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from conftest import AIRLOCK

HEAD_TIMEOUT = 30  # listen.rs
MAX_CONNECTIONS = 4096  # listen.rs


def closed_within(sock, seconds):
    """Whether the server closes `sock` within `seconds` (reading nothing else)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def health(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return s.recv(64).startswith(b"HTTP/1.1 200")


def test_silent_and_slow_clients_are_cut_off(server):
    silent = socket.create_connection(("127.0.0.1", server.port))
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.sendall(b"GET /health HTTP/1.1\r\n")  # and never the rest
    idle = http.client.HTTPConnection("127.0.0.1", server.port)
    idle.request("GET", "/health")
    assert idle.getresponse().read() == b"ok"
    assert health(server), "the server answers others meanwhile"
    t0 = time.monotonic()
    for sock in (silent, slow, idle.sock):
        assert closed_within(sock, HEAD_TIMEOUT + 15), "the connection was held open"
    assert time.monotonic() - t0 >= HEAD_TIMEOUT - 5, "closed by the timeout, not at once"


def test_oversized_heads_and_bodies_are_refused(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (128 * 1024) + b"\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 431")
    status, body = server.api("POST", "/v2/sandboxes", raw=b'{"templateID": "' + b"a" * (2 << 20) + b'"}')
    assert status == 413 and body["code"] == 413, body
    assert health(server)


def test_the_connection_cap_holds_and_lets_go(server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Enough sockets for the test (the suite runs as root, which may raise its hard limit).
    enough = max(hard, MAX_CONNECTIONS + 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (enough, enough))
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", server.port)))
        # Every one of them was taken: the server answers on the last one.
        held[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        held[-1].settimeout(10)
        assert held[-1].recv(64).startswith(b"HTTP/1.1 200")
        extra = socket.create_connection(("127.0.0.1", server.port))
        assert closed_within(extra, 10), "one over the cap is closed at once"
        extra.close()
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for _ in range(50):
        try:
            if health(server):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not come back after the connections closed")


def upload_until_answered(server, sandbox_id, token, total):
    """POSTs `total` bytes to /files in a sandbox as fast as the server takes them; returns
    (bytes sent, status or None if the connection broke first)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.putrequest("POST", "/files?path=/tmp/big.bin")
    for k, v in {"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token,
                 "Content-Type": "application/octet-stream", "Content-Length": str(total)}.items():
        conn.putheader(k, v)
    conn.endheaders()
    chunk, sent = b"\0" * (1 << 20), 0
    try:
        while sent < total:
            conn.send(chunk)
            sent += len(chunk)
        return sent, conn.getresponse().status
    except OSError:
        return sent, None
    finally:
        conn.close()


def test_a_refused_upload_is_not_read(server, sandbox):
    total = 512 << 20
    # The control: with its token the same upload is read to the end and stored.
    sent, status = upload_until_answered(server, sandbox.sandbox_id, sandbox._envd_access_token, total)
    assert (sent, status) == (total, 200)
    sandbox.commands.run("rm /tmp/big.bin")
    sent, status = upload_until_answered(server, sandbox.sandbox_id, "wrong-token", total)
    assert status in (401, None) and sent < total // 4, (sent, status)
    assert sandbox.commands.run("echo fine").stdout == "fine\n"


def airlock(*args, data_dir, env=None):
    return subprocess.run([str(AIRLOCK), "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_a_missing_or_old_runsc_is_refused_with_what_to_install(server, tmp_path):
    missing = airlock("serve", "--listen", "127.0.0.1:1", "--runsc", "/nonexistent/runsc",
                      data_dir=tmp_path / "a")
    assert missing.returncode == 1, missing.stderr
    assert "/nonexistent/runsc" in missing.stderr and "bookworm-backports" in missing.stderr

    old = tmp_path / "old-runsc"
    old.write_text("#!/bin/sh\necho 'runsc version 0.0~20200101.0'\necho 'spec: 1.0.2'\n")
    old.chmod(0o755)
    refused = airlock("serve", "--listen", "127.0.0.1:1", "--runsc", str(old), data_dir=tmp_path / "b")
    assert refused.returncode == 1, refused.stderr
    assert "older than the oldest release" in refused.stderr and "--runsc" in refused.stderr

    not_runsc = airlock("serve", "--listen", "127.0.0.1:1", "--runsc", "/bin/true", data_dir=tmp_path / "c")
    assert not_runsc.returncode == 1 and "does not look like runsc" in not_runsc.stderr


def test_logs_come_as_json_when_asked_at_the_level_rust_log_names(server, tmp_path):
    """A second server (refused: this host has one) logs what it found first."""
    env = {k: v for k, v in os.environ.items() if k not in ("AIRLOCK_LOG", "RUST_LOG")}
    second = airlock("--log-format", "json", "serve", "--listen", "127.0.0.1:1",
                     data_dir=tmp_path / "d", env=env)
    assert second.returncode == 1 and "only one server per host" in second.stderr
    lines = [json.loads(line) for line in second.stderr.splitlines() if line.startswith("{")]
    found = [line for line in lines if line["fields"].get("message") == "runsc found"]
    assert found and found[0]["level"] == "INFO" and found[0]["fields"]["version"].startswith("runsc version")

    quiet = airlock("--log-format", "json", "serve", "--listen", "127.0.0.1:1",
                    data_dir=tmp_path / "e", env=dict(env, RUST_LOG="warn"))
    assert quiet.returncode == 1
    assert "runsc found" not in quiet.stderr, "RUST_LOG=warn leaves info out"


def test_a_data_dir_others_can_change_is_refused(server):
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        mine = Path(tmp) / "mine"
        # The control: a fresh private dir is made and used.
        ok = airlock("key", "ls", data_dir=mine)
        assert ok.returncode == 0, ok.stderr
        assert oct((mine / "airlock.db").stat().st_mode & 0o777) == "0o600"
        assert oct(mine.stat().st_mode & 0o777) == "0o700"

        shared = Path(tmp) / "shared"
        shared.mkdir(mode=0o777)
        os.chmod(shared, 0o777)
        refused = airlock("key", "ls", data_dir=shared)
        assert refused.returncode == 1 and "can be written by other users" in refused.stderr
        refused = airlock("key", "ls", data_dir=shared / "below")
        assert refused.returncode == 1 and "another user can change" in refused.stderr

        theirs = Path(tmp) / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        refused = airlock("serve", "--listen", "127.0.0.1:1", data_dir=theirs)
        assert refused.returncode == 1 and "owned by uid 65534" in refused.stderr, refused.stderr


def ip_forward():
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


RECORD = Path("/run/airlock/ip_forward.before")


def test_the_forwarding_switch_is_given_back(server):
    # What the host had before this run's server turned forwarding on (if it did).
    original = RECORD.read_text().strip() if RECORD.exists() else ip_forward()
    assert ip_forward() == "1", "sandboxes need it on while the server runs"
    rules = subprocess.run(["nft", "list", "chain", "inet", "airlock", "forward"],
                           capture_output=True, text=True).stdout
    if original == "0":
        assert 'iifname != "alv*" drop' in rules, "only sandbox traffic is forwarded"
    else:
        assert 'iifname != "alv*" return' in rules, "the host's own forwarding is left alone"
    # Two starts in a row (the second finds forwarding on) and then a clean stop.
    server.stop()
    server.start()
    assert ip_forward() == "1"
    server.stop()
    try:
        assert ip_forward() == original
        assert not RECORD.exists()
    finally:
        server.start()
