"""Tenants against each other through template builds, with the stock SDK: one key must not put
its files into another key's template through the layer cache, learn or take what another key's
build made, shadow another key's names with a public template, or take the builder from the
others; a forced rebuild must not take files away from templates and sandboxes that use the
layers it rebuilt. Each attack has a positive control beside it: the legitimate path works, so
the probe could see a leak."""

import hashlib
import json
import uuid

import pytest
from e2b import Sandbox, Template

from harness import API_KEY, build_messages as messages


def key_id(key):
    """A key's public id (its namespace): the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def read(template, path, api_key=API_KEY):
    sbx = Sandbox.create(template, api_key=api_key)
    try:
        return sbx.commands.run(f"cat {path}").stdout
    finally:
        sbx.kill()


def test_a_copy_uploaded_under_another_keys_files_hash_never_reaches_its_builds(
        tmp_path, names, other_key, monkeypatch):
    import e2b.template.main as builder

    # The victim's build context, which the attacker can read (a public repository).
    victim_ctx = tmp_path / "victim"
    victim_ctx.mkdir()
    (victim_ctx / "kernel.json").write_text('{"argv": ["python3"]}\n')
    evil_ctx = tmp_path / "evil"
    evil_ctx.mkdir()
    (evil_ctx / "kernel.json").write_text('{"argv": ["sh", "-c", "steal"]}\n')
    marker = uuid.uuid4().hex  # makes the step new to this run's layer cache

    def definition(ctx):
        return (Template(file_context_path=str(ctx)).from_template("base")
                .run_cmd(f"echo {marker}")
                .copy("kernel.json", "/opt/kernel/"))

    # The attacker computes the victim's files hash as the SDK does, then uploads its own
    # files under it: the stock SDK, with only its hash function replaced.
    steps = json.loads(Template.to_json(definition(victim_ctx)))["steps"]
    victims_hash = next(s["filesHash"] for s in steps if s["type"] == "COPY")
    real_hash = builder.calculate_files_hash
    monkeypatch.setattr(builder, "calculate_files_hash", lambda *a, **k: victims_hash)
    evil = names(other_key)
    Template.build(definition(evil_ctx), evil, api_key=other_key)
    assert "steal" in read(evil, "/opt/kernel/kernel.json", other_key), "the attack built"
    monkeypatch.setattr(builder, "calculate_files_hash", real_hash)

    # The victim's build of its own files gets its own files, never the attacker's.
    victim = names()
    logs = []
    Template.build(definition(victim_ctx), victim, on_build_logs=logs.append)
    assert read(victim, "/opt/kernel/kernel.json") == '{"argv": ["python3"]}\n', messages(logs)
    # Positive control: the victim's own rebuild of the same files is cached.
    again = []
    Template.build(definition(victim_ctx), victim, on_build_logs=again.append)
    assert sum("CACHED" in m for m in messages(again)) == 2, messages(again)


def test_a_forced_rebuild_leaves_the_layers_others_use_as_they_are(names):
    marker = uuid.uuid4().hex

    def definition():
        return (Template().from_template("base")
                .run_cmd(f"echo {marker} > /home/user/made.txt", user="root"))

    first, sibling = names(), names()
    Template.build(definition(), first)
    Template.build(definition().run_cmd("echo sibling > /home/user/sibling.txt"), sibling)
    running = Sandbox.create(first)
    try:
        assert running.commands.run("cat /home/user/made.txt").stdout.strip() == marker
        logs = []
        Template.build(definition(), first, skip_cache=True, on_build_logs=logs.append)
        assert not any("CACHED" in m for m in messages(logs)), messages(logs)
        # The sandbox that runs on the old layer still reads its files...
        assert running.commands.run("cat /home/user/made.txt").stdout.strip() == marker
    finally:
        running.kill()
    # ...and so does a template built on it, and the rebuilt template itself.
    assert read(sibling, "/home/user/made.txt /home/user/sibling.txt").split() == [
        marker, "sibling"]
    assert read(first, "/home/user/made.txt").strip() == marker


def test_what_a_keys_run_step_made_is_never_handed_to_another_key(names, other_key):
    step = f"head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /etc/host-key; echo {uuid.uuid4().hex}"

    def definition():
        return Template().from_template("base").run_cmd(step, user="root")

    mine = names()
    Template.build(definition(), mine)
    my_key = read(mine, "/etc/host-key")
    # Positive control: the owner's rebuild reuses its own layer (same secret, CACHED).
    logs = []
    Template.build(definition(), mine, on_build_logs=logs.append)
    assert "CACHED" in messages(logs) and read(mine, "/etc/host-key") == my_key

    theirs = names(other_key)
    logs = []
    Template.build(definition(), theirs, api_key=other_key, on_build_logs=logs.append)
    # No CACHED (which would tell the other key what this key built), and a secret of its own.
    assert "CACHED" not in messages(logs), messages(logs)
    assert read(theirs, "/etc/host-key", other_key) != my_key


def test_a_public_template_never_shadows_another_keys_names(names, other_key):
    name = names()
    Template.build(Template().from_template("base")
                   .run_cmd("echo attacker > /home/user/who", user="root"), name)
    from e2b import ConnectionConfig
    from e2b.api.client.api.templates import get_templates, patch_v_2_templates_template_id
    from e2b.api.client.models import TemplateUpdateRequest
    from e2b.api.client_sync import get_api_client

    client = get_api_client(ConnectionConfig())
    tid = [t.template_id for t in get_templates.sync(client=client) if name in t.names][0]
    updated = patch_v_2_templates_template_id.sync(
        tid, client=client, body=TemplateUpdateRequest(public=True))
    namespaced = f"{key_id(API_KEY)}/{name}"
    assert namespaced in updated.names, updated.names

    # The victim names `name`, with secrets: not the attacker's template.
    with pytest.raises(Exception) as refused:
        Sandbox.create(name, api_key=other_key, envs={"TOKEN": "victim-secret"})
    assert "not found" in str(refused.value).lower(), refused.value
    # The victim's own snapshot of that name is what the name starts for the victim.
    own = Sandbox.create("base", api_key=other_key)
    try:
        own.files.write("/home/user/who", "victim\n")
        own.create_snapshot(name=name)
    finally:
        own.kill()
    try:
        assert read(name, "/home/user/who", other_key) == "victim\n"
        # Positive control: the public template is reached by its namespaced name.
        assert read(namespaced, "/home/user/who", other_key) == "attacker\n"
        assert Template.exists(namespaced, api_key=other_key)
    finally:
        assert Sandbox.delete_snapshot(name, api_key=other_key)


def test_a_step_that_leaves_a_deep_tree_takes_nothing_down(server, names):
    """A build step's layer is a tree on the host that the step's sandbox made; removing one of
    any depth (here a failed step's, thrown away) must not take the server down."""
    deep = ("python3 -c \"import os\nfor _ in range(15000):\n    os.mkdir('d'); os.chdir('d')\"; "
            f"echo {uuid.uuid4().hex}; exit 3")
    name = names()
    with pytest.raises(Exception) as failed:
        Template.build(Template().from_template("base").run_cmd(deep, user="root"), name)
    assert "exit code 3" in str(failed.value), failed.value
    assert server.proc.poll() is None, "the server is alive"
    # Positive control: the builder goes on with the next build.
    Template.build(Template().from_template("base").run_cmd(f"echo {uuid.uuid4().hex}"), name)
    assert Template.exists(name)
