"""A registry that is out to exhaust the server (issue 31): answers with no end (a manifest, a
token, a layer longer than its manifest says) must fail the build with a message naming the
cap, while the server's memory stays where it was and the registry is cut off early. The
positive controls: the same registry's well-behaved images (its token flow, in front of the
real registry of tests/images.py) and a normal pull from the real registry both build."""

import hashlib
import http.server
import json
import threading
import urllib.parse
import urllib.request

import pytest
from e2b import BuildException, Template

from images import assert_musl_hello_runs, musl_layout

# What the hostile registry sends at most before it gives up: enough that reading it whole
# shows in the server's memory.
FLOOD = 512 * 1024 * 1024
CHUNK = 1024 * 1024
TOKEN = "t0ken"


class Hostile(http.server.BaseHTTPRequestHandler):
    """A registry with token auth (as Docker Hub's), whose repository names say how it
    misbehaves: `flood-token/*` (its token answer), `flood-manifest/*`, `long-layer/*` (a
    layer of 1 KiB by its manifest); `mirror/*` forwards to the real registry's `hostile-control/*`."""

    real = ""  # the real registry's address
    sent = {}  # bytes sent, by what

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/v2/":
            return self.challenge()
        if url.path == "/token":
            scope = urllib.parse.parse_qs(url.query).get("scope", [""])[0]
            if scope.startswith("repository:flood-token/"):
                return self.flood("token", b'{"token": "' + b"a" * CHUNK)
            return self.answer(200, "application/json", json.dumps({"token": TOKEN}).encode())
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.challenge()
        parts = url.path.split("/")  # "", "v2", repo, name, kind, ref
        repo, kind, ref = parts[2], parts[4], parts[5]
        if repo == "mirror":
            return self.forward(f"/v2/hostile-control/{parts[3]}/{kind}/{ref}")
        if repo == "flood-manifest":
            head = b'{"schemaVersion": 2, "layers": ['
            entry = b'{"mediaType": "x", "digest": "sha256:' + b"0" * 64 + b'", "size": 1},'
            return self.flood("manifest", head + entry * (CHUNK // len(entry)),
                              OCI_MANIFEST)
        if repo == "long-layer":
            config = json.dumps({"architecture": "amd64", "os": "linux",
                                 "rootfs": {"type": "layers", "diff_ids": []}}).encode()
            if kind == "manifests":
                manifest = {
                    "schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": descriptor("application/vnd.oci.image.config.v1+json", config),
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                "digest": "sha256:" + hashlib.sha256(b"x" * 1024).hexdigest(),
                                "size": 1024}],
                }
                return self.answer(200, OCI_MANIFEST, json.dumps(manifest).encode())
            if ref == descriptor("", config)["digest"]:
                return self.answer(200, "application/octet-stream", config)
            return self.flood("layer", b"x" * CHUNK)
        self.answer(404, "application/json", b'{"errors": [{"code": "NAME_UNKNOWN"}]}')

    def challenge(self):
        realm = f"http://{self.headers['Host']}/token"
        self.send_response(401)
        self.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="hostile"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def answer(self, status, content_type, body):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def flood(self, what, chunk, content_type="application/json"):
        """`chunk` again and again, with no length and no end short of FLOOD bytes."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.end_headers()
        Hostile.sent[what] = 0
        try:
            while Hostile.sent[what] < FLOOD:
                self.wfile.write(chunk)
                Hostile.sent[what] += len(chunk)
        except OSError:
            pass  # the server hung up: what the test wants

    def forward(self, path):
        req = urllib.request.Request(f"http://{Hostile.real}{path}",
                                     headers={"Accept": self.headers.get("Accept", "*/*")})
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.send_response(resp.status)
            for name in ("Content-Type", "Content-Length", "Docker-Content-Digest"):
                if resp.headers.get(name):
                    self.send_header(name, resp.headers[name])
            self.end_headers()
            while chunk := resp.read(CHUNK):
                self.wfile.write(chunk)


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def descriptor(media_type, data):
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "size": len(data)}


@pytest.fixture(scope="module")
def hostile(server, registry):
    """The hostile registry's address; the server restarted to allow it (as an operator's
    `--insecure-registry`), and put back afterwards."""
    Hostile.real = registry.address
    registry.push(musl_layout(), "latest", "hostile-control/musl:1")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{httpd.server_port}"
    saved = list(server.extra_args)
    server.stop()
    server.extra_args = saved + ["--insecure-registry", address]
    server.start()
    yield address
    server.stop()
    server.extra_args = saved
    server.start()
    httpd.shutdown()


def failed_build(server, image, names):
    """Builds `image`; returns the build's error and how far the server's peak memory rose
    meanwhile (the peak is reset first, so a buffer freed again still counts)."""
    server.reset_peak_memory()
    before = server.peak_memory_mib()
    name = names()
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image(image), name)
    assert not Template.exists(name)
    return str(err.value), server.peak_memory_mib() - before


def builds(image, names):
    assert_musl_hello_runs(Template().from_image(image), names(), path="/tmp/pulled")


def test_a_manifest_without_end_is_cut_off_at_its_cap(server, hostile, names):
    text, grew = failed_build(server, f"{hostile}/flood-manifest/x:1", names)
    assert grew < 64, f"the server's memory rose by {grew} MiB"
    assert Hostile.sent["manifest"] < 64 * CHUNK, Hostile.sent
    assert "manifest" in text and "4 MiB" in text, text
    # The positive control: the same registry's token flow, and its manifests and blobs.
    builds(f"{hostile}/mirror/musl:1", names)


def test_a_token_answer_without_end_is_cut_off_at_its_cap(server, hostile, names):
    text, grew = failed_build(server, f"{hostile}/flood-token/x:1", names)
    assert grew < 64, f"the server's memory rose by {grew} MiB"
    assert Hostile.sent["token"] < 64 * CHUNK, Hostile.sent
    assert "token" in text and "64 KiB" in text, text


def test_a_layer_longer_than_its_manifest_says_is_cut_off(server, hostile, names):
    text, grew = failed_build(server, f"{hostile}/long-layer/x:1", names)
    assert grew < 64, f"the server's memory rose by {grew} MiB"
    assert Hostile.sent["layer"] < 64 * CHUNK, Hostile.sent
    assert "1024 bytes" in text, text


def test_the_server_pulls_normally_after_the_hostile_ones(server, hostile, registry, names):
    """The positive control of the real registry itself, after the floods above."""
    builds(f"{registry.address}/hostile-control/musl:1", names)
