"""`airlock install`: the data dir, an API key and a systemd unit that systemd accepts, whose
command line `airlock` parses, and which stops the server alone so sandboxes outlive it."""

import os
import shlex
import shutil
import subprocess

import pytest

from conftest import AIRLOCK


def install(tmp_path, *flags):
    return subprocess.run(
        [str(AIRLOCK), "--data-dir", str(tmp_path / "my data"), "install",
         "--unit-dir", str(tmp_path / "units"), "--no-start", *flags],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "AIRLOCK_TEMPLATES_DIR"})


def test_install_writes_a_unit_a_key_and_says_how_to_see_logs(tmp_path):
    done = install(tmp_path, "--listen", "127.0.0.1:3111", "--metrics-listen", "127.0.0.1:9464")
    assert done.returncode == 0, done.stderr
    key = (tmp_path / "my data" / "api-key").read_text().strip()
    assert key.startswith("e2b_") and key in done.stdout
    assert oct((tmp_path / "my data" / "api-key").stat().st_mode & 0o777) == "0o600"
    assert "journalctl -u airlock" in done.stdout

    unit = (tmp_path / "units" / "airlock.service").read_text()
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert lines["KillMode"] == "process", "a stop signals the server alone"
    assert lines["WantedBy"] == "multi-user.target"
    exec_start = shlex.split(lines["ExecStart"])
    assert exec_start[0] == str(AIRLOCK.resolve())
    # A data dir with a space in its name stays one word.
    assert exec_start[1:] == ["--data-dir", str((tmp_path / "my data").resolve()), "serve",
                              "--listen", "127.0.0.1:3111", "--metrics-listen", "127.0.0.1:9464"]
    parsed = subprocess.run([*exec_start, "--help"], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr

    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "units" / "airlock.service")],
                                capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr

    again = install(tmp_path)
    assert again.returncode == 0 and "as before" in again.stdout
    assert (tmp_path / "my data" / "api-key").read_text().strip() == key, "the key is kept"


@pytest.mark.parametrize("missing", ["airlock-agent"])
def test_install_refuses_a_binary_without_its_companions(tmp_path, missing):
    lone = tmp_path / "bin"
    lone.mkdir()
    shutil.copy(AIRLOCK, lone / "airlock")
    out = subprocess.run([str(lone / "airlock"), "--data-dir", str(tmp_path / "my data"), "install",
                          "--unit-dir", str(tmp_path / "units"), "--no-start"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and missing in out.stderr and "prepare.sh" in out.stderr
    assert not (tmp_path / "units").exists()
