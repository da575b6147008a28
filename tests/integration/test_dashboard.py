"""The web dashboard in a real headless Chromium: the key's sandboxes with their template, age,
timeout, CPU, memory and metadata; pause, resume and kill from its buttons; templates with their
builds and build logs; the host's headroom. Without the key it is 401, and its actions refuse
requests that another site's page could forge."""

import base64
import os
import time
import urllib.request

import pytest
from e2b import NotFoundException, Sandbox, Template

from browser import Browser
from conftest import API_KEY


def basic(key):
    return "Basic " + base64.b64encode(f"airlock:{key}".encode()).decode()


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


def row(sandbox_id, what="dataset.state"):
    return f'(document.querySelector(\'[data-sandbox="{sandbox_id}"]\') || {{dataset: {{}}}}).{what}'


def test_the_dashboard_shows_and_drives_the_keys_sandboxes_and_templates(server, names, browser, tmp_path):
    tag = f"dash-{os.getpid()}"
    shown = Sandbox.create("base", metadata={"case": tag}, timeout=600)
    doomed = Sandbox.create("base")
    name = names()
    Template.build(Template().from_template("base").run_cmd(f"echo built-for-{tag}"), name)
    try:
        browser.headers({"Authorization": basic(API_KEY)})
        browser.open(f"{server.url}/dashboard/")
        browser.wait_for("document.body.dataset.loaded === 'yes'")
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
    req = urllib.request.Request(server.url + path, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_without_the_key_it_is_401_and_forged_actions_are_refused(server, sandbox):
    for path in ["/dashboard/", "/dashboard", "/dashboard/api/state"]:
        status, headers, body = request(server, path)
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Basic"), (path, status)
        assert b'"code":401' in body
    status, _, _ = request(server, "/dashboard/", headers={"Authorization": basic("e2b_" + "0" * 40)})
    assert status == 401, "a wrong key"

    good = {"Authorization": basic(API_KEY)}
    status, headers, body = request(server, "/dashboard/", headers=good)
    assert status == 200 and b"<title>Airlock</title>" in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    # What a page on another site can send with the browser's saved credentials: no header of
    # its own. It is refused, and the sandbox runs on.
    status, _, body = request(server, f"/dashboard/api/sandboxes/{sandbox.sandbox_id}/kill", "POST", good)
    assert status == 403 and b"dashboard page" in body
    assert sandbox.is_running()
    status, _, _ = request(server, "/dashboard/api/sandboxes/nosuchsandbox/pause", "POST",
                           {**good, "X-Airlock-Dashboard": "1"})
    assert status == 404
    status, _, body = request(server, f"/dashboard/api/sandboxes/{sandbox.sandbox_id}/explode", "POST",
                              {**good, "X-Airlock-Dashboard": "1"})
    assert status == 404 and b"kill, pause or resume" in body
