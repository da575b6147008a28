"""What a sandbox (or another tenant) controls reaches the CLI user's terminal escaped, never as
control characters (issue 31): metadata in `sandbox ls` and `info` (and their `--json`), the
sandbox's log, a build's log, and errors that quote the sandbox's words. Each output must
still carry the text around the escapes (the positive control: the probe sees the value)."""

import re
import subprocess

from conftest import AIRLOCK, API_KEY

# A window title, a clear screen, and an 8-bit CSI (C1), each around visible words.
HOSTILE = "owned\x1b]0;title\x07screen\x1b[2Jred\u009b31mend"
# Control characters a terminal acts on: C0 but newline, DEL and C1.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def cli(server, *args, timeout=120):
    return subprocess.run([str(AIRLOCK), "--url", server.url, "--api-key", API_KEY, *args],
                          capture_output=True, text=True, timeout=timeout)


def assert_escaped(*streams):
    for text in streams:
        assert not CONTROL.search(text), repr(text)
        assert "owned" in text and "screen" in text and "red" in text, repr(text)


def test_metadata_and_logs_are_printed_escaped(server, sandbox_factory):
    sbx = sandbox_factory(metadata={"note": HOSTILE})
    sbx.commands.run(f"true '{HOSTILE}'")  # the agent logs the command line
    for args in (["sandbox", "ls"], ["sandbox", "ls", "--json"],
                 ["sandbox", "info", sbx.sandbox_id], ["sandbox", "info", sbx.sandbox_id, "--json"],
                 ["sandbox", "logs", sbx.sandbox_id]):
        out = cli(server, *args)
        assert out.returncode == 0, (args, out.stderr)
        assert_escaped(out.stdout)


def test_an_error_quoting_the_sandbox_is_printed_escaped(server, sandbox, tmp_path):
    out = cli(server, "sandbox", "cp", f"{sandbox.sandbox_id}:/tmp/{HOSTILE}",
              str(tmp_path / "x"))
    assert out.returncode == 1
    assert_escaped(out.stderr)


def test_a_build_log_is_printed_escaped(server, names, tmp_path):
    (tmp_path / "Dockerfile").write_text(
        "FROM base\nRUN printf 'owned\\033]0;title\\007screen\\033[2Jred\\233end\\n'\n")
    out = cli(server, "template", "build", "-f", str(tmp_path / "Dockerfile"), "-n", names(),
              timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert_escaped(out.stdout)
