"""Auto-resume through the proxy: a paused sandbox created with
`lifecycle={"auto_resume": True}` is resumed by a request for one of its ports or for envd, and
the request is served. Requests that could not use it wake nothing."""

import shutil
import threading
import time

import pytest
from e2b import Sandbox, SandboxState

AUTO = {"on_timeout": "pause", "auto_resume": True}


def state_of(sbx):
    return Sandbox.get_info(sbx.sandbox_id).state


def get(server, sbx, port, path="/", headers=None):
    return server.sandbox_port(sbx.sandbox_id, port, path, headers=headers)


def serve_files(sbx):
    sbx.files.write("www/index.html", "served after a pause")
    sbx.commands.run("cd www && python3 -m http.server 8000", background=True)
    deadline = time.time() + 10
    while time.time() < deadline:
        if sbx.commands.run("curl -s localhost:8000/index.html || true").stdout:
            return
        time.sleep(0.2)
    raise AssertionError("the file server did not start")


def test_traffic_to_a_port_resumes_the_sandbox(server, sandbox_factory):
    sbx = sandbox_factory(lifecycle=AUTO)
    serve_files(sbx)
    sbx.pause()
    assert state_of(sbx) == SandboxState.PAUSED
    # The server inside was paused with the sandbox, and answers the request that woke it.
    assert get(server, sbx, 8000, "/index.html") == (200, "served after a pause")
    assert state_of(sbx) == SandboxState.RUNNING


def test_envd_traffic_with_the_token_resumes_and_without_it_does_not(server, sandbox_factory):
    sbx = sandbox_factory(lifecycle=AUTO)
    sbx.files.write("note.txt", "kept")
    sbx.pause()
    # Without the sandbox's access token nothing wakes.
    status, _ = get(server, sbx, 49983, "/files?path=/home/user/note.txt")
    assert status == 502 and state_of(sbx) == SandboxState.PAUSED
    # The SDK's own envd calls carry it: a read resumes the sandbox and is answered.
    assert sbx.files.read("note.txt") == "kept"
    assert state_of(sbx) == SandboxState.RUNNING


def test_only_sandboxes_that_asked_for_it_resume(server, sandbox_factory):
    plain = sandbox_factory(lifecycle={"on_timeout": "pause"})
    serve_files(plain)
    plain.pause()
    status, body = get(server, plain, 8000, "/index.html")
    assert status == 502 and "not found" in body, body
    assert state_of(plain) == SandboxState.PAUSED

    # A private port needs its traffic token before it wakes anything.
    status, created = server.api("POST", "/v2/sandboxes", {
        "templateID": "base", "autoPause": True, "autoResume": {"enabled": True},
        "network": {"allowPublicTraffic": False}})
    assert status == 201, created
    private = Sandbox.connect(created["sandboxID"])
    try:
        serve_files(private)
        private.pause()
        status, _ = get(server, private, 8000, "/index.html")
        assert status == 502 and state_of(private) == SandboxState.PAUSED
        token = {"E2B-Traffic-Access-Token": created["trafficAccessToken"]}
        assert get(server, private, 8000, "/index.html", token) == (200, "served after a pause")
    finally:
        private.kill()


@pytest.mark.newest_sdk
def test_a_files_only_pause_is_not_resumed_by_traffic(server, sandbox_factory):
    # Such a sandbox starts afresh, which a request in flight cannot expect.
    sbx = sandbox_factory(lifecycle=AUTO)
    sbx.pause(mode="filesystem")
    status, body = get(server, sbx, 8000)
    assert status == 409 and "connect" in body, body
    assert state_of(sbx) == SandboxState.PAUSED


@pytest.mark.newest_sdk
def test_a_command_streaming_through_a_pause_ends_and_wakes_nothing(sandbox_factory):
    """A pause ends a command's stream as a kill does, with E2B's "was not found" (no broken
    read for the SDK to probe the sandbox about), and nothing of that resumes the sandbox."""
    from e2b.exceptions import SandboxNotRunningException

    sbx = sandbox_factory(lifecycle=AUTO)
    pauser = threading.Timer(1, sbx.pause)
    pauser.start()
    try:
        with pytest.raises(SandboxNotRunningException) as exc:
            sbx.commands.run("while true; do echo tick; sleep 0.05; done", timeout=60)
    finally:
        pauser.join()
    assert "was not found" in str(exc.value), exc.value
    assert state_of(sbx) == SandboxState.PAUSED


def test_a_sandbox_whose_image_is_gone_says_so(server, sandbox_factory):
    sbx = sandbox_factory(lifecycle=AUTO)
    sbx.pause()
    images = server.data_dir / "gvisor" / "images"
    [image] = [p for p in images.iterdir() if sbx.sandbox_id in p.name]
    shutil.rmtree(image)
    status, body = get(server, sbx, 8000)
    assert status == 500 and "paused image is gone" in body and sbx.sandbox_id in body, body
    # It is still reported, as paused, and can be killed.
    assert state_of(sbx) == SandboxState.PAUSED
    status, body = server.api("POST", f"/sandboxes/{sbx.sandbox_id}/resume", {})
    assert status == 500 and "paused image is gone" in body["message"], body
    sbx.kill()


def test_auto_resume_from_node(server):
    js = """
      import { Sandbox } from 'e2b'
      const sbx = await Sandbox.create('base', { lifecycle: { onTimeout: 'pause', autoResume: true } })
      await sbx.files.write('f.txt', 'woken by node')
      await sbx.pause()
      const before = (await Sandbox.getInfo(sbx.sandboxId)).state
      const text = await sbx.files.read('f.txt')
      const after = (await Sandbox.getInfo(sbx.sandboxId)).state
      await sbx.kill()
      console.log(JSON.stringify({ before, text, after }))
    """
    got = server.js(js)
    assert got == {"before": "paused", "text": "woken by node", "after": "running"}, got
