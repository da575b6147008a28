"""A real headless Chromium (Debian's `chromium` package) driven over the DevTools protocol
through a pipe (`--remote-debugging-pipe`: JSON messages ending in a NUL byte on fds 3 and 4),
so the tests need no WebSocket client and no browser download."""

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time


class Browser:
    """One headless Chromium with one page."""

    def __init__(self, width=1400, height=1000):
        binary = shutil.which("chromium")
        if binary is None:
            raise RuntimeError("chromium is missing: scripts/install-test-deps.sh installs it")
        self.profile = tempfile.mkdtemp(prefix="airlock-chromium-")
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        # The browser reads commands on fd 3 and writes answers on fd 4; bash puts the pipes
        # there, from fds above 9 so that neither lands on the other's place first (dash's
        # redirections take single-digit fds only).
        child_r, child_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w))
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-extensions", "--no-first-run",
                "--disable-sync", "--mute-audio", "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{child_r} 4>&{child_w} {child_r}<&- {child_w}>&-',
             binary, *args],
            pass_fds=(child_r, child_w), stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.profile, "chromium.log"), "wb"))
        for fd in (to_browser_r, from_browser_w, child_r, child_w):
            os.close(fd)
        self.next_id = 0
        self.buffer = b""
        # What a person would type into the browser's Basic prompt, and how often it asked.
        self.basic_credentials = None
        self.basic_prompts = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)

    def send(self, method, session=False, **params):
        """Sends one command without waiting for its answer; returns its id."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        return self.next_id

    def call(self, method, session=False, **params):
        """Sends one command (to the page with `session`) and returns its result. Events that
        arrive meanwhile are handled here (see `on_event`)."""
        sent = self.send(method, session, **params)
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium went away")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if "method" in answer:
                self.on_event(answer)
            elif answer.get("id") == sent:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def on_event(self, event):
        """Lets paused requests go on, and answers the browser's Basic prompt as a person
        would: the first time with `basic_credentials` (after that the browser remembers them
        itself), and by cancelling any later prompt."""
        params = event.get("params", {})
        if event["method"] == "Fetch.requestPaused":
            self.send("Fetch.continueRequest", session=True, requestId=params["requestId"])
        elif event["method"] == "Fetch.authRequired":
            self.basic_prompts += 1
            answer = {"response": "CancelAuth"}
            if self.basic_credentials and self.basic_prompts == 1:
                user, password = self.basic_credentials
                answer = {"response": "ProvideCredentials", "username": user, "password": password}
            self.send("Fetch.continueWithAuth", session=True, requestId=params["requestId"],
                      authChallengeResponse=answer)

    def answer_basic_prompt(self, user, password):
        """From now on, a Basic prompt of any page is answered once with these (the page's
        requests pause until the next command sends the answer, so keep calling in)."""
        self.basic_credentials = (user, password)
        self.call("Fetch.enable", session=True, handleAuthRequests=True,
                  patterns=[{"urlPattern": "*"}])

    def downloads_to(self, directory):
        """Files the browser downloads are saved in `directory`, under their own names."""
        self.call("Browser.setDownloadBehavior", behavior="allow", downloadPath=str(directory))

    def headers(self, headers):
        """Sends these headers with every request the page makes."""
        self.call("Network.enable", session=True)
        self.call("Network.setExtraHTTPHeaders", session=True, headers=headers)

    def open(self, url):
        return self.call("Page.navigate", session=True, url=url)

    def eval(self, expression):
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression, within=30):
        """Waits until the expression is truthy in the page; returns its value."""
        deadline = time.monotonic() + within
        while True:
            try:
                value = self.eval(expression)
            except RuntimeError:
                value = None
            if value or time.monotonic() > deadline:
                assert value, f"never true in the page: {expression}"
                return value
            time.sleep(0.2)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data["data"]))

    def close(self):
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self.to_browser)
        os.close(self.from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


def open_dashboard(browser, server_url, key):
    """Opens Airlock's dashboard as its user would: answering whatever it asks for the key (the
    browser's Basic prompt, or the page's own key form), until it shows the key's sandboxes."""
    browser.answer_basic_prompt("airlock", key)
    browser.open(f"{server_url}/dashboard/")
    browser.wait_for("document.readyState === 'complete'")
    if browser.eval("!!document.getElementById('key-form')"):
        browser.eval(f"document.getElementById('api-key').value = {json.dumps(key)}; "
                     "document.getElementById('key-form').requestSubmit(); true")
    browser.wait_for("document.body.dataset.loaded === 'yes'")
