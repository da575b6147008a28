"""Idle sandboxes are frozen (the host's cgroup freezer) and thawed by their next request: what
a user sees must not change. The freezer's state is read from the host, so each test knows the
sandbox really was frozen (or really was not) while it checks what the user sees."""

import time
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def freezer_state(sandbox_id):
    """`FROZEN`, `FREEZING` or `THAWED` (cgroup v1), or `1`/`0` (v2); `None` if it has none."""
    for path, read in (
        (CGROUP / "freezer/airlock" / sandbox_id / "freezer.state", str.strip),
        (CGROUP / "airlock" / sandbox_id / "cgroup.freeze", lambda s: "FROZEN" if s.strip() == "1" else "THAWED"),
    ):
        if path.exists():
            return read(path.read_text())
    return None


def cpu_ns(sandbox_id):
    return int((CGROUP / "cpuacct/airlock" / sandbox_id / "cpuacct.usage").read_text())


def wait_for_state(sandbox_id, want, within=15):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if freezer_state(sandbox_id) == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"{sandbox_id} not {want} within {within} s: {freezer_state(sandbox_id)}")


def test_an_idle_sandbox_is_frozen_costs_no_cpu_and_answers_as_before(sandbox):
    sbx = sandbox
    sbx.files.write("/home/user/kept", "before\n")
    wait_for_state(sbx.sandbox_id, "FROZEN")
    before = cpu_ns(sbx.sandbox_id)
    time.sleep(1)
    assert cpu_ns(sbx.sandbox_id) == before, "a frozen sandbox uses no CPU"

    out = sbx.commands.run("cat /home/user/kept; date +%s")
    kept, clock = out.stdout.split()
    assert kept == "before"
    assert abs(int(clock) - time.time()) < 3, "its clock is the host's after the thaw"
    assert sbx.is_running()
    # And it freezes again once quiet.
    wait_for_state(sbx.sandbox_id, "FROZEN")


def test_a_process_of_its_own_keeps_it_awake_and_fires_on_time(sandbox):
    sbx = sandbox
    started = time.time()
    # Detached: no stream stays open, only the process lives.
    sbx.commands.run("nohup sh -c 'sleep 3; date +%s > /tmp/fired' >/dev/null 2>&1 &")
    time.sleep(2.5)
    assert freezer_state(sbx.sandbox_id) == "THAWED", "awake while its process sleeps"
    # Nothing is sent to it meanwhile: frozen, it would fire only at the next request.
    time.sleep(7.5)
    fired = int(sbx.files.read("/tmp/fired"))
    assert fired - started < 7, f"fired {fired - started:.1f} s after the start, not ~3"
    # The process ended: now it freezes (the control that the freezer runs for this sandbox).
    wait_for_state(sbx.sandbox_id, "FROZEN")


def test_a_kernel_keeps_its_state_across_a_freeze(server):
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create()
    try:
        assert sbx.run_code("x = 41").error is None
        wait_for_state(sbx.sandbox_id, "FROZEN")
        assert sbx.run_code("x + 1").text == "42"
    finally:
        sbx.kill()


def test_a_frozen_sandbox_pauses_resumes_and_times_out(sandbox_factory):
    from e2b import Sandbox

    sbx = sandbox_factory(timeout=300)
    sbx.commands.run("echo hi > /home/user/f")
    wait_for_state(sbx.sandbox_id, "FROZEN")
    sbx.pause()
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.commands.run("cat /home/user/f").stdout == "hi\n"

    wait_for_state(sbx.sandbox_id, "FROZEN")
    resumed.set_timeout(2)  # the API's, not the sandbox's: it stays frozen
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and freezer_state(sbx.sandbox_id) is not None:
        time.sleep(0.5)
    assert freezer_state(sbx.sandbox_id) is None, "its timeout killed it, frozen or not"
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]


def test_pooled_sandboxes_settle_then_wait_frozen(server):
    """A ready sandbox in a pool is frozen once it has been ready for --freeze-after-ms (a
    restored sandbox has work of its own to finish first), and a create thaws it."""
    from e2b import Sandbox

    bundles = server.data_dir / "gvisor" / "bundles"

    def pooled_states():
        listed = {s.sandbox_id for s in Sandbox.list(limit=1000).next_items()}
        return {b.name: freezer_state(b.name) for b in bundles.iterdir() if b.name not in listed}

    deadline = time.monotonic() + 60
    while True:
        states = pooled_states()
        if len(states) >= 2 and set(states.values()) == {"FROZEN"}:
            break
        assert time.monotonic() < deadline, f"pooled sandboxes not all frozen: {states}"
        time.sleep(0.2)
    sbx = Sandbox.create("base")
    try:
        assert freezer_state(sbx.sandbox_id) == "THAWED"
        assert sbx.commands.run("echo thawed").stdout == "thawed\n"
    finally:
        sbx.kill()
