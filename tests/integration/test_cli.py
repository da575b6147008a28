"""The `airlock` CLI against the running server: tables, exec exit codes, kill."""

import subprocess

from conftest import AIRLOCK, API_KEY


def cli(server, *args):
    return subprocess.run(
        [str(AIRLOCK), "--url", server.url, "--api-key", API_KEY, *args],
        capture_output=True, text=True, timeout=60,
    )


def test_sandbox_ls_exec_kill(server, sandbox):
    ls = cli(server, "sandbox", "ls")
    assert ls.returncode == 0
    assert ls.stdout.splitlines()[0].split() == ["ID", "TEMPLATE", "STARTED", "EXPIRES", "METADATA"]
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
