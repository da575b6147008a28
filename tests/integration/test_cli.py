"""The `airlock` CLI against the running server: create, ls with filters, info, exec exit
codes, an interactive shell on a real terminal, cp both ways, logs, pause and resume, snapshot,
kill, completions, and the errors of each."""

import json
import os
import pty
import select
import struct
import subprocess
import time
import fcntl
import termios

from e2b import Sandbox

from conftest import AIRLOCK, API_KEY


def cli(server, *args):
    return subprocess.run(
        [str(AIRLOCK), "--url", server.url, "--api-key", API_KEY, *args],
        capture_output=True, text=True, timeout=60,
    )


def test_sandbox_ls_exec_kill(server, sandbox):
    ls = cli(server, "sandbox", "ls")
    assert ls.returncode == 0
    assert ls.stdout.splitlines()[0].split() == ["ID", "STATE", "TEMPLATE", "STARTED", "EXPIRES", "METADATA"]
    assert sandbox.sandbox_id in ls.stdout

    run = cli(server, "sandbox", "exec", sandbox.sandbox_id, "--", "sh", "-c", "echo out; echo err >&2; exit 4")
    assert (run.stdout, run.stderr, run.returncode) == ("out\n", "err\n", 4)
    who = cli(server, "sandbox", "exec", "--user", "root", sandbox.sandbox_id, "--", "whoami")
    assert (who.stdout, who.returncode) == ("root\n", 0)

    assert cli(server, "sandbox", "kill", sandbox.sandbox_id).returncode == 0
    gone = cli(server, "sandbox", "kill", sandbox.sandbox_id)
    assert gone.returncode == 1 and "not found" in gone.stderr


def test_errors_have_meaningful_exit_codes(server):
    missing = cli(server, "sandbox", "exec", "nosuchsandbox", "--", "true")
    assert missing.returncode == 1 and "not found" in missing.stderr
    unreachable = subprocess.run(
        [str(AIRLOCK), "--url", "http://127.0.0.1:9", "--api-key", API_KEY, "sandbox", "ls"],
        capture_output=True, text=True, timeout=60,
    )
    assert unreachable.returncode == 3 and "cannot reach" in unreachable.stderr
    bad_key = subprocess.run(
        [str(AIRLOCK), "--url", server.url, "--api-key", "e2b_" + "0" * 40, "sandbox", "ls"],
        capture_output=True, text=True, timeout=60,
    )
    assert bad_key.returncode == 1 and "invalid API key" in bad_key.stderr
    usage = subprocess.run([str(AIRLOCK), "sandbox", "frobnicate"], capture_output=True, text=True)
    assert usage.returncode == 2


def test_template_ls_shows_base(server):
    out = cli(server, "--data-dir", str(server.data_dir), "template", "ls")
    assert out.returncode == 0
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert any(row[0] == "base" for row in rows)
    listed = json.loads(cli(server, "--data-dir", str(server.data_dir), "template", "ls", "--json").stdout)
    assert {"base", "code-interpreter-v1"} <= {t["name"] for t in listed}
    assert all(set(t) == {"name", "hash", "size", "built"} for t in listed)


def test_key_ls_json(server):
    import hashlib

    keys = json.loads(cli(server, "--data-dir", str(server.data_dir), "key", "ls", "--json").stdout)
    mine = hashlib.sha256(API_KEY.encode()).hexdigest()[:12]
    assert [k for k in keys if k["id"] == mine][0]["revoked"] == "-"


def test_create_info_ls_filters_pause_resume_snapshot_and_kill(server):
    tag = f"cli-{os.getpid()}-{time.time_ns()}"
    made = cli(server, "sandbox", "create", "--template", "base", "--timeout", "120",
               "--metadata", f"case={tag}", "--json")
    assert made.returncode == 0, made.stderr
    sid = json.loads(made.stdout)["sandboxID"]
    try:
        info = json.loads(cli(server, "sandbox", "info", sid, "--json").stdout)
        assert (info["state"], info["metadata"], info["templateID"]) == ("running", {"case": tag}, "base")
        human = cli(server, "sandbox", "info", sid).stdout
        assert "state     running" in human and f"case={tag}" in human

        def listed(*flags):
            out = cli(server, "sandbox", "ls", "--metadata", f"case={tag}", "--json", *flags)
            assert out.returncode == 0, out.stderr
            return [(s["sandboxID"], s["state"]) for s in json.loads(out.stdout)]

        assert listed() == [(sid, "running")]
        assert listed("--state", "paused") == []
        paused = cli(server, "sandbox", "pause", sid)
        assert paused.returncode == 0 and f"paused {sid}" in paused.stdout, paused.stderr
        assert listed() == [], "ls shows running sandboxes by default"
        assert listed("--state", "paused") == [(sid, "paused")]
        assert listed("--all") == [(sid, "paused")]
        assert cli(server, "sandbox", "resume", sid).returncode == 0
        assert listed() == [(sid, "running")]

        snap = cli(server, "sandbox", "snapshot", sid, "--json")
        assert snap.returncode == 0, snap.stderr
        snapshot_id = json.loads(snap.stdout)["snapshotID"]
        copy = cli(server, "sandbox", "create", "--template", snapshot_id)
        assert copy.returncode == 0, copy.stderr
        assert cli(server, "sandbox", "kill", copy.stdout.strip()).returncode == 0
    finally:
        cli(server, "sandbox", "kill", sid)
    gone = cli(server, "sandbox", "info", sid)
    assert gone.returncode == 1 and "not found" in gone.stderr


def test_cp_both_ways_and_where_it_cannot_reach(server, sandbox, tmp_path):
    sid = sandbox.sandbox_id
    local = tmp_path / "data.bin"
    local.write_bytes(os.urandom(3 << 20) + b"end")
    up = cli(server, "sandbox", "cp", str(local), f"{sid}:/home/user/data.bin")
    assert up.returncode == 0, up.stderr
    assert sandbox.commands.run("sha256sum /home/user/data.bin").stdout.split()[0] == \
        subprocess.run(["sha256sum", str(local)], capture_output=True, text=True).stdout.split()[0]

    sandbox.files.write("/home/user/out.txt", "made inside")
    back = tmp_path / "out.txt"
    down = cli(server, "sandbox", "cp", f"{sid}:/home/user/out.txt", str(back))
    assert down.returncode == 0, down.stderr
    assert back.read_text() == "made inside"

    # The files API writes as root (as E2B's does), so what is out of reach is what no one may
    # write: the kernel's own files, and a directory in a file's place.
    proc = cli(server, "sandbox", "cp", str(local), f"{sid}:/proc/nope.bin")
    assert proc.returncode == 1 and "not permitted" in proc.stderr, proc.stderr
    onto_dir = cli(server, "sandbox", "cp", str(local), f"{sid}:/home/user")
    assert onto_dir.returncode == 1 and "is a directory" in onto_dir.stderr, onto_dir.stderr
    missing = cli(server, "sandbox", "cp", f"{sid}:/home/user/nothing", str(tmp_path / "x"))
    assert missing.returncode == 1 and "not found" in missing.stderr.lower(), missing.stderr
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob("*.airlock-partial"))
    unknown = cli(server, "sandbox", "cp", str(local), "nosuchsandbox:/tmp/x")
    assert unknown.returncode == 1 and "not found" in unknown.stderr
    neither = cli(server, "sandbox", "cp", str(local), str(tmp_path / "y"))
    assert neither.returncode == 1 and "ID:PATH" in neither.stderr


def test_logs_print_and_follow(server, sandbox):
    out = cli(server, "sandbox", "logs", sandbox.sandbox_id)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
    follow = subprocess.Popen(
        [str(AIRLOCK), "--url", server.url, "--api-key", API_KEY, "sandbox", "logs", "-f", sandbox.sandbox_id],
        stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1)
        sandbox.commands.run("true")  # the agent logs each process it starts
        time.sleep(2)  # the follower asks every 0.5 s
        sandbox.kill()
        follow.wait(timeout=30)
        assert follow.returncode == 0, "it ends when the sandbox does"
        lines = follow.stdout.read().splitlines()
        assert len(lines) > len(out.stdout.splitlines()), "new entries came while following"
        assert len(lines) == len(set(lines)), "no entry is printed twice"
    finally:
        follow.kill()


def test_an_interactive_shell_on_a_real_terminal(server, sandbox):
    """`sandbox shell` on a pseudo-terminal, as a person at a terminal would use it: the keys
    go in as typed, the shell sees a terminal of our size, follows a resize, and its exit code
    is the command's."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(str(AIRLOCK), [str(AIRLOCK), "--url", server.url, "--api-key", API_KEY,
                                "sandbox", "shell", sandbox.sandbox_id])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
    seen = b""

    def read_until(needle, seconds=30):
        nonlocal seen
        deadline = time.time() + seconds
        while needle not in seen and time.time() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    break
        assert needle in seen, seen[-2000:]

    os.write(fd, b"echo at-$((6*7)); tty; stty size\r")
    read_until(b"at-42")
    read_until(b"/dev/pts/")
    read_until(b"33 101")
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    os.kill(pid, 28)  # SIGWINCH, as the terminal sends it
    time.sleep(1)
    os.write(fd, b"stty size; whoami\r")
    read_until(b"40 120")
    read_until(b"user")
    os.write(fd, b"exit 7\r")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 7


def test_completions_for_each_shell(server):
    for shell, marker in [("bash", "complete -F"), ("zsh", "#compdef airlock"), ("fish", "complete -c airlock")]:
        out = subprocess.run([str(AIRLOCK), "completions", shell], capture_output=True, text=True)
        assert out.returncode == 0 and marker in out.stdout and "sandbox" in out.stdout
