"""Paused sandboxes kept in memory (`airlock serve --paused-memory-mb`): a pause still writes
the sandbox to disk, and also keeps its runtime on the host, frozen, so that its resume is a
thaw. Past the budget the runtime goes and the resume restores the image. The host's freezer
and cgroups show which of the two happened, so each test knows which path it checks."""

import time

from test_freezer import cpu_ns, freezer_state
from test_operator_metrics import scrape, value

# A counter that only a live process advances; renamed into place so a read never sees it
# half written.
COUNTER = ("n=0; while true; do n=$((n+1)); echo $n > /tmp/n.new; mv /tmp/n.new /tmp/n;"
           " sleep 0.1; done")


def start_counting(sbx):
    sbx.files.write("/home/user/kept", "written before the pause")
    sbx.commands.run(COUNTER, background=True)
    time.sleep(0.5)


def resumed_where_it_was(sbx):
    assert sbx.files.read("/home/user/kept") == "written before the pause"
    first = int(sbx.files.read("/tmp/n"))
    time.sleep(0.5)
    assert int(sbx.files.read("/tmp/n")) > first > 1, "the counting process lives on"


def test_a_pause_keeps_the_runtime_frozen_and_the_resume_thaws_it(server, sandbox):
    start_counting(sandbox)
    assert sandbox.pause() is True
    assert freezer_state(sandbox.sandbox_id) == "FROZEN", "its runtime is kept, frozen"
    used = cpu_ns(sandbox.sandbox_id)
    time.sleep(1)
    assert cpu_ns(sandbox.sandbox_id) == used, "and nothing in it runs"
    assert value(scrape(server), "airlock_paused_in_memory") >= 1

    sandbox.connect()
    assert freezer_state(sandbox.sandbox_id) == "THAWED"
    resumed_where_it_was(sandbox)


def test_past_its_budget_a_paused_runtime_goes_and_the_resume_restores_the_image(
        server, restarted, sandbox_factory):
    restarted("--paused-memory-mb", "1")  # less than any sandbox holds
    sbx = sandbox_factory()
    start_counting(sbx)
    assert sbx.pause() is True
    deadline = time.monotonic() + 15
    while freezer_state(sbx.sandbox_id) is not None:
        assert time.monotonic() < deadline, "the runtime is let go past the budget"
        time.sleep(0.1)
    assert value(scrape(server), "airlock_paused_in_memory") == 0

    sbx.connect()
    resumed_where_it_was(sbx)
