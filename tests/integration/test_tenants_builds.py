"""One key must not hold the template builder or the templates disk from the others: builds
take turns fairly between keys, each key has a bounded number of builds and templates and a
share of the disk, a build has a deadline, and its owner can cancel it while it waits or runs.
Each limit is shown refusing with its status and a message that names it, beside the same call
under the limit succeeding."""

import subprocess
import time
import uuid

from e2b import Sandbox, Template

from harness import AIRLOCK, API_KEY


def start_build(server, name, steps, key=API_KEY):
    """Requests and starts a build over the raw API; returns (template id, build id)."""
    status, created = server.api("POST", "/v3/templates", {"name": name}, key=key)
    assert status == 202, created
    tid, bid = created["templateID"], created["buildID"]
    status, body = server.api("POST", f"/v2/templates/{tid}/builds/{bid}",
                              {"fromTemplate": "base", "steps": steps, "force": False}, key=key)
    assert status == 202, body
    return tid, bid


def run(command):
    return [{"type": "RUN", "args": [command], "force": False}]


def status_of(server, tid, bid, key=API_KEY):
    status, info = server.api("GET", f"/templates/{tid}/builds/{bid}/status", key=key)
    assert status == 200, info
    return info


def wait_for(server, tid, bid, wanted, key=API_KEY, seconds=120):
    for _ in range(seconds * 10):
        info = status_of(server, tid, bid, key)
        if info["status"] in wanted:
            return info
        time.sleep(0.1)
    raise AssertionError(f"build {bid} never reached {wanted}: {info}")


def test_a_running_build_is_cancelled_at_once_and_frees_its_turn(server, names):
    tid, bid = start_build(server, names(), run(f"echo {uuid.uuid4().hex}; sleep 600"))
    wait_for(server, tid, bid, ["building"])
    time.sleep(3)  # into the step's sandbox
    status, body = server.api("DELETE", f"/templates/{tid}/builds/{bid}")
    assert status == 204, body
    info = wait_for(server, tid, bid, ["error"], seconds=20)
    assert "cancelled" in info["reason"]["message"], info
    # Again: it has ended, which is a conflict, not a second cancel.
    status, body = server.api("DELETE", f"/templates/{tid}/builds/{bid}")
    assert status == 409 and "already ended" in body["message"], body
    # The turn is free: the next build runs to its end.
    name = names()
    Template.build(Template().from_template("base").run_cmd(f"echo {uuid.uuid4().hex}"), name)
    assert Template.exists(name)


def test_the_cli_cancels_a_waiting_build(server, names):
    first = start_build(server, names(), run(f"echo {uuid.uuid4().hex}; sleep 600"))
    waiting = start_build(server, names(), run("true"))
    wait_for(server, *first, ["building"])
    assert status_of(server, *waiting)["status"] == "waiting"
    for tid, bid in (waiting, first):
        out = subprocess.run([str(AIRLOCK), "--url", server.url, "--api-key", API_KEY,
                              "template", "cancel", tid, bid],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert wait_for(server, tid, bid, ["error"], seconds=20)["reason"]["message"] \
            == "the build was cancelled"


def test_another_key_cannot_cancel_or_see_a_build(server, names, other_key):
    tid, bid = start_build(server, names(), run(f"echo {uuid.uuid4().hex}; sleep 600"))
    try:
        status, body = server.api("DELETE", f"/templates/{tid}/builds/{bid}", key=other_key)
        assert status == 404 and body["code"] == 404, body
        assert status_of(server, tid, bid)["status"] in ("waiting", "building")
    finally:
        assert server.api("DELETE", f"/templates/{tid}/builds/{bid}")[0] == 204


def test_turns_go_to_the_key_with_fewest_builds_running(server, names, other_key):
    """The flood's builds were asked first, yet the other key's goes next."""
    sleep = run(f"echo {uuid.uuid4().hex}; sleep 600")
    flood = [start_build(server, names(), sleep) for _ in range(3)]
    other = start_build(server, names(other_key), run(f"echo {uuid.uuid4().hex}"), key=other_key)
    try:
        wait_for(server, *flood[0], ["building"])
        assert server.api("DELETE", "/templates/{}/builds/{}".format(*flood[0]))[0] == 204
        assert wait_for(server, *other, ["ready", "error"], key=other_key)["status"] == "ready"
        assert status_of(server, *flood[2])["status"] == "waiting"
    finally:
        for tid, bid in flood:
            server.api("DELETE", f"/templates/{tid}/builds/{bid}")


def test_a_keys_builds_templates_disk_and_time_are_bounded(server, restarted, names, other_key):
    restarted("--key-max-builds", "2", "--key-max-templates", "3",
              "--key-max-template-storage-mb", "40", "--build-timeout-secs", "20")
    # Builds at once: the third of one key is refused; another key's is not.
    sleep = run(f"echo {uuid.uuid4().hex}; sleep 600")
    held = [start_build(server, names(), sleep) for _ in range(2)]
    status, created = server.api("POST", "/v3/templates", {"name": names()})
    assert status == 202, created
    status, body = server.api(
        "POST", f"/v2/templates/{created['templateID']}/builds/{created['buildID']}",
        {"fromTemplate": "base", "steps": run("true"), "force": False})
    assert status == 429 and "--key-max-builds" in body["message"], body
    # The deadline: the running one is stopped after 20 s.
    info = wait_for(server, *held[0], ["error"], seconds=60)
    assert "--build-timeout-secs" in info["reason"]["message"], info
    server.api("DELETE", "/templates/{}/builds/{}".format(*held[1]))
    wait_for(server, *held[1], ["error"], seconds=60)

    # Templates: the key has three now; a fourth name is refused, a new build of one is not.
    status, body = server.api("POST", "/v3/templates", {"name": names()})
    assert status == 429 and "--key-max-templates" in body["message"], body
    status, again = server.api("POST", "/v3/templates", {"name": created["names"][0]})
    assert status == 202, again

    # Disk: a step that writes past the key's 40 MiB fails and says why; another key builds on.
    tid, bid = again["templateID"], again["buildID"]
    status, body = server.api(
        "POST", f"/v2/templates/{tid}/builds/{bid}",
        {"fromTemplate": "base", "force": False,
         "steps": run(f"head -c 60000000 /dev/urandom > /home/user/big && echo {uuid.uuid4().hex}")})
    assert status == 202, body
    info = wait_for(server, tid, bid, ["ready", "error"])
    assert info["status"] == "error" and "--key-max-template-storage-mb" in \
        info["reason"]["message"], info
    theirs = names(other_key)
    Template.build(Template().from_template("base")
                   .run_cmd("head -c 30000000 /dev/urandom > /home/user/f"),
                   theirs, api_key=other_key)
    sbx = Sandbox.create(theirs, api_key=other_key)
    try:
        assert sbx.commands.run("stat -c %s /home/user/f").stdout.strip() == "30000000"
    finally:
        sbx.kill()
