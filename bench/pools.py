"""Benchmark (not a test): what pools cost a quiet host when many templates were used lately.

Starts its own `airlock serve` (extra flags after `--`), waits for the golden images and pools,
builds `--templates` small templates from `base` (`bench-pool-NN`, one `run_cmd` each; a data
dir kept between runs reuses them), creates and kills one sandbox of each, and then:
  * quiet: samples CPU over `--window` seconds ending `--quiet` seconds later;
  * burst: sends `--burst` creates of `base` at once (first command, then kill), and samples
    CPU over `--window` seconds ending 2 and 3 minutes (`--after`) after the burst.
CPU is given as cores (1.0 = one core busy): the whole host's (/proc/stat; other users of the
host count too) and Airlock's own (the server, its sandboxes and everything it ran; roughly,
see `airlock_busy`). Pool churn in each phase comes from /metrics
(`airlock_pool_restores_total`, `_evictions_total`, `_wasted_restores_total`: ready sandboxes
destroyed unused within a minute of their restore);
"restored" counts the sandboxes that appeared on the host and no create was handed: it also
counts for a build without those counters.

Run it with bench/run.sh pools [--templates 20] [-- serve flags]."""

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Server, fetch, free_port, use_server  # noqa: E402
from overload import burst  # noqa: E402
from startup import wait_for_pools  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
CHURN = ("airlock_pool_restores_total", "airlock_pool_evictions_total",
         "airlock_pool_wasted_restores_total")


def host_busy():
    """The host's busy CPU time so far, in seconds (all cores)."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / TICK


def airlock_times(srv):
    """{pid: CPU seconds} of the server (with its reaped children) and of every live process
    running over its data dir."""
    times = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(proc.name) == srv.proc.pid:
                fields = stat[11:15]  # utime stime cutime cstime
            elif str(srv.data_dir).encode() in (proc / "cmdline").read_bytes():
                fields = stat[11:13]
            else:
                continue
            times[proc.name] = sum(int(x) for x in fields) / TICK
        except (OSError, IndexError, ValueError):
            continue
    return times


def airlock_busy(before, after):
    """CPU seconds Airlock used between two `airlock_times`: what each process alive at the end
    used since the start (or since it was born). A process that ended meanwhile is not counted
    unless the server reaped it (then all its time counts): roughly."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def churn(metrics_url):
    """The pools' counters from /metrics (None for a build without them)."""
    status, _, body = fetch(metrics_url)
    found = {}
    for line in body.decode().splitlines() if status == 200 else []:
        name, _, value = line.partition(" ")
        if name in CHURN:
            found[name] = int(float(value))
    return tuple(found.get(name) for name in CHURN)


class Births:
    """Sandboxes that appear on the host, polled every second (bundles are named by sandbox)."""

    def __init__(self, srv):
        self.bundles = srv.data_dir / "gvisor" / "bundles"
        self.seen = set(os.listdir(self.bundles))
        self.stop = threading.Event()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while not self.stop.wait(1):
            try:
                self.seen |= set(os.listdir(self.bundles))
            except OSError:
                pass


def phase(srv, metrics_url, births, handed, label, until, window):
    """Waits until `until` (monotonic), sampling CPU over its last `window` seconds."""
    c0, n0 = churn(metrics_url), len(births.seen - handed)
    time.sleep(max(0.0, until - window - time.monotonic()))
    h0, a0, t0 = host_busy(), airlock_times(srv), time.monotonic()
    time.sleep(max(0.0, until - time.monotonic()))
    h1, a1, t1 = host_busy(), airlock_times(srv), time.monotonic()
    c1, n1 = churn(metrics_url), len(births.seen - handed)
    delta = ["-" if a is None or b is None else str(b - a) for a, b in zip(c0, c1)]
    print(f"{label:<34} {(h1 - h0) / (t1 - t0):>9.3f} {airlock_busy(a0, a1) / (t1 - t0):>12.3f} "
          f"{n1 - n0:>9} {delta[0]:>9} {delta[1]:>9} {delta[2]:>7}")


def build_templates(n):
    from e2b import Template
    names = [f"bench-pool-{i:02d}" for i in range(n)]
    t = time.perf_counter()
    for i, name in enumerate(names):
        Template.build(Template().from_template("base").run_cmd(f"echo {i} > ~/bench-pool"), name)
    return names, time.perf_counter() - t


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", type=int, default=20)
    ap.add_argument("--burst", type=int, default=40, help="creates of base at once")
    ap.add_argument("--quiet", type=float, default=120, help="seconds after the creates")
    ap.add_argument("--after", default="120,180", help="seconds after the burst to sample at")
    ap.add_argument("--window", type=float, default=30, help="seconds each sample spans")
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    ap.add_argument("serve_flags", nargs="*", help="more `airlock serve` flags (after --)")
    args = ap.parse_args()
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    srv = Server(Path(args.data_dir), free_port())
    srv.log.write_text("")
    srv.extra_args = ["--metrics-listen", f"127.0.0.1:{metrics_port}", *args.serve_flags]
    srv.start()
    use_server(srv)
    from e2b import Sandbox
    try:
        wait_for_pools(srv)
        print(f"# Airlock pools benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
        print(f"binary: {os.environ.get('AIRLOCK_BIN', 'target/release/airlock')}; "
              f"serve flags: {' '.join(srv.extra_args)}")
        names, took = build_templates(args.templates)
        print(f"{len(names)} templates built (or reused) in {took:.0f} s")
        births = Births(srv)
        handed = set()
        with ThreadPoolExecutor(4) as pool:
            made = list(pool.map(lambda name: Sandbox.create(name), names))
        handed |= {s.sandbox_id for s in made}
        for sbx in made:
            sbx.kill()
        print(f"\n{'phase':<34} {'host cores':>9} {'airlock cores':>12} {'restored':>9} "
              f"{'restores':>9} {'evictions':>9} {'wasted':>7}")
        start = time.monotonic()
        phase(srv, metrics_url, births, handed, f"quiet, {args.quiet:.0f} s after the creates",
              start + args.quiet, args.window)
        before = set(births.seen)
        r = burst(srv, args.burst)
        time.sleep(1)  # the poller sees the burst's last sandboxes
        handed |= births.seen - before  # the burst's own sandboxes (and any pool restores then)
        print(f"{'burst of ' + str(args.burst) + ' creates of base':<34} made {r['made']}, "
              f"failed {r['failed']}, wall {r['wall']:.1f} s")
        start = time.monotonic()
        for after in (float(a) for a in args.after.split(",")):
            phase(srv, metrics_url, births, handed, f"{after:.0f} s after the burst",
                  start + after, args.window)
        births.stop.set()
        c = churn(metrics_url)
        print(f"\nsince the server started: restores {c[0]}, evictions {c[1]}, wasted {c[2]}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
