"""The web dashboard in a real headless Chromium: the key's sandboxes with their template, age,
timeout, CPU, memory and metadata; pause, resume and kill from its buttons; templates with their
builds and build logs; the host's headroom. The page asks for the key; its API answers 401
without it (test_tenants_dashboard.py has the attacks on it)."""

import os

import pytest
from e2b import NotFoundException, Sandbox, Template

from browser import open_dashboard
from conftest import API_KEY
from harness import fetch


def row(sandbox_id, what="dataset.state"):
    return f'(document.querySelector(\'[data-sandbox="{sandbox_id}"]\') || {{dataset: {{}}}}).{what}'


def test_the_dashboard_shows_and_drives_the_keys_sandboxes_and_templates(server, names, browser, tmp_path):
    tag = f"dash-{os.getpid()}"
    shown = Sandbox.create("base", metadata={"case": tag}, timeout=600)
    doomed = Sandbox.create("base")
    name = names()
    Template.build(Template().from_template("base").run_cmd(f"echo built-for-{tag}"), name)
    try:
        open_dashboard(browser, server.url, API_KEY)
        assert browser.basic_prompts == 0  # the page's own form asked for the key
        assert browser.wait_for(row(shown.sandbox_id)) == "running"
        cells = browser.eval(f"[...document.querySelector('[data-sandbox=\"{shown.sandbox_id}\"]').cells].map(c => c.textContent)")
        assert cells[0] == shown.sandbox_id and cells[2] == "base"
        assert cells[4].endswith("min"), cells  # timeout in (600 s)
        assert f"case={tag}" in cells[7]
        # Memory comes from the 5-second samples.
        browser.wait_for(f"{row(shown.sandbox_id, 'cells[6].textContent')}.includes('MiB of')", within=20)
        host = browser.eval("document.getElementById('host').textContent")
        assert "Sandboxes running" in host and "available of" in host

        # The buttons: pause, resume, kill, each seen by the SDK.
        browser.eval(f"document.querySelector('[data-sandbox=\"{shown.sandbox_id}\"] button').click()")
        browser.wait_for(f"{row(shown.sandbox_id)} === 'paused'", within=60)
        assert Sandbox.get_info(shown.sandbox_id).state.value == "paused"
        browser.eval(f"document.querySelector('[data-sandbox=\"{shown.sandbox_id}\"] button').click()")
        browser.wait_for(f"{row(shown.sandbox_id)} === 'running'", within=60)
        assert Sandbox.connect(shown.sandbox_id).commands.run("echo back").stdout == "back\n"
        browser.eval(f"document.querySelector('[data-sandbox=\"{doomed.sandbox_id}\"] button.danger').click()")
        browser.wait_for(f"!document.querySelector('[data-sandbox=\"{doomed.sandbox_id}\"]')")
        with pytest.raises(NotFoundException):
            Sandbox.get_info(doomed.sandbox_id)

        # Templates: the built-ins, and this key's with its build and the build's log.
        browser.wait_for("!!document.querySelector('[data-template=\"code-interpreter-v1\"]')")
        browser.wait_for(f"!!document.querySelector('[data-template=\"{name}\"] button')")
        browser.eval(f"document.querySelector('[data-template=\"{name}\"] button').click()")
        log = browser.wait_for("!document.getElementById('log-view').hidden && document.getElementById('log').textContent")
        assert f"echo built-for-{tag}" in log, log
        browser.screenshot(tmp_path / "dashboard.png")
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        print(f"dashboard screenshot: {tmp_path / 'dashboard.png'}")
    finally:
        shown.kill()
        try:
            doomed.kill()
        except NotFoundException:
            pass


def request(server, path, method="GET", headers=None):
    return fetch(server.url + path, headers, method)


def test_without_the_key_it_is_401_and_bad_actions_are_404(server, sandbox):
    for path in ["/dashboard/api/state", f"/dashboard/api/sandboxes/{sandbox.sandbox_id}/kill"]:
        for headers in ({}, {"X-API-Key": "e2b_" + "0" * 40}):
            status, _, body = request(server, path, "POST" if "kill" in path else "GET", headers)
            assert status == 401 and b'"code":401' in body, (path, headers, status)
    assert sandbox.is_running()
    status, _, body = request(server, "/dashboard")
    assert status in (200, 308) and b"<title>Airlock</title>" in request(server, "/dashboard/")[2]

    good = {"X-API-Key": API_KEY}
    status, _, _ = request(server, "/dashboard/api/sandboxes/nosuchsandbox/pause", "POST", good)
    assert status == 404
    status, _, body = request(server, f"/dashboard/api/sandboxes/{sandbox.sandbox_id}/explode",
                              "POST", good)
    assert status == 404 and b"kill, pause or resume" in body
