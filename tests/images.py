"""Real OCI images in a real registry, with no public registry and no Docker: Debian's
`docker-registry` serves them on loopback, `umoci` makes them and `skopeo` pushes them.

Two images, each made once and cached by what they are made of:
- `debian`: the `base` template's Debian root filesystem (as the server mounts it) as one layer, and a second layer that
  takes the `user` account and `/opt/airlock` out again (replaced files and whiteouts), so that
  the build must provision them;
- `musl`: BusyBox (Debian's static build) and musl's dynamic loader, plus a program linked
  against musl: no glibc and no bash in it, and no `user`.
"""

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness import free_port

CACHE = Path(os.environ.get("AIRLOCK_TEST_CACHE", "/var/cache/airlock/test-images"))
TEMPLATES = Path(os.environ.get("AIRLOCK_TEMPLATES_DIR", "/var/cache/airlock/templates"))
# Bump when the recipes below change.
RECIPE = "4"


def run(*cmd, cwd=None):
    subprocess.run(cmd, check=True, cwd=cwd, stdout=subprocess.DEVNULL)


class Registry:
    """`docker-registry serve` on a free loopback port, storing in a private temp dir. With
    `credentials` (user, password), every request needs them (HTTP basic, an htpasswd file).
    With `redirect` (a base URL), it answers blob downloads by redirecting there, as registries
    that serve blobs from a CDN do (the storage `redirect` middleware)."""

    def __init__(self, credentials=None, redirect=None):
        self.dir = Path(tempfile.mkdtemp(prefix="airlock-registry-"))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.credentials = credentials
        auth = ""
        if credentials:
            htpasswd = subprocess.run(["htpasswd", "-Bbn", *credentials], check=True,
                                      capture_output=True, text=True).stdout
            (self.dir / "htpasswd").write_text(htpasswd)
            auth = f"auth:\n  htpasswd:\n    realm: airlock-test\n    path: {self.dir / 'htpasswd'}\n"
        if redirect:
            auth += ("middleware:\n  storage:\n    - name: redirect\n      options:\n"
                     f"        baseurl: {redirect}\n")
        config = self.dir / "config.yml"
        config.write_text(
            "version: 0.1\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.dir / 'data'}\n"
            f"http:\n  addr: {self.address}\n"
            "log:\n  level: warn\n" + auth
        )
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)],
            stdout=open(self.dir / "registry.log", "ab"), stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1):
                    return
            except urllib.error.HTTPError as answered:
                # A registry that asks for credentials is up.
                if answered.code == 401 and credentials:
                    return
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError((self.dir / "registry.log").read_text())
            time.sleep(0.1)

    def push(self, layout: Path, tag: str, name: str, zstd=False) -> str:
        """Pushes `layout:tag` as `name` (`repo:tag`), its layers recompressed with zstd if
        asked; returns the reference to pull it by."""
        creds = ["--dest-creds", ":".join(self.credentials)] if self.credentials else []
        if zstd:
            # skopeo 1.9's --dest-compress-format leaves a layer the registry already has as
            # it is (gzip): the layout gets zstd layers of its own instead.
            layout = zstd_layout(layout)
            creds += ["--format", "oci"]
        run("skopeo", "copy", "--quiet", "--dest-tls-verify=false", *creds,
            f"oci:{layout}:{tag}", f"docker://{self.address}/{name}")
        return f"{self.address}/{name}"

    def layer_types(self, name: str, tag: str) -> list:
        """The media types of the layers of `name:tag` in this registry."""
        req = urllib.request.Request(
            f"http://{self.address}/v2/{name}/manifests/{tag}",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                               "application/vnd.docker.distribution.manifest.v2+json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return [layer["mediaType"] for layer in json.load(resp)["layers"]]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _cached_layout(key: str, make) -> Path:
    """An OCI layout made by `make(layout_dir)`, kept under CACHE by `key`."""
    name = hashlib.sha256(f"{RECIPE}:{key}".encode()).hexdigest()[:16]
    layout = CACHE / f"layout-{name}"
    if (layout / "index.json").exists():
        return layout
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="partial-", dir=CACHE))
    try:
        make(partial / "layout")
        shutil.rmtree(layout, ignore_errors=True)
        (partial / "layout").rename(layout)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return layout


def zstd_layout(layout: Path) -> Path:
    """A copy of `layout` whose gzip layers are recompressed with zstd (`tar+zstd` layers in a
    new manifest; the config's diff ids, of the uncompressed tars, stay)."""

    def make(out: Path):
        shutil.copytree(layout, out)
        blobs = out / "blobs" / "sha256"

        def put(data: bytes) -> str:
            digest = hashlib.sha256(data).hexdigest()
            (blobs / digest).write_bytes(data)
            return f"sha256:{digest}"

        index = json.loads((out / "index.json").read_text())
        for entry in index["manifests"]:
            manifest = json.loads((blobs / entry["digest"].split(":")[1]).read_bytes())
            for layer in manifest["layers"]:
                tar = gzip.decompress((blobs / layer["digest"].split(":")[1]).read_bytes())
                packed = subprocess.run(["zstd", "-q", "-c"], input=tar, check=True,
                                        capture_output=True).stdout
                layer.update(mediaType="application/vnd.oci.image.layer.v1.tar+zstd",
                             digest=put(packed), size=len(packed))
            data = json.dumps(manifest).encode()
            entry.update(digest=put(data), size=len(data))
        (out / "index.json").write_text(json.dumps(index))

    return _cached_layout(f"zstd:{layout.name}", make)


def add_layer(layout: Path, tar: Path):
    """Appends an uncompressed layer tar to `layout:latest` (umoci gzips it). Layers are made
    with GNU tar or Python's tarfile: umoci 0.4.7's own `insert` leaves the tar's end out."""
    run("umoci", "raw", "add-layer", "--image", f"{layout}:latest", str(tar))


def debian_layout() -> Path:
    """Tag `latest`: the `base` template's rootfs, then a layer that takes `user` (a replaced
    /etc/passwd, group and shadow) and `/opt/airlock` (whiteouts) out again. The rootfs is the
    running server's mount of `base`'s layers."""
    bases = sorted((p for p in TEMPLATES.glob("mounts/base-*") if os.path.ismount(p)),
                   key=lambda p: p.stat().st_mtime)
    if not bases:
        raise RuntimeError(f"no mounted base template under {TEMPLATES}: start the server first")
    rootfs = bases[-1]

    def make(layout: Path):
        run("umoci", "init", "--layout", str(layout))
        run("umoci", "new", "--image", f"{layout}:latest")
        with tempfile.TemporaryDirectory() as work:
            work = Path(work)
            run("tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(work / "1.tar"), ".")
            add_layer(layout, work / "1.tar")
            with tarfile.open(work / "2.tar", "w") as tar:
                for name in ("passwd", "group", "shadow", "gshadow"):
                    src = rootfs / "etc" / name
                    if not src.exists():
                        continue
                    kept = "".join(line for line in src.read_text().splitlines(keepends=True)
                                   if not line.startswith("user:")).encode()
                    info = tar.gettarinfo(str(src), arcname=f"etc/{name}")
                    info.size = len(kept)
                    tar.addfile(info, io.BytesIO(kept))
                for whiteout in ("home/.wh.user", "etc/sudoers.d/.wh.user", "opt/.wh.airlock"):
                    tar.addfile(tarfile.TarInfo(whiteout), io.BytesIO(b""))
            add_layer(layout, work / "2.tar")
        run("umoci", "config", "--image", f"{layout}:latest",
            "--config.env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--config.env", "IMAGE_FLAVOUR=debian")

    return _cached_layout(f"debian:{rootfs.name}", make)


HELLO_C = r"""
#include <stdio.h>
int main(void) { printf("hello from musl\n"); return 0; }
"""


def musl_layout() -> Path:
    """Tag `latest`: BusyBox, musl's loader and `/usr/local/bin/hello` (linked against musl)."""

    def make(layout: Path):
        with tempfile.TemporaryDirectory() as work:
            work = Path(work)
            run("apt-get", "download", "-qq", "busybox-static", cwd=work)
            deb = next(work.glob("busybox-static_*.deb"))
            run("dpkg-deb", "-x", str(deb), str(work / "deb"))
            root = work / "rootfs"
            for d in ("bin", "etc", "lib", "root", "tmp", "usr/local/bin", "usr/lib"):
                (root / d).mkdir(parents=True)
            shutil.copy2(work / "deb/bin/busybox", root / "bin/busybox")
            applets = subprocess.run([str(root / "bin/busybox"), "--list"], check=True,
                                     capture_output=True, text=True).stdout.split()
            for applet in applets:
                if applet != "busybox":
                    os.symlink("busybox", root / "bin" / applet)
            libc = Path("/usr/lib/x86_64-linux-musl/libc.so")
            shutil.copy2(libc, root / "usr/lib/libc.musl-x86_64.so.1")
            os.symlink("/usr/lib/libc.musl-x86_64.so.1", root / "lib/ld-musl-x86_64.so.1")
            (work / "hello.c").write_text(HELLO_C)
            run("musl-gcc", "-O2", "-o", str(root / "usr/local/bin/hello"), str(work / "hello.c"))
            (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
            (root / "etc/group").write_text("root:x:0:\n")
            os.chmod(root / "tmp", 0o1777)
            run("umoci", "init", "--layout", str(layout))
            run("umoci", "new", "--image", f"{layout}:latest")
            run("tar", "--numeric-owner", "-C", str(root), "-cf", str(work / "layer.tar"), ".")
            add_layer(layout, work / "layer.tar")
            run("umoci", "config", "--image", f"{layout}:latest",
                "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
                "--config.env", "IMAGE_FLAVOUR=musl", "--config.workingdir", "/tmp")

    return _cached_layout("musl", make)


def assert_musl_hello_runs(template, name, path="/home/user/pulled"):
    """Builds `template` (from an image of `musl_layout`) as `name` with a step that runs its
    `hello` into `path`, starts a sandbox of it and checks what the step wrote."""
    from e2b import Sandbox, Template

    Template.build(template.run_cmd(f"hello > {path}"), name)
    sbx = Sandbox.create(name)
    try:
        assert sbx.commands.run(f"cat {path}").stdout == "hello from musl\n"
    finally:
        sbx.kill()
