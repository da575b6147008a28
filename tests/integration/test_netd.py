"""The network services and the network plan against hostile sandboxes: `airlock-netd` runs
unprivileged and comes back when killed; one sandbox cannot use up the others' share of it; a
restart leaves no moment in which a sandbox is unconfined, and a policy change cuts what it
forbids at once; a dead sandbox's connections die with it; and addresses are not handed out
again after a restart. Every probe has a positive control."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2b import ALL_TRAFFIC, Sandbox

from conftest import slot
from test_network import HEAD, HTTP, NAME, probe, target  # noqa: F401


def pid_of(name):
    out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def status(pid):
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())


def test_netd_runs_as_its_own_user_without_privilege(server):
    [netd] = pid_of("airlock-netd")
    mine = status(netd)
    theirs = status(server.proc.pid)
    # The control: the same fields of the root server read as root's.
    assert theirs["Uid"].split()[0] == "0" and int(theirs["CapEff"].strip(), 16) != 0
    assert mine["Uid"].split()[0] != "0", "not root"
    assert int(mine["CapEff"].strip(), 16) == 0 and int(mine["CapPrm"].strip(), 16) == 0, "no capabilities"
    assert mine["NoNewPrivs"].strip() == "1"
    assert mine["Seccomp"].strip() == "2", "a seccomp filter"
    open_fds = os.listdir(f"/proc/{netd}/fd")
    assert "6" not in open_fds or len(open_fds) < 64, "it inherits nothing of the server's"


def test_netd_comes_back_and_the_server_carries_on(server, sandbox, target):
    assert probe(sandbox, f"resolve({NAME!r})") == [target], "the control"
    [netd] = pid_of("airlock-netd")
    os.kill(netd, signal.SIGKILL)
    for _ in range(100):
        again = pid_of("airlock-netd")
        if again and again != [netd]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("airlock-netd was not started again")
    # It knows the running sandbox's policy again: its DNS works.
    for _ in range(50):
        if probe(sandbox, f"resolve({NAME!r})") == [target]:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("sandbox DNS did not come back")
    assert sandbox.commands.run("echo alive").stdout == "alive\n"


HOG = r'''
import json, socket, time

def opened():
    try:
        s = socket.create_connection((TARGET, 443), timeout=5)
        s.setblocking(False)
        return s
    except OSError:
        return None

def alive(s):
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False

held = [opened() for _ in range(COUNT)]
time.sleep(1)
held = [s for s in held if s is not None and alive(s)]
with open("/tmp/hog.json", "w") as out:
    json.dump({"held": len(held), "closed": COUNT - len(held)}, out)
open("/tmp/holding", "w").close()
# Then keeps as many open as it can, opening a new one for each the proxy closes.
while True:
    held = [s for s in held if alive(s)]
    held += [s for s in (opened() for _ in range(COUNT - len(held))) if s is not None]
    time.sleep(0.5)
'''


def start_hog(sbx, target, count):
    sbx.files.write("/tmp/hog.py", f"TARGET, COUNT = {target!r}, {count}\n" + HOG)
    sbx.commands.run("python3 /tmp/hog.py", background=True)
    for _ in range(300):
        if sbx.files.exists("/tmp/holding"):
            return json.loads(sbx.files.read("/tmp/hog.json"))
        time.sleep(0.1)
    raise AssertionError("the hog never got going")


def test_one_sandbox_cannot_use_up_the_proxy(sandbox_factory, target):
    rules = {"allow_out": [NAME], "deny_out": [ALL_TRAFFIC]}
    hog, neighbour = sandbox_factory(network=rules), sandbox_factory(network=rules)
    counts = start_hog(hog, target, 400)
    # The sandbox's share: 256 connections at once (netd's sandboxes.rs), all of them held (so
    # the share is really used up); the rest are closed.
    assert counts == {"held": 256, "closed": 400 - 256}, counts
    # The neighbour's named connections go through while the hog holds its share, and so do
    # its DNS answers.
    assert probe(neighbour, f"tls({target!r}, 443, {NAME!r})") == [HTTP]
    assert probe(neighbour, f"resolve({NAME!r})") == [target]


WATCH = r'''
import socket, sys, time
# Tries a connection every 50 ms for as long as it runs, and writes down each that works.
with open(sys.argv[1], "a") as log:
    while True:
        try:
            socket.create_connection((TARGET, 8080), timeout=0.5).close()
            log.write(f"{time.time()} connected\n")
            log.flush()
        except OSError:
            pass
        time.sleep(0.05)
'''


def test_a_restart_leaves_no_moment_unconfined(server, sandbox_factory, outside):
    closed = sandbox_factory(allow_internet_access=False, timeout=600)
    open_ = sandbox_factory(timeout=600)
    for sbx in (closed, open_):
        sbx.files.write("/tmp/watch.py", f"TARGET = {outside.public!r}\n" + WATCH)
        sbx.commands.run("python3 /tmp/watch.py /tmp/log", background=True)
    time.sleep(1)
    server.stop(sig=signal.SIGKILL)
    restarted = time.time()
    server.start()
    time.sleep(2)
    closed_log, open_log = closed.files.read("/tmp/log"), open_.files.read("/tmp/log")
    # The control: the same watcher in a sandbox without rules connects, across the restart too.
    assert any(float(line.split()[0]) > restarted for line in open_log.splitlines()), open_log[-300:]
    assert closed_log == "", f"the closed sandbox got out: {closed_log[:300]}"


SECOND_REQUEST = HEAD + r'''
import os, socket, time
s = socket.create_connection((TARGET, 8080), timeout=5)
open("/tmp/first", "w").write("answered" if head(s, NAME).isdigit() else "not answered")
while not os.path.exists("/tmp/go"):
    time.sleep(0.05)
try:
    result = "answered" if head(s, NAME).isdigit() else "closed"
except OSError as e:
    result = type(e).__name__
open("/tmp/second", "w").write(result)
'''


@pytest.mark.parametrize("change", [False, True])
def test_a_policy_change_cuts_the_flows_it_forbids(sandbox, outside, change):
    sandbox.files.write("/tmp/two.py", f"TARGET, NAME = {outside.public!r}, {NAME!r}\n" + SECOND_REQUEST)
    sandbox.commands.run("python3 /tmp/two.py", background=True)
    for _ in range(100):
        if sandbox.files.exists("/tmp/first"):
            break
        time.sleep(0.1)
    assert sandbox.files.read("/tmp/first") == "answered"
    if change:
        sandbox.update_network({"deny_out": [ALL_TRAFFIC]})
    sandbox.files.write("/tmp/go", "")
    for _ in range(150):
        if sandbox.files.exists("/tmp/second"):
            break
        time.sleep(0.1)
    second = sandbox.files.read("/tmp/second") if sandbox.files.exists("/tmp/second") else "no answer"
    if change:
        assert second != "answered", "the established connection outlived the policy that forbids it"
    else:
        assert second == "answered", "the control: the same connection works without a change"


def host_sockets_to(addr):
    out = subprocess.run(["ss", "-tan", "dst", addr], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if line.strip()]


def test_a_dead_sandboxs_connections_die_with_it(sandbox_factory, outside):
    hog = sandbox_factory(network={"allow_out": [NAME], "deny_out": [ALL_TRAFFIC]})
    addr = hog.commands.run("hostname -I").stdout.split()[0]
    start_hog(hog, outside.public, 200)
    assert len(host_sockets_to(addr)) >= 100, "the control: the host holds its connections"
    hog.kill()
    for _ in range(100):
        if not host_sockets_to(addr):
            break
        time.sleep(0.1)
    assert host_sockets_to(addr) == [], host_sockets_to(addr)[:5]
    # The kill's teardown forgets the flows after the sockets: wait for it as well.
    for _ in range(100):
        flows = subprocess.run(["conntrack", "-L", "--orig-src", addr],
                               capture_output=True, text=True).stdout.strip()
        if not flows:
            break
        time.sleep(0.1)
    assert flows == "", flows[:300]


def test_addresses_are_not_handed_out_again_after_a_restart(server):
    def slot_of(sbx):
        return slot(sbx.commands.run("hostname -I").stdout.split()[0])

    before = Sandbox.create("base")
    last = slot_of(before)
    before.kill()
    server.stop(sig=signal.SIGKILL)
    server.start()
    after = Sandbox.create("base")
    try:
        assert slot_of(after) > last, "the next run went on where the last one stopped"
    finally:
        after.kill()
