"""Pause, resume, connect, auto-pause, snapshots and forks through the stock SDK, on real gVisor
checkpoints: memory, processes and files must all survive."""

import os
import signal
import subprocess
import time

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, SandboxException

from conftest import host_leftovers


def state_of(sbx):
    return Sandbox.get_info(sbx.sandbox_id).state


def test_pause_and_resume_keep_memory_files_and_processes(sandbox):
    sandbox.files.write("/home/user/before.txt", "written before the first pause")
    # A shell variable only exists in the process's memory.
    bg = sandbox.commands.run(
        # Renamed into place, so that a read never sees the file between truncation and write.
        "counter=41; while true; do counter=$((counter+1)); echo $counter > /tmp/counter.new;"
        " mv /tmp/counter.new /tmp/counter; sleep 0.2; done",
        background=True,
    )
    time.sleep(0.6)

    assert sandbox.pause() is True
    assert state_of(sandbox) == SandboxState.PAUSED
    assert sandbox.pause() is False, "a second pause reports already paused (409)"

    sandbox.connect()
    assert state_of(sandbox) == SandboxState.RUNNING
    assert sandbox.files.read("/home/user/before.txt") == "written before the first pause"
    assert any(p.pid == bg.pid for p in sandbox.commands.list()), "the background loop survived"
    first = int(sandbox.files.read("/tmp/counter"))
    time.sleep(0.6)
    assert int(sandbox.files.read("/tmp/counter")) > first >= 42, "and it still counts"

    # What the hosted service gets wrong: writes after the first resume survive the second.
    sandbox.files.write("/home/user/after.txt", "written after the first resume")
    assert sandbox.pause() is True
    sandbox.connect()
    assert sandbox.files.read("/home/user/before.txt") == "written before the first pause"
    assert sandbox.files.read("/home/user/after.txt") == "written after the first resume"

    # The process started before the first pause can still be connected to and killed.
    handle = sandbox.commands.connect(bg.pid)
    assert sandbox.commands.kill(bg.pid) is True
    with pytest.raises(Exception):
        handle.wait()
    assert not any(p.pid == bg.pid for p in sandbox.commands.list())


def test_a_command_running_during_pause_continues_after_resume(sandbox):
    handle = sandbox.commands.run(
        "for i in $(seq 1 15); do echo $i >> /tmp/progress; sleep 0.2; done; echo done > /tmp/finished",
        background=True,
    )
    time.sleep(0.5)
    sandbox.pause()
    sandbox.connect()
    deadline = time.time() + 20
    while time.time() < deadline and not sandbox.files.exists("/tmp/finished"):
        time.sleep(0.2)
    assert sandbox.files.read("/tmp/finished").strip() == "done"
    assert sandbox.files.read("/tmp/progress").split() == [str(i) for i in range(1, 16)]
    del handle


def test_paused_sandboxes_are_listed_and_killable(sandbox_factory):
    sbx = sandbox_factory(metadata={"pause-list": "yes"})
    sbx.pause()
    query = SandboxQuery(metadata={"pause-list": "yes"}, state=[SandboxState.PAUSED])
    assert [s.sandbox_id for s in Sandbox.list(query=query).next_items()] == [sbx.sandbox_id]
    running = SandboxQuery(metadata={"pause-list": "yes"}, state=[SandboxState.RUNNING])
    assert Sandbox.list(query=running).next_items() == []
    # A paused sandbox is not running: setting its timeout is a 404, as the old SDKs' resume
    # flow expects.
    with pytest.raises(NotFoundException):
        Sandbox.set_timeout(sbx.sandbox_id, 60)
    assert sbx.kill() is True
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_pause_and_resume_of_unknown_or_killed_sandboxes_is_404(server, sandbox):
    sandbox.kill()
    for sid in [sandbox.sandbox_id, "nosuchsandbox0000000"]:
        status, body = server.api("POST", f"/sandboxes/{sid}/pause", {})
        assert (status, body["code"]) == (404, 404), body
        status, body = server.api("POST", f"/sandboxes/{sid}/resume", {})
        assert (status, body["code"]) == (404, 404), body
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandbox.sandbox_id)


def test_resume_of_a_running_sandbox_is_409(server, sandbox):
    status, body = server.api("POST", f"/sandboxes/{sandbox.sandbox_id}/resume", {})
    assert status == 409 and "already running" in body["message"]


def test_on_timeout_pause(sandbox_factory):
    sbx = sandbox_factory(timeout=2, lifecycle={"on_timeout": "pause"})
    sbx.files.write("/home/user/kept.txt", "kept across the auto-pause")
    deadline = time.time() + 30
    while time.time() < deadline and state_of(sbx) != SandboxState.PAUSED:
        time.sleep(0.3)
    assert state_of(sbx) == SandboxState.PAUSED
    info = Sandbox.get_info(sbx.sandbox_id)
    assert info.lifecycle["on_timeout"] == "pause"
    sbx.connect(timeout=60)
    assert sbx.files.read("/home/user/kept.txt") == "kept across the auto-pause"


def test_a_paused_sandbox_survives_a_server_restart(server, sandbox_factory):
    sbx = sandbox_factory()
    sbx.commands.run("echo survived > /home/user/restart.txt")
    sbx.pause()
    server.stop(sig=signal.SIGTERM)
    server.start()
    assert state_of(sbx) == SandboxState.PAUSED
    sbx.connect()
    assert sbx.files.read("/home/user/restart.txt").strip() == "survived"


def test_a_full_disk_during_pause_is_a_clear_error_and_loses_nothing(server, sandbox):
    sandbox.files.write("/home/user/precious.txt", "still here")
    images = server.data_dir / "gvisor" / "images"
    # A 1 MiB filesystem over the image directory: no checkpoint fits.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(images)], check=True)
    try:
        status, body = server.api("POST", f"/sandboxes/{sandbox.sandbox_id}/pause", {})
    finally:
        subprocess.run(["umount", str(images)], check=True)
    assert status == 507, body
    assert body["code"] == 507 and "disk space" in body["message"]
    assert state_of(sandbox) == SandboxState.RUNNING
    assert sandbox.files.read("/home/user/precious.txt") == "still here"
    assert sandbox.commands.run("echo alive").stdout.strip() == "alive"


def test_snapshots_fan_out_one_prepared_state(sandbox):
    sandbox.files.write("/home/user/prepared.txt", "prepared once")
    sandbox.commands.run("sleep 600", background=True)
    snap = sandbox.create_snapshot()
    assert snap.snapshot_id in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
    # The source keeps running.
    assert sandbox.commands.run("cat /home/user/prepared.txt").stdout == "prepared once"

    copies = [Sandbox.create(snap.snapshot_id) for _ in range(2)]
    try:
        ids = {c.sandbox_id for c in copies} | {sandbox.sandbox_id}
        assert len(ids) == 3
        for c in copies:
            assert c.files.read("/home/user/prepared.txt") == "prepared once"
            assert c.commands.run("hostname").stdout.strip() == c.sandbox_id
            assert any("sleep 600" in " ".join([p.cmd] + p.args) for p in c.commands.list())
        copies[0].files.write("/home/user/prepared.txt", "changed in one copy")
        assert copies[1].files.read("/home/user/prepared.txt") == "prepared once"
    finally:
        for c in copies:
            c.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    with pytest.raises(SandboxException):
        Sandbox.create(snap.snapshot_id)


def test_fork(sandbox):
    sandbox.files.write("/home/user/state.txt", "forked state")
    forks = sandbox.fork(count=2, timeout=60)
    try:
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks)
        tokens = {f._envd_access_token for f in forks}
        assert len(tokens) == 2
        for f in forks:
            assert f.sandbox_id != sandbox.sandbox_id
            assert f.files.read("/home/user/state.txt") == "forked state"
        assert sandbox.commands.run("echo source").stdout.strip() == "source"
    finally:
        for f in forks:
            if isinstance(f, Sandbox):
                f.kill()
