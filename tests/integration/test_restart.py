"""Restarts. By default a stop leaves running sandboxes running and the next start adopts them
with their processes, files, kernels, timeouts and network rules. After `kill -9` every sandbox
is adopted (and works) or removed, and nothing leaks. A stop with `--stop-sandboxes-on-exit`
(the suite's setting) leaves no runsc process, netns or veth behind."""

import signal
import subprocess
import time

import pytest
from e2b import Sandbox

from conftest import footprint, host_leftovers
from test_network import HTTP, NAME, probe

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"


@pytest.fixture
def sandboxes_run_on(server):
    """The server as it is by default: sandboxes run on through its stops. Put back after (the
    next start adopts what a test left running, and the suite's server kills it at the end)."""
    server.stop()
    server.stop_sandboxes_on_exit = False
    server.start()
    yield server
    server.stop()
    server.stop_sandboxes_on_exit = True
    server.start()


def counted(sbx):
    return int(sbx.files.read("/tmp/count"))


def walled_off(got):
    """Whether the denied address was blocked and the one beside it answered."""
    return got[0].startswith("blocked") and got[1] == HTTP


def test_a_stop_and_start_keep_processes_files_kernels_timeouts_and_rules(sandboxes_run_on, outside):
    from e2b_code_interpreter import Sandbox as Interpreter

    server = sandboxes_run_on
    # The walled sandbox's own control: the address next to the one it denies.
    reach, beside = (f"tls({addr!r}, 443, {NAME!r})" for addr in (outside.public, outside.public2))
    walled = Interpreter.create(timeout=600, network={"deny_out": [f"{outside.public}/32"]})
    control = Sandbox.create("base")  # the default rules: proves the probe can get through
    try:
        walled.files.write("/home/user/kept.txt", "still here")
        counter = walled.commands.run(COUNTER, background=True)
        assert walled.run_code("x = 41").error is None
        assert walled_off(probe(walled, reach, beside))
        end_at = walled.get_info().end_at
        before = counted(walled)

        server.stop()  # SIGTERM
        netns = host_leftovers(server.data_dir)["netns"]
        assert any(walled.sandbox_id in n for n in netns), "it runs on"
        server.start()

        again = Interpreter.connect(walled.sandbox_id)
        assert counter.pid in [p.pid for p in again.commands.list()]
        after = counted(again)
        time.sleep(0.5)
        assert before < after < counted(again), "the process counted on through the restart"
        assert again.files.read("/home/user/kept.txt") == "still here"
        assert again.run_code("x + 1").text == "42", "the kernel kept its state"
        assert again.get_info().end_at == end_at
        assert walled_off(probe(again, reach, beside)), "its rules held"
        assert probe(Sandbox.connect(control.sandbox_id), reach) == [HTTP]
    finally:
        walled.kill()
        control.kill()


def footprints(server, *sandboxes):
    """`footprint` of each sandbox (whose `address` the test noted), by id."""
    return {sbx.sandbox_id: footprint(server.data_dir, sbx.sandbox_id, sbx.address) for sbx in sandboxes}


def all_gone(server, *sandboxes, within=30):
    """Waits for the host to hold nothing of `sandboxes`; returns what it still holds."""
    deadline = time.time() + within
    while True:
        left = {}
        for sid, held in footprints(server, *sandboxes).items():
            if any(held.values()):
                left[sid] = {kind: what for kind, what in held.items() if what}
        if not left or time.time() > deadline:
            return left
        time.sleep(0.5)


def test_kill_9_then_restart_adopts_and_leaks_nothing(server):
    survivor = Sandbox.create("base", metadata={"restart": "survivor"})
    survivor.files.write("/home/user/kept.txt", "still here")
    doomed = Sandbox.create("base", metadata={"restart": "doomed"})
    for sbx in (survivor, doomed):
        sbx.address = sbx.commands.run("hostname -I").stdout.split()[0]
    # The control: the probe sees every kind of thing a sandbox holds on the host.
    before = footprints(server, survivor, doomed)
    for sid, held in before.items():
        assert all(held.values()), (sid, held)

    server.stop(sig=signal.SIGKILL)
    # While the server is down one sandbox dies on its own (as after a host hiccup).
    subprocess.run(["runsc", "--root", str(server.data_dir / "gvisor" / "runsc"), "kill", doomed.sandbox_id, "KILL"], check=False)
    server.start()

    again = Sandbox.connect(survivor.sandbox_id)
    assert again.files.read("/home/user/kept.txt") == "still here"
    assert again.commands.run("echo adopted").stdout == "adopted\n"
    listed = {s.sandbox_id for s in Sandbox.list().next_items()}
    assert survivor.sandbox_id in listed
    assert doomed.sandbox_id not in listed
    assert all_gone(server, doomed) == {}
    assert footprints(server, survivor) == {survivor.sandbox_id: before[survivor.sandbox_id]}, \
        "the adopted one keeps all it had"
    survivor.kill()
    assert all_gone(server, survivor) == {}


def test_clean_shutdown_leaves_nothing(server):
    for _ in range(2):
        Sandbox.create("base", metadata={"shutdown": "yes"})
    server.stop(sig=signal.SIGTERM)
    try:
        assert host_leftovers(server.data_dir) == {"netns": [], "links": [], "runsc": [], "mounts": []}
    finally:
        server.start()
