"""Restart after `kill -9`: every sandbox is adopted (and works) or removed, and nothing leaks.
A clean shutdown leaves no runsc process, netns or veth behind."""

import signal

from e2b import Sandbox

from conftest import host_leftovers


def test_kill_9_then_restart_adopts_and_leaks_nothing(server):
    survivor = Sandbox.create("base", metadata={"restart": "survivor"})
    survivor.files.write("/home/user/kept.txt", "still here")
    doomed = Sandbox.create("base", metadata={"restart": "doomed"})

    server.stop(sig=signal.SIGKILL)
    # While the server is down one sandbox dies on its own (as after a host hiccup).
    import subprocess
    subprocess.run(["runsc", "--root", str(server.data_dir / "gvisor" / "runsc"), "kill", doomed.sandbox_id, "KILL"], check=False)
    server.start()

    again = Sandbox.connect(survivor.sandbox_id)
    assert again.files.read("/home/user/kept.txt") == "still here"
    assert again.commands.run("echo adopted").stdout == "adopted\n"
    listed = {s.sandbox_id for s in Sandbox.list().next_items()}
    assert survivor.sandbox_id in listed
    assert doomed.sandbox_id not in listed
    left = host_leftovers(server.data_dir)
    assert not any(doomed.sandbox_id in n for n in left["netns"])
    survivor.kill()


def test_clean_shutdown_leaves_nothing(server):
    for _ in range(2):
        Sandbox.create("base", metadata={"shutdown": "yes"})
    server.stop(sig=signal.SIGTERM)
    try:
        assert host_leftovers(server.data_dir) == {"netns": [], "links": [], "runsc": [], "mounts": []}
    finally:
        server.start()
