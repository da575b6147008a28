"""A real HTTP server on loopback that records the webhook deliveries it gets, for the tests of
webhooks (tests/integration/test_webhooks.py, and gateways' deliveries in tests/cluster)."""

import base64
import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def signature(secret, body):
    """E2B's documented check of `e2b-signature`."""
    digest = hashlib.sha256(secret.encode() + body).digest()
    return base64.b64encode(digest).decode().replace("+", "-").replace("/", "_").rstrip("=")


class Receiver:
    """Records each POST by path. `/flaky...` answers 500 to its first request, `/hang...`
    never answers (until the test ends), the rest answer 200."""

    def __init__(self):
        self.got = {}  # path: [(headers, raw body)]
        self.lock = threading.Lock()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    seen = receiver.got.setdefault(self.path, [])
                    seen.append((dict(self.headers.items()), body))
                    first = len(seen) == 1
                if self.path.startswith("/hang"):
                    receiver.release.wait(120)
                    return
                self.send_response(500 if self.path.startswith("/flaky") and first else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def requests(self, path):
        with self.lock:
            return list(self.got.get(path, []))

    def wait(self, path, done, timeout=30):
        """The requests at `path` once `done(requests)` holds; fails after `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.requests(path)
            if done(got):
                return got
            time.sleep(0.2)
        raise AssertionError(f"{path}: only {len(self.requests(path))} requests in {timeout}s")

    def stop(self):
        self.release.set()
        self.http.shutdown()
