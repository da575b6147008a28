"""Template tags through the pinned SDK (`name:tag`, `tags=[...]`, `Template.assign_tags`,
`remove_tags`, `get_tags`): a tag names one build, so one name keeps several builds startable,
and a tag moves without a rebuild. `name` alone means `name:default`. Tags are their key's."""

import pytest
from e2b import Sandbox, Template


def version(v):
    """A template whose sandboxes say which build they are (an ENV step: no layer of its own)."""
    return Template().from_template("base").set_envs({"BUILD": v})


def started(reference, **kwargs):
    """What `$BUILD` says in a sandbox created from `reference`."""
    sbx = Sandbox.create(reference, **kwargs)
    try:
        return sbx.commands.run("echo $BUILD").stdout.strip()
    finally:
        sbx.kill()


def not_found(reference, **kwargs):
    with pytest.raises(Exception) as err:
        Sandbox.create(reference, **kwargs)
    return "not found" in str(err.value).lower()


def test_tags_name_builds_and_move_without_a_rebuild(names):
    name = names()
    one = Template.build(version("1"), f"{name}:v1")
    assert one.tags == ["v1"]
    assert started(f"{name}:v1") == "1"
    # Only `v1` was asked for: the name alone (its `default`) names nothing yet.
    assert not_found(name)
    assert Template.exists(f"{name}:v1") and not Template.exists(name)

    two = Template.build(version("2"), name)
    assert two.template_id == one.template_id and two.tags == ["default"]
    three = Template.build(version("3"), name, tags=["v3", "latest"])
    assert sorted(three.tags) == ["latest", "v3"]
    assert [started(r) for r in (name, f"{name}:default", f"{name}:v1", f"{name}:latest")] \
        == ["2", "2", "1", "3"]

    # A sandbox names its template, not the build.
    sbx = Sandbox.create(f"{name}:v3")
    try:
        assert sbx.get_info().template_id == one.template_id
        assert sbx.get_info().name == name
    finally:
        sbx.kill()

    assigned = Template.assign_tags(f"{name}:v1", ["stable", "default"])
    assert assigned.build_id == one.build_id and sorted(assigned.tags) == ["default", "stable"]
    assert started(name) == "1" and started(f"{name}:stable") == "1"
    tags = {t.tag: t.build_id for t in Template.get_tags(one.template_id)}
    assert tags == {"default": one.build_id, "stable": one.build_id, "v1": one.build_id,
                    "v3": three.build_id, "latest": three.build_id}, tags

    # Removing tags leaves the builds: an untagged one still starts by its id.
    Template.remove_tags(name, ["v1", "default", "stable"])
    assert not_found(f"{name}:v1") and not_found(name)
    assert started(f"{name}:{one.build_id}") == "1"
    assert started(f"{name}:{two.build_id}") == "2"
    with pytest.raises(Exception) as err:
        Template.remove_tags(name, ["latest", "no-such-tag"])
    assert "no-such-tag" in str(err.value), err.value
    assert started(f"{name}:latest") == "3", "a refused removal removes nothing"


def test_a_failed_build_moves_no_tag(names):
    name = names()
    Template.build(version("good"), name)
    with pytest.raises(Exception):
        Template.build(version("bad").run_cmd("exit 3"), name)
    assert started(name) == "good"


def test_tags_are_their_keys(names, other_key):
    name = names()
    mine = Template.build(version("mine"), f"{name}:v1")
    for reference in (f"{name}:v1", f"{mine.template_id}:v1", f"{name}:{mine.build_id}",
                      mine.build_id):
        assert not_found(reference, api_key=other_key), reference
    for call in (lambda: Template.assign_tags(f"{name}:v1", "theirs", api_key=other_key),
                 lambda: Template.remove_tags(name, "v1", api_key=other_key),
                 lambda: Template.get_tags(mine.template_id, api_key=other_key)):
        with pytest.raises(Exception) as err:
            call()
        assert "not found" in str(err.value).lower(), err.value
    assert started(f"{name}:v1") == "mine"
    assert [t.tag for t in Template.get_tags(mine.template_id)] == ["v1"]


@pytest.mark.parametrize("reference, expected", [
    ("{name}:", "not a valid tag"),
    ("{name}:-x", "not a valid tag"),
    ("{name}:a b", "not a valid tag"),
])
def test_a_bad_tag_is_refused(names, reference, expected):
    with pytest.raises(Exception) as err:
        Template.build(version("x"), reference.format(name=names()))
    assert expected in str(err.value), err.value


def test_the_js_sdk_builds_with_tags_and_moves_them(server, names):
    name = names()
    js = """
      import { Sandbox, Template } from 'e2b'
      const name = process.argv[1]
      const t = Template().fromTemplate('base').setEnvs({ BUILD: 'js' })
      const info = await Template.build(t, `${name}:v1`, { tags: ['beta'] })
      await Template.assignTags(`${name}:beta`, 'stable')
      await Template.removeTags(name, 'beta')
      const sbx = await Sandbox.create(`${name}:stable`)
      const run = await sbx.commands.run('echo $BUILD')
      await sbx.kill()
      const tags = (await Template.getTags(info.templateId)).map((t) => t.tag).sort()
      console.log(JSON.stringify({ tags, built: info.tags.sort(), out: run.stdout.trim() }))
    """
    result = server.js(js, name)
    assert result == {"tags": ["stable", "v1"], "built": ["beta", "v1"], "out": "js"}, result
