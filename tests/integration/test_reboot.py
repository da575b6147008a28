"""Filesystem-only pauses and reboots through the stock SDKs: `pause(mode="filesystem")`,
`lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}` and
`connect(on_resume="reboot")` keep the files and start the sandbox afresh on them: its
processes and its kernels' memory are gone, and its template's start command runs again."""

import time

import pytest
from e2b import Sandbox, SandboxState, Template, wait_for_port
from e2b.exceptions import InvalidArgumentException

CI_TEMPLATE = "code-interpreter-v1"


def wait_paused(sbx, within=30):
    deadline = time.time() + within
    while time.time() < deadline:
        if Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED:
            return
        time.sleep(0.3)
    raise AssertionError("not paused in time")


def running_sleeps(sbx):
    return sbx.commands.run("pgrep -x sleep || true").stdout.split()


@pytest.mark.newest_sdk
def test_a_filesystem_pause_keeps_files_and_starts_afresh(server, names):
    # Each start of the start command leaves a line, so a rerun shows.
    name = names()
    Template.build(Template().from_template("base")
                   .set_start_cmd("echo start >> /home/user/starts.log; "
                                  "exec python3 -m http.server 8080", wait_for_port(8080)), name)
    sbx = Sandbox.create(name)
    try:
        sbx.files.write("kept.txt", "files survive")
        sbx.commands.run("sleep 1000", background=True)
        assert running_sleeps(sbx)
        starts = sbx.files.read("starts.log")

        assert sbx.pause(mode="filesystem") is True
        status, detail = server.api("GET", f"/sandboxes/{sbx.sandbox_id}")
        assert detail["state"] == "paused" and detail["pauseMode"] == "filesystem", detail

        sbx = Sandbox.connect(sbx.sandbox_id)
        assert sbx.files.read("kept.txt") == "files survive"
        assert running_sleeps(sbx) == [], "the processes did not survive"
        assert sbx.files.read("starts.log") == starts + "start\n", "the start command ran again"
        assert sbx.commands.run("curl -s -o /dev/null -w '%{http_code}' "
                                "localhost:8080/kept.txt").stdout == "200"
        status, detail = server.api("GET", f"/sandboxes/{sbx.sandbox_id}")
        assert detail["state"] == "running" and "pauseMode" not in detail, detail
        status, body = server.api("GET", f"/v2/sandboxes/{sbx.sandbox_id}/logs?search=rebooted")
        assert len(body["logs"]) == 1, body
    finally:
        sbx.kill()


@pytest.mark.newest_sdk
def test_a_full_pause_resumed_with_reboot_drops_memory(server):
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sbx = CodeSandbox.create(CI_TEMPLATE)
    try:
        sbx.run_code("remembered = 41")
        sbx.commands.run("sleep 1000", background=True)
        sbx.files.write("kept.txt", "files survive")
        assert sbx.pause() is True
        status, detail = server.api("GET", f"/sandboxes/{sbx.sandbox_id}")
        assert detail["pauseMode"] == "full", detail

        sbx = CodeSandbox.connect(sbx.sandbox_id, on_resume="reboot")
        assert running_sleeps(sbx) == []
        assert sbx.files.read("kept.txt") == "files survive"
        # A new kernel: the variable is gone, and code runs.
        gone = sbx.run_code("remembered")
        assert gone.error is not None and gone.error.name == "NameError", gone
        assert sbx.run_code("1 + 1").text == "2"

        # A files-only pause ends the kernel before its checkpoint; the resumed sandbox gets a
        # new one.
        sbx.run_code("remembered = 42")
        sbx.pause(mode="filesystem")
        sbx = CodeSandbox.connect(sbx.sandbox_id)
        gone = sbx.run_code("remembered")
        assert gone.error is not None and gone.error.name == "NameError", gone
        assert sbx.run_code("2 + 2").text == "4"
    finally:
        sbx.kill()


def test_a_restore_after_a_full_pause_still_keeps_everything(sandbox):
    # The control for the test above: without the reboot the same things survive.
    sandbox.commands.run("sleep 1000", background=True)
    sandbox.pause()
    sandbox.connect()
    assert running_sleeps(sandbox)


@pytest.mark.newest_sdk
def test_an_auto_pause_can_keep_files_only(server, sandbox_factory):
    sbx = sandbox_factory(timeout=3, lifecycle={
        "on_timeout": {"action": "pause", "mode": "filesystem"}})
    sbx.files.write("kept.txt", "files survive")
    sbx.commands.run("sleep 1000", background=True)
    wait_paused(sbx)
    status, detail = server.api("GET", f"/sandboxes/{sbx.sandbox_id}")
    assert detail["pauseMode"] == "filesystem", detail
    sbx.connect(timeout=60)
    assert running_sleeps(sbx) == [] and sbx.files.read("kept.txt") == "files survive"


@pytest.mark.newest_sdk
def test_auto_resume_and_a_files_only_auto_pause_do_not_mix(server):
    with pytest.raises(InvalidArgumentException):
        Sandbox.create("base", lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"},
                                          "auto_resume": True})
    # The server refuses it too, for any client.
    status, body = server.api("POST", "/v2/sandboxes", {
        "templateID": "base", "autoPause": True, "autoPauseMemory": False,
        "autoResume": {"enabled": True}})
    assert status == 400 and "autoResume" in body["message"], body
    status, body = server.api("POST", "/sandboxes/nosuchsandbox0000000/pause", {"memory": False})
    assert status == 404, body


def test_filesystem_pause_and_reboot_from_node(server, sandbox):
    sandbox.commands.run("sleep 1000", background=True)
    sandbox.files.write("kept.txt", "from node")
    js = """
      import { Sandbox } from 'e2b'
      const id = process.argv[1]
      const sbx = await Sandbox.connect(id)
      const paused = await sbx.pause({ keepMemory: false })
      const info = await Sandbox.getInfo(id)
      const again = await Sandbox.connect(id, { onResume: 'reboot' })
      const sleeps = await again.commands.run('pgrep -x sleep || true')
      console.log(JSON.stringify({ paused, state: info.state, sleeps: sleeps.stdout,
                                   kept: await again.files.read('kept.txt') }))
    """
    got = server.js(js, sandbox.sandbox_id)
    assert got == {"paused": True, "state": "paused", "sleeps": "", "kept": "from node"}, got
