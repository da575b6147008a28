"""Per-sandbox limits under hostile load: a memory bomb, a disk fill, a fork bomb and a 1 GB
stdout flood each stay inside their sandbox, while a neighbour and the server keep answering.
Sizes come from the create body (`cpuCount`, `memoryMB`, `diskSizeMB`, Airlock's extension)."""

import time
import urllib.request
from pathlib import Path

import pytest
from e2b import CommandExitException


def server_rss_mib(server):
    status = open(f"/proc/{server.proc.pid}/status").read()
    return int(next(l for l in status.splitlines() if l.startswith("VmRSS")).split()[1]) // 1024


def assert_responsive(server, neighbour):
    with urllib.request.urlopen(server.url + "/health", timeout=30) as r:
        assert r.status == 200
    assert neighbour.commands.run("echo ok", timeout=60).stdout == "ok\n"


def test_sizes_are_applied_and_reported(server, sandbox_factory):
    sbx = sandbox_factory(cpuCount=1, memoryMB=512, diskSizeMB=1024)
    info = sbx.get_info()
    assert (info.cpu_count, info.memory_mb) == (1, 512)
    mem_total_kb = int(sbx.commands.run("awk '/MemTotal/ {print $2}' /proc/meminfo").stdout)
    assert mem_total_kb == 512 * 1024
    status, detail = server.api("GET", f"/sandboxes/{sbx.sandbox_id}")
    assert detail["diskSizeMB"] == 1024


def test_memory_bomb_kills_only_the_offender(server, sandbox_factory, sandbox):
    sbx = sandbox_factory(memoryMB=256)
    with pytest.raises(CommandExitException) as bomb:
        sbx.commands.run("python3 -c 'x = bytearray(600 << 20)'", timeout=120)
    # SIGKILL, as from Linux's OOM killer: envd reports a signal death as exit code -1.
    assert (bomb.value.exit_code, bomb.value.error) == (-1, "signal: killed")
    # The sandbox itself lives on, with its files and its memory back. The killed process's
    # pages are freed asynchronously: give them (at most) 30 s, then insist.
    sbx.files.write("/home/user/after.txt", "still here")
    # Until they are, the OOM guard may kill the probe itself: that too means "not back yet".
    deadline = time.time() + 30
    total = available = 0
    while True:
        try:
            total, available = map(int, sbx.commands.run(
                "awk '/^MemTotal|^MemAvailable/ {print $2}' /proc/meminfo").stdout.split())
        except CommandExitException as killed:
            if killed.exit_code != -1:
                raise
        if available > total * 0.6 or time.time() > deadline:
            break
        time.sleep(0.5)
    assert available > total * 0.6, f"memory did not come back: {available} of {total} kB"
    assert sbx.commands.run("python3 -c 'x = bytearray(100 << 20); print(len(x))'").stdout == f"{100 << 20}\n"
    assert sbx.files.read("/home/user/after.txt") == "still here"
    assert_responsive(server, sandbox)


def test_disk_fill_is_enospc_inside_only(server, sandbox_factory, sandbox):
    sbx = sandbox_factory(diskSizeMB=128)
    fill = sbx.commands.run("dd if=/dev/zero of=/home/user/fill bs=1M count=300; echo rc=$?", timeout=120)
    assert "No space left on device" in fill.stdout + fill.stderr
    written = int(sbx.commands.run("stat -c %s /home/user/fill").stdout)
    assert 64 << 20 < written < 128 << 20
    # Deleting gives the space back.
    sbx.commands.run("rm /home/user/fill && dd if=/dev/zero of=/home/user/again bs=1M count=64", timeout=120)
    assert_responsive(server, sandbox)


def settled(path, within=60):
    """The number in `path` once it has stayed the same for 2 s."""
    last, since, deadline = None, time.time(), time.time() + within
    while time.time() < deadline:
        now = int(path.read_text())
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= 2:
            return now
        time.sleep(0.25)
    raise AssertionError(f"{path} did not settle: {last}")


def test_fork_bomb_runs_into_its_cap_and_stays_in_its_sandbox(server, sandbox_factory):
    bomber, neighbour = sandbox_factory(), sandbox_factory()
    assert bomber.commands.run("ulimit -u").stdout == "1024\n", "processes per user are capped"
    pids = Path(f"/sys/fs/cgroup/pids/airlock/{bomber.sandbox_id}")
    idle = int((pids / "pids.current").read_text())
    bomber.commands.run("b() { b | b & }; b 2>/tmp/bomb.err", background=True, timeout=0)
    # It runs into the cap: the host's count of the sandbox's tasks climbs, then stays put below
    # the host's own cap for the sandbox (so that is not what holds it); inside, `user` has its
    # 1024 processes (less those between a failed fork and their exit), and its forks fail.
    tasks = settled(pids / "pids.current")
    assert idle < tasks < int((pids / "pids.max").read_text()), (idle, tasks)
    running = [e for e in bomber.files.list("/proc", request_timeout=120) if e.name.isdigit()]
    assert 900 < len(running) <= 1024 + 1, len(running)  # and the agent, root's
    err = bomber.files.read("/tmp/bomb.err", request_timeout=120)
    assert "fork: retry: Resource temporarily unavailable" in err, err[-300:]
    for _ in range(3):
        assert_responsive(server, neighbour)
    # The bomb is the bomber's own problem: killing the sandbox ends it and leaves nothing behind.
    bomber.kill()
    deadline = time.time() + 30
    while pids.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert not pids.exists()
    assert_responsive(server, neighbour)


def pids_alive(sbx, pids):
    """Which of `pids` exist in the sandbox, with their state (`Z` for a zombie)."""
    out = sbx.commands.run(f"ps -o pid=,stat= -p {','.join(pids)} || true").stdout
    return {pid: stat[0] for pid, stat in map(str.split, out.splitlines())}


def test_orphans_are_reaped(sandbox):
    # The control: a child whose parent does not wait for it is seen, as a zombie.
    # The pid is written beside and renamed into place: /tmp/parent exists only whole.
    sandbox.commands.run("python3 -c 'import os, time\nif os.fork() == 0: os._exit(0)\n"
                         "open(\"/tmp/parent.part\", \"w\").write(str(os.getpid()))\n"
                         "os.replace(\"/tmp/parent.part\", \"/tmp/parent\"); time.sleep(600)'",
                         background=True)
    for _ in range(100):
        if sandbox.files.exists("/tmp/parent"):
            break
        time.sleep(0.1)
    parent = sandbox.files.read("/tmp/parent")
    zombie = sandbox.commands.run(f"ps -o pid= --ppid {parent}").stdout.split()
    assert list(pids_alive(sandbox, zombie).values()) == ["Z"], "the probe sees an unreaped child"
    # Twenty orphans: their parent subshells exit at once, so they become the agent's children;
    # and the zombie above, once its parent is killed.
    # (Their output goes elsewhere, so that the command ends at once, and not with them.)
    sandbox.commands.run("for i in $(seq 20); do (sh -c 'echo $$ >> /tmp/orphans; exec sleep 3' "
                         ">/dev/null 2>&1 &); done")
    sandbox.commands.run(f"kill -9 {parent}")
    for _ in range(100):
        orphans = sandbox.commands.run("cat /tmp/orphans 2>/dev/null || true").stdout.split()
        if len(orphans) == 20:
            break
        time.sleep(0.1)
    assert len(orphans) == 20, orphans
    assert set(pids_alive(sandbox, orphans).values()) == {"S"}, "they are running, not yet gone"
    # Each has exited, and is gone: not running, and not left a zombie either.
    deadline = time.time() + 30
    while (left := pids_alive(sandbox, orphans + zombie)) and time.time() < deadline:
        time.sleep(0.5)
    assert left == {}, left


def test_stdout_flood_does_not_grow_the_server(server, sandbox):
    before = server_rss_mib(server)
    seen = [0]

    def count(chunk):
        seen[0] += len(chunk)

    handle = sandbox.commands.run("head -c 1000000000 /dev/zero | tr '\\0' x", background=True, timeout=0)
    result = handle.wait(on_stdout=count)
    assert result.exit_code == 0
    assert seen[0] == 1_000_000_000
    assert server_rss_mib(server) < before + 64, "output streams through; nothing piles up"
