"""Benchmark (not a test): users' templates, built through the stock e2b SDK's `Template.build`.

Starts its own `airlock serve` and a local OCI registry (tests/images.py), then reports:
  * a cold build of `from_image(<the Debian test image in that registry>)` + the same pip step
    (blobs deleted and every step forced, so it pulls, unpacks, provisions and runs pip), and
    the same definition rebuilt from the cache;
  * a cold build of `from_template("base")` + `pip_install(["requests"])` (the pip step forced
    with `skip_cache`, so it really runs), and the same definition rebuilt from the cache;
  * the disk use of 5 templates derived from `base` (each: that pip step plus a step of its
    own), against what 5 copies of `base` would take;
  * create → first command on a derived template against `base`, alternating, in the same run;
  * create → the start command's port answering (`set_start_cmd(..., wait_for_port(8080))`),
    the first request through the proxy, with no retry.

Run it with bench/run.sh templates (which builds everything first)."""

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Server, free_port, use_server  # noqa: E402
from images import Registry, debian_layout  # noqa: E402
from startup import row, timed, wait_for_pools  # noqa: E402

MB = 1_000_000


def du_bytes(*paths):
    """Bytes on disk under `paths` together, each file counted once (`du`'s own rule)."""
    if not paths:
        return 0
    out = subprocess.run(["du", "-s", "-c", "--block-size=1", *map(str, paths)],
                         capture_output=True, text=True)
    return int(out.stdout.split()[-2]) if out.returncode == 0 and out.stdout else 0


def build_seconds(template, name, **kwargs):
    from e2b import Template
    t = time.perf_counter()
    Template.build(template, name, **kwargs)
    return time.perf_counter() - t


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between paced creates")
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    args = ap.parse_args()
    n = args.iterations

    registry = Registry()
    srv = Server(Path(args.data_dir), free_port())
    srv.extra_args = ["--insecure-registry", registry.address]
    srv.log.write_text("")
    srv.start()
    use_server(srv)
    from e2b import Sandbox, Template, wait_for_port

    templates_dir = Path(os.environ.get("AIRLOCK_TEMPLATES_DIR") or Path(args.data_dir) / "templates")
    run = uuid.uuid4().hex[:6]
    names = []

    def name(label):
        names.append(f"bench-{label}-{run}")
        return names[-1]

    try:
        wait_for_pools(srv)
        print(f"# Airlock templates benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")

        def with_requests():
            return Template().from_template("base").pip_install(["requests"])

        started = time.time()
        pip = name("pip")
        cold = build_seconds(with_requests(), pip, skip_cache=True)
        cached = build_seconds(with_requests(), pip)
        print(f"from_template(base) + pip_install([requests]): cold {cold:.1f} s, "
              f"rebuilt from cache {cached:.1f} s")

        # The built base in use: its layers, as the server mounts them.
        bases = [d for d in templates_dir.glob("mounts/base-*") if os.path.ismount(d)]
        base_size = du_bytes(max(bases, key=lambda d: d.stat().st_mtime))
        for i in range(5):
            build_seconds(with_requests().run_cmd(f"echo {i} > /tmp/which", user="root"),
                          name(f"derived{i}"))
        # The layers these builds wrote (the forced pip step rewrote its own).
        written = [d for d in (templates_dir / "layers").iterdir()
                   if not d.name.startswith(".") and d.stat().st_mtime >= started]
        grown = du_bytes(*written)
        print(f"6 templates derived from base (the pip one, and 5 more with a step each on it): "
              f"{len(written)} layers, {grown / MB:.1f} MB on disk in all; base itself is "
              f"{base_size / MB:.0f} MB, so 6 copies of it would be {6 * base_size / MB:.0f} MB")

        layout = debian_layout()
        image = registry.push(layout, "latest", "bench/debian:1")

        def from_image():
            return Template().from_image(image).pip_install(["requests"])

        # Cold: no blob kept, every layer unpacked again (nothing else builds meanwhile).
        shutil.rmtree(templates_dir / "blobs", ignore_errors=True)
        pulled = name("image")
        cold = build_seconds(from_image(), pulled, skip_cache=True)
        cached = build_seconds(from_image(), pulled)
        print(f"from_image(Debian, {du_bytes(layout / 'blobs') / MB:.0f} MB compressed in a local "
              f"registry) + pip_install([requests]): cold {cold:.1f} s, rebuilt from cache "
              f"{cached:.1f} s")

        served = name("served")
        Template.build(Template().from_template("base")
                       .set_start_cmd("python3 -m http.server 8080", wait_for_port(8080)), served)
        # Each build made its golden image before it finished; the pools fill right after.
        time.sleep(10)
        print()
        print(f"{'figure (ms)':<46} {'p50':>7} {'p95':>7} {'p99':>7} {'min':>7} {'max':>7}  ok")

        def first_command(template):
            def once():
                t = time.perf_counter()
                sbx = Sandbox.create(template)
                assert sbx.commands.run("echo ok").stdout == "ok\n"
                ms = (time.perf_counter() - t) * 1000
                sbx.kill()
                return ms
            return once

        on_base, on_custom = [], []
        for _ in range(n):
            on_base += timed(1, first_command("base"), args.interval)
            on_custom += timed(1, first_command(pip), args.interval)
        print(row("create -> first command, base", on_base, n))
        print(row("create -> first command, derived template", on_custom, n))

        def port_answers():
            t = time.perf_counter()
            sbx = Sandbox.create(served)
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("GET", "/", headers={"Host": f"8080-{sbx.sandbox_id}.airlock.test"})
            status = conn.getresponse().status
            ms = (time.perf_counter() - t) * 1000
            sbx.kill()
            assert status == 200, status
            return ms
        print(row("create -> start command's port answers", timed(n, port_answers, args.interval), n))
    finally:
        for made in names:
            try:
                Sandbox.delete_snapshot(made)
            except Exception:
                pass
        srv.stop()
        registry.stop()


if __name__ == "__main__":
    main()
