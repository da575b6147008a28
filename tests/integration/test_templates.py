"""Users' templates through E2B's own template builder (`Template.build` of the pinned SDK): each
RUN runs in a gVisor build sandbox, its layer is cached, and the template then starts sandboxes
like a built-in, with its files, env vars, user and workdir. Templates belong to their key."""

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from e2b import BuildException, Sandbox, Template, wait_for_file, wait_for_port

from harness import API_KEY, JS_DIR, build_messages as messages


def definition():
    """A fresh builder each time: the SDK's builder methods add to the template they are on."""
    return (
        Template()
        .from_template("base")
        .set_envs({"GREETING": "hello"})
        .run_cmd("mkdir -p /opt/app && echo built-$GREETING > /opt/app/marker "
                 "&& chown -R user:user /opt/app", user="root")
        .apt_install(["jq"])
        .set_workdir("/opt/app")
        .set_user("user")
        .run_cmd("whoami > whoami.txt && pwd > pwd.txt")
    )


def test_a_built_template_starts_sandboxes_with_its_files_env_user_and_workdir(names):
    name = names()
    logs = []
    Template.build(definition(), name, cpu_count=1, memory_mb=1024, on_build_logs=logs.append)
    assert any("[3/6] RUN (as root) apt-get update" in m for m in messages(logs)), messages(logs)

    sbx = Sandbox.create(name)
    try:
        run = sbx.commands.run(
            "cat /opt/app/marker /opt/app/whoami.txt /opt/app/pwd.txt; pwd; whoami; "
            "echo $GREETING; jq --version")
        lines = run.stdout.split()
        assert lines[:3] == ["built-hello", "user", "/opt/app"], run.stdout
        assert lines[3:6] == ["/opt/app", "user", "hello"], run.stdout
        assert lines[6].startswith("jq-"), run.stdout
        # The template is read-only under the sandbox: writes are the sandbox's own.
        sbx.commands.run("echo mine > /opt/app/marker")
    finally:
        sbx.kill()
    other = Sandbox.create(name)
    try:
        assert other.commands.run("cat /opt/app/marker").stdout.strip() == "built-hello"
    finally:
        other.kill()

    # The same definition again: every RUN comes from its cached layer.
    again = []
    Template.build(definition(), name, on_build_logs=again.append)
    assert messages(again).count("CACHED") == 3, messages(again)

    # A new last step runs; the ones before it come from the cache. (Layers outlive a test
    # run: the step names this run's template, so it is new.)
    changed = definition().run_cmd(f"echo {name} > changed.txt")
    third = []
    Template.build(changed, name, on_build_logs=third.append)
    assert messages(third).count("CACHED") == 3, messages(third)
    assert any(m.startswith("done in") for m in messages(third)), messages(third)
    sbx = Sandbox.create(name)
    try:
        assert sbx.commands.run("cat /opt/app/changed.txt").stdout.strip() == name
    finally:
        sbx.kill()


def test_a_template_builds_on_another_template(names):
    parent, child = names(), names()
    Template.build(Template().from_template("base").run_cmd("echo parent > /parent", user="root"),
                   parent)
    Template.build(Template().from_template(parent).run_cmd("echo child > /child", user="root"),
                   child)
    sbx = Sandbox.create(child)
    try:
        assert sbx.commands.run("cat /parent /child").stdout.split() == ["parent", "child"]
    finally:
        sbx.kill()


def test_a_failing_step_fails_the_build_with_its_command_exit_code_and_output(names):
    name = names()
    failing = (Template().from_template("base")
               .run_cmd("echo first")
               .run_cmd("echo about to fail; exit 3"))
    with pytest.raises(BuildException) as err:
        Template.build(failing, name)
    text = str(err.value)
    assert "step 2" in text and "exit code 3" in text and "about to fail" in text, text
    with pytest.raises(Exception) as err:
        Sandbox.create(name)
    assert "not found" in str(err.value).lower(), err.value
    assert not Template.exists(name)


@pytest.mark.server_only
def test_a_step_that_fills_the_disk_is_stopped_and_the_server_carries_on(
        server, names, restarted):
    """The server keeps `--build-min-free-mb` free on the templates disk: a step that writes
    past it is stopped, its build fails saying so, its half-written layer is gone, and builds
    and sandboxes carry on. (The reserve is set to just under what is free now, so that the
    test need not fill the real disk.)"""
    templates = Path(os.environ.get("AIRLOCK_TEMPLATES_DIR") or server.data_dir / "templates")
    free_mb = lambda: shutil.disk_usage(templates).free >> 20  # noqa: E731
    restarted("--build-min-free-mb", str(free_mb() - 300))
    before = free_mb()
    name = names()
    # 3 GB, ten times the room left: finishing it means the guard did not act.
    filler = (Template().from_template("base")
              .run_cmd("dd if=/dev/zero of=/home/user/big bs=1M count=3000"))
    with pytest.raises(BuildException) as err:
        Template.build(filler, name)
    text = str(err.value)
    assert "step 1" in text and "disk is nearly full" in text, text
    assert not Template.exists(name)
    assert free_mb() > before - 100, (before, free_mb())
    sbx = Sandbox.create("base")
    try:
        assert sbx.commands.run("echo still serving").stdout == "still serving\n"
    finally:
        sbx.kill()


@pytest.mark.server_only
def test_a_step_that_runs_past_its_timeout_fails_the_build(names, restarted):
    restarted("--build-step-timeout", "5")
    name = names()
    slow = Template().from_template("base").run_cmd("echo started; sleep 120")
    with pytest.raises(BuildException) as err:
        Template.build(slow, name)
    text = str(err.value)
    assert "step 1" in text and "did not finish within 5s" in text and "started" in text, text
    assert not Template.exists(name)


def test_templates_belong_to_their_key(names, other_key):
    mine = names()
    Template.build(Template().from_template("base").run_cmd("echo a > /owner", user="root"), mine)
    assert Template.exists(mine)
    assert not Template.exists(mine, api_key=other_key)
    with pytest.raises(Exception) as err:
        Sandbox.create(mine, api_key=other_key)
    assert "not found" in str(err.value).lower(), err.value

    # The other key may use the same name for its own template; each key gets its own.
    theirs = names(api_key=other_key)
    Template.build(Template().from_template("base").run_cmd("echo b > /owner", user="root"),
                   theirs, api_key=other_key)
    Template.build(Template().from_template("base").run_cmd("echo b > /owner", user="root"),
                   mine, api_key=other_key)
    for key, expected in [(None, "a"), (other_key, "b")]:
        kwargs = {"api_key": key} if key else {}
        sbx = Sandbox.create(mine, **kwargs)
        try:
            assert sbx.commands.run("cat /owner").stdout.strip() == expected
        finally:
            sbx.kill()
    # A delete by the other key removes its own template of that name, not this one.
    assert Sandbox.delete_snapshot(mine, api_key=other_key)
    assert Template.exists(mine)


@pytest.mark.parametrize("definition, expected", [
    (Template().from_template("no-such-template").run_cmd("true"), "not found"),
])
def test_what_cannot_be_built_is_refused_with_a_clear_message(names, definition, expected):
    with pytest.raises(BuildException) as err:
        Template.build(definition, names())
    assert expected in str(err.value), err.value


def test_a_built_in_name_is_taken(server):
    with pytest.raises(Exception) as err:
        Template.build(Template().from_template("base").run_cmd("true"), "base")
    assert "built-in" in str(err.value), err.value


def test_a_start_command_already_answers_on_the_first_request(server, names):
    name = names()
    logs = []
    served = (Template().from_template("base")
              .run_cmd("mkdir -p /srv/www && echo served-from-start > /srv/www/index.html",
                       user="root")
              .set_workdir("/srv/www")
              .set_start_cmd("python3 -m http.server 8080", wait_for_port(8080)))
    Template.build(served, name, on_build_logs=logs.append)
    assert any("START python3 -m http.server 8080" in m for m in messages(logs)), messages(logs)
    for _ in range(2):  # a pooled copy, then (the pool being refilled) possibly a restore
        sbx = Sandbox.create(name)
        try:
            # No wait and no retry: the server runs as the sandbox is handed over.
            assert server.sandbox_port(sbx.sandbox_id, 8080, "/index.html") == (200, "served-from-start\n")
            procs = sbx.commands.run("ps -o user=,args= -C python3").stdout
            assert "user" in procs and "http.server 8080" in procs, procs
        finally:
            sbx.kill()


def test_a_ready_command_alone_waits_for_what_it_names(names):
    name = names()
    ready_file = (Template().from_template("base")
                  .set_start_cmd("sleep 2 && echo up > /tmp/up && sleep infinity",
                                 wait_for_file("/tmp/up")))
    Template.build(ready_file, name)
    sbx = Sandbox.create(name)
    try:
        assert sbx.commands.run("cat /tmp/up").stdout.strip() == "up"
    finally:
        sbx.kill()


@pytest.mark.parametrize("start, expected, output", [
    # Exits before it is ever ready: its code and output are the message.
    ("echo cannot bind >&2; exit 7", "exited with code 7", "cannot bind"),
    # Runs, but what it waits for never comes (the server's test timeout is short).
    ("echo listening elsewhere; sleep infinity", "did not become ready", "listening elsewhere"),
])
def test_a_start_command_that_never_becomes_ready_fails_the_build(names, start, expected, output):
    name = names()
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_template("base").run_cmd("true")
                       .set_start_cmd(start, "false"), name)
    text = str(err.value)
    assert expected in text and output in text, text
    # Nothing of it is left to start sandboxes from.
    with pytest.raises(Exception) as err:
        Sandbox.create(name)
    assert "not found" in str(err.value).lower(), err.value


def test_copy_puts_files_in_place_with_owner_mode_and_symlinks(tmp_path, names):
    ctx = tmp_path / "ctx"
    (ctx / "app" / "lib").mkdir(parents=True)
    (ctx / "app" / "main.py").write_text("print('hi from app')\n")
    (ctx / "app" / "lib" / "util.py").write_text("X = 1\n")
    (ctx / "app" / ".hidden").write_text("dot\n")
    (ctx / "app" / "link").symlink_to("main.py")
    (ctx / "notes.txt").write_text("plain tar\n")
    (ctx / "run.sh").write_text("#!/bin/sh\necho run\n")
    name = names()
    t = (Template(file_context_path=str(ctx)).from_template("base")
         .copy("app/", "/app/")                                   # a directory's contents
         .copy("notes.txt", "/opt/notes/", gzip=False)            # a file into a directory
         .copy("run.sh", "bin/run", user="root", mode=0o750)      # relative to the workdir
         .copy("notes.txt", "/tmp/")                               # read by a later step
         .set_user("user")
         .run_cmd("python3 -m compileall -q /app && ls /app/__pycache__")
         .run_cmd("cp /tmp/notes.txt /home/user/from-tmp"))
    logs = []
    Template.build(t, name, on_build_logs=logs.append)
    assert any("COPY app/ /app/" in m for m in messages(logs)), messages(logs)
    sbx = Sandbox.create(name)
    try:
        out = sbx.commands.run(
            "python3 /app/main.py; cat /app/.hidden /opt/notes/notes.txt; readlink /app/link; "
            "stat -c '%U:%G %a %n' /app /app/lib/util.py /home/user/bin/run; "
            "/home/user/bin/run || echo not-run; cat /home/user/from-tmp", user="root").stdout
        assert out.splitlines() == [
            "hi from app", "dot", "plain tar", "main.py",
            "user:user 755 /app", "user:user 644 /app/lib/util.py",
            "root:root 750 /home/user/bin/run", "run", "plain tar"], out
        # Nothing of the upload is left in the template.
        assert sbx.commands.run("ls -a / | grep -c airlock || true").stdout.strip() == "0"
    finally:
        sbx.kill()

    # The same files again: the upload is skipped and the step comes from the cache.
    again = []
    Template.build(t, name, on_build_logs=again.append)
    assert any("already cached" in m for m in messages(again)), messages(again)
    assert sum("CACHED" in m for m in messages(again)) >= 3, messages(again)
    # Changed files: a new hash, uploaded and copied again.
    (ctx / "app" / "main.py").write_text("print('changed')\n")
    Template.build(t, name)
    sbx = Sandbox.create(name)
    try:
        assert sbx.commands.run("python3 /app/main.py").stdout.strip() == "changed"
    finally:
        sbx.kill()


def test_an_upload_link_works_once_and_only_for_its_template(server, names):
    name = names()
    status, created = server.api("POST", "/v3/templates", {"name": name})
    assert status == 202, created
    tid, digest = created["templateID"], "ab" * 32
    status, link = server.api("GET", f"/templates/{tid}/files/{digest}")
    assert status == 201 and link["present"] is False, link
    url = link["url"].replace(server.url, "")
    assert url.startswith("/uploads/"), link
    status, body = server.api("PUT", url, raw=b"not really a tar", key=None)
    assert status == 200 and body == {"size": 16}, body
    status, body = server.api("PUT", url, raw=b"again", key=None)
    assert status == 403 and body["code"] == 403 and "used" in body["message"], body
    status, link = server.api("GET", f"/templates/{tid}/files/{digest}")
    assert status == 201 and link["present"] is True, link
    status, body = server.api("GET", f"/templates/{tid}/files/not-a-hash")
    assert status == 400 and "hash" in body["message"], body
    status, body = server.api("PUT", "/uploads/made-up", raw=b"x", key=None)
    assert status == 403, body


def test_a_copy_whose_files_were_not_uploaded_fails_at_its_step(server, names):
    name = names()
    status, created = server.api("POST", "/v3/templates", {"name": name})
    assert status == 202, created
    tid, bid = created["templateID"], created["buildID"]
    steps = [{"type": "COPY", "args": ["app", "/app/", "", ""], "filesHash": "cd" * 32,
              "force": False}]
    status, body = server.api("POST", f"/v2/templates/{tid}/builds/{bid}",
                              {"fromTemplate": "base", "steps": steps, "force": False})
    assert status == 202, body
    for _ in range(600):
        status, info = server.api("GET", f"/templates/{tid}/builds/{bid}/status")
        if info["status"] == "error":
            break
        time.sleep(0.1)
    assert info["reason"]["step"] == "1", info
    assert "never uploaded" in info["reason"]["message"], info


def test_another_keys_cached_copy_needs_its_own_upload(server, names, other_key):
    """Layers are shared between keys, a COPY's by its files' hash. A key that names another
    key's hash without uploading the files itself must not get them from the cache."""
    secret = b"the owner's secret\n"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("secret.txt")
        info.size = len(secret)
        tar.addfile(info, io.BytesIO(secret))
    digest = uuid.uuid4().hex * 2  # a fresh 64-hex hash: no earlier layer has it
    steps = [{"type": "COPY", "args": ["secret.txt", "/opt/secret.txt", "", ""],
              "filesHash": digest, "force": False}]

    def build(name, key, upload):
        status, created = server.api("POST", "/v3/templates", {"name": name}, key=key)
        assert status == 202, created
        tid, bid = created["templateID"], created["buildID"]
        if upload:
            status, link = server.api("GET", f"/templates/{tid}/files/{digest}", key=key)
            status, body = server.api("PUT", link["url"].replace(server.url, ""),
                                      raw=archive.getvalue(), key=None)
            assert status == 200, body
        status, body = server.api("POST", f"/v2/templates/{tid}/builds/{bid}",
                                  {"fromTemplate": "base", "steps": steps, "force": False},
                                  key=key)
        assert status == 202, body
        for _ in range(3000):
            status, info = server.api("GET", f"/templates/{tid}/builds/{bid}/status", key=key)
            if info["status"] in ("ready", "error"):
                return info
            time.sleep(0.1)
        raise AssertionError(f"build {bid} did not finish: {info}")

    owner = names()
    assert build(owner, API_KEY, upload=True)["status"] == "ready"
    # Positive control: the owner's template has the file the other key is after.
    sbx = Sandbox.create(owner)
    try:
        assert sbx.commands.run("cat /opt/secret.txt").stdout.encode() == secret
    finally:
        sbx.kill()
    thief = build(names(other_key), other_key, upload=False)
    assert thief["status"] == "error" and "never uploaded" in thief["reason"]["message"], thief


def test_a_template_on_the_code_interpreter_runs_code_with_its_packages(names):
    from e2b_code_interpreter import Sandbox as CodeSandbox

    name = names()
    Template.build(Template().from_template("code-interpreter-v1").pip_install(["tabulate"]),
                   name)
    sbx = CodeSandbox.create(name)
    try:
        run = sbx.run_code("import tabulate\nprint(tabulate.tabulate([[1, 2]]))")
        assert run.error is None, run.error
        assert "1  2" in "".join(run.logs.stdout), run.logs
    finally:
        sbx.kill()


def test_base_has_what_e2bs_base_has(sandbox):
    run = sandbox.commands.run(
        # (sudo itself is refused by the sandbox's no-new-privileges flag for now)
        "git --version && pip --version && curl --version | head -1 && command -v sudo && "
        "ls /etc/ssl/certs/ca-certificates.crt")
    assert run.exit_code == 0 and "git version" in run.stdout and "pip " in run.stdout, run
    # `python` is python3, as in E2B's base: scripts and tests call it by that name.
    python = sandbox.commands.run("python -c 'import sys; print(sys.version_info[0])' && "
                                  "readlink -f $(command -v python) $(command -v python3)")
    major, resolved, resolved3 = python.stdout.split()
    assert major == "3" and resolved == resolved3, python.stdout


def test_templates_are_listed_got_logged_and_made_public_through_the_sdks_client(
        server, names, other_key):
    from e2b import ConnectionConfig
    from e2b.api.client.api.templates import (
        get_templates, get_templates_template_id, get_templates_template_id_builds_build_id_logs,
        get_v2_templates, patch_v_2_templates_template_id)
    from e2b.api.client.models import LogLevel, LogsDirection, TemplateUpdateRequest
    from e2b.api.client_sync import get_api_client

    name, marker = names(), f"logged-{uuid.uuid4().hex}"
    info = Template.build(Template().from_template("base").run_cmd(
        f"echo shared > /shared && echo {marker}", user="root"), name)
    client = get_api_client(ConnectionConfig())

    # Its log through E2B's log route: the status route's entries, in time order, paged by
    # time and filtered by level (a build that succeeded logged no error).
    def build_log(client=client, **query):
        return get_templates_template_id_builds_build_id_logs.sync_detailed(
            info.template_id, info.build_id, client=client, **query)

    res = build_log(limit=1000)
    assert res.status_code == 200, res
    logged = [(e.timestamp, e.message) for e in res.parsed.logs]
    _, status = server.api("GET", f"/templates/{info.template_id}/builds/{info.build_id}/status"
                                  "?limit=1000")
    assert [m for _, m in logged] == [e["message"] for e in status["logEntries"]]
    assert any(marker in m for _, m in logged) and logged == sorted(logged, key=lambda e: e[0])
    last = build_log(direction=LogsDirection.BACKWARD, limit=1).parsed.logs
    assert [(e.timestamp, e.message) for e in last] == logged[-1:]
    assert build_log(level=LogLevel.ERROR).parsed.logs == []
    assert build_log(client=get_api_client(ConnectionConfig(api_key=other_key))).status_code == 404

    listed = get_v2_templates.sync(client=client)
    mine = [t for t in listed if name in t.names]
    assert len(mine) == 1 and mine[0].build_status.value == "ready", listed
    assert mine[0].template_id == info.template_id and mine[0].public is False
    assert [t.template_id for t in get_templates.sync(client=client)
            if name in t.names] == [info.template_id]
    got = get_templates_template_id.sync(info.template_id, client=client)
    assert [str(b.build_id) for b in got.builds] == [info.build_id], got
    assert got.builds[0].status.value == "ready"

    # Another key neither lists nor uses it, until it is made public.
    other = get_api_client(ConnectionConfig(api_key=other_key))
    assert not [t for t in get_v2_templates.sync(client=other) if name in t.names]
    with pytest.raises(Exception):
        Sandbox.create(name, api_key=other_key)
    updated = patch_v_2_templates_template_id.sync(
        info.template_id, client=client, body=TemplateUpdateRequest(public=True))
    namespaced = f"{hashlib.sha256(API_KEY.encode()).hexdigest()[:12]}/{name}"
    assert updated.names == [name, namespaced]
    # Other keys name it with its owner's namespace: a bare name is always their own.
    with pytest.raises(Exception):
        Sandbox.create(name, api_key=other_key)
    sbx = Sandbox.create(namespaced, api_key=other_key)
    try:
        assert sbx.commands.run("cat /shared").stdout.strip() == "shared"
    finally:
        sbx.kill()
    # Public is for use, not for change: the other key cannot delete or change it.
    assert not Sandbox.delete_snapshot(name, api_key=other_key)
    res = patch_v_2_templates_template_id.sync_detailed(
        info.template_id, client=other, body=TemplateUpdateRequest(public=False))
    assert res.status_code == 404
    assert Template.exists(name)




def test_the_js_sdks_builder_builds_and_starts_a_template(server, names, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("hello from a js-built template\n")
    name = names()
    env = dict(os.environ, E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
    out = subprocess.run(
        ["node", str(JS_DIR / "template_build.mjs"), name, str(tmp_path), f"127.0.0.1:{server.port}"],
        cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["exists"] is True, result
    assert any("START python3 -m http.server 8080" in m for m in result["logs"]), result["logs"]
    assert result["first"] == {"status": 200, "body": "hello from a js-built template\n"}, result
    assert result["stdout"].split() == ["/srv/site", "hello-from-js", "hello-from-js"], result


@pytest.mark.server_only
def test_files_nothing_uses_are_collected_at_start_and_used_ones_kept(names, restarted):
    """A rebuild leaves the old build startable by its id (among the 10 kept), so a restart keeps
    its layer. A deleted template's layer is still used while a paused sandbox runs on it: a
    restart keeps it (the paused sandbox resumes on it), and once that sandbox is gone the next
    restart collects it. Layers are found by the file each step wrote."""
    layers = Path(os.environ["AIRLOCK_TEMPLATES_DIR"]) / "layers"
    tag = uuid.uuid4().hex[:12]

    def layer_with(what):
        return list(layers.glob(f"*/opt/{tag}-{what}"))

    def build(name, what):
        return Template.build(Template().from_template("base")
                              .run_cmd(f"touch /opt/{tag}-{what}", user="root"), name)

    def files(reference):
        sbx = Sandbox.create(reference)
        try:
            return sbx.commands.run(f"ls /opt/ | grep {tag}").stdout.split()
        finally:
            sbx.kill()

    rebuilt, deleted = names(), names()
    old = build(rebuilt, "old")
    build(rebuilt, "new")
    build(deleted, "paused")
    paused = Sandbox.create(deleted)
    try:
        assert paused.pause() is True
        assert Sandbox.delete_snapshot(deleted)
        assert layer_with("old") and layer_with("new") and layer_with("paused")

        restarted()
        assert layer_with("old") and layer_with("new") and layer_with("paused")
        paused.connect()
        assert paused.commands.run(f"ls /opt/{tag}-paused").exit_code == 0
    finally:
        paused.kill()
    assert files(rebuilt) == [f"{tag}-new"]
    assert files(f"{rebuilt}:{old.build_id}") == [f"{tag}-old"]

    restarted()
    assert not layer_with("paused"), "collected once no sandbox runs on it"
    assert layer_with("new")
