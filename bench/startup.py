"""Benchmark (not a test): sandbox start-up and idle memory, measured through the stock e2b SDK.

Starts its own `airlock serve`, then reports:
  * a cold gVisor launch (`runsc do /bin/true`), for reference;
  * create → first command: `Sandbox.create()` then `commands.run("echo ok")`, p50/p95/p99 and
    success rate over N sandboxes (each killed before the next);
  * memory of idle sandboxes: K sandboxes held at once; for each, the PSS of its host processes
    (runsc sandbox and gofer) and its cgroup's usage, plus MemAvailable's drop divided by K.

Run it with bench/run.sh (which builds everything first)."""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import start_server  # noqa: E402


def pct(values, p):
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(ms):
    return f"{pct(ms, 50):7.1f} {pct(ms, 95):7.1f} {pct(ms, 99):7.1f} {min(ms):7.1f} {max(ms):7.1f}"


def cold_runsc(n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        r = subprocess.run(["runsc", "--network=none", "do", "/bin/true"], capture_output=True)
        if r.returncode != 0:
            return None
        times.append((time.perf_counter() - t) * 1000)
    return times


def mem_available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def host_pss(sandbox_id):
    pids = subprocess.run(["pgrep", "-f", sandbox_id], capture_output=True, text=True).stdout.split()
    total = 0
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def cgroup_usage(sandbox_id):
    try:
        return int(Path(f"/sys/fs/cgroup/memory/airlock/{sandbox_id}/memory.usage_in_bytes").read_text())
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--idle", type=int, default=10, help="sandboxes held at once for the memory figure")
    ap.add_argument("--data-dir", default="/var/tmp/airlock-bench")
    args = ap.parse_args()

    srv = start_server(Path(args.data_dir))
    from e2b import Sandbox

    try:
        print(f"# Airlock start-up benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
        print("figure (ms)                              p50     p95     p99     min     max   ok")
        cold = cold_runsc(10)
        if cold:
            print(f"cold gVisor launch (runsc do /bin/true)  {summary(cold)}  {len(cold)}/10")

        total, create, first, failures = [], [], [], 0
        Sandbox.create("base").kill()  # warm the SDK's connection pool and imports
        for _ in range(args.iterations):
            try:
                t0 = time.perf_counter()
                sbx = Sandbox.create("base")
                t1 = time.perf_counter()
                out = sbx.commands.run("echo ok").stdout
                t2 = time.perf_counter()
                if out != "ok\n":
                    raise RuntimeError(f"unexpected output {out!r}")
                create.append((t1 - t0) * 1000)
                first.append((t2 - t1) * 1000)
                total.append((t2 - t0) * 1000)
                sbx.kill()
            except Exception as e:  # counted, not hidden
                failures += 1
                print(f"  failure: {e}", file=sys.stderr)
        n = args.iterations
        ok = f"{n - failures}/{n}"
        print(f"create → first command                   {summary(total)}  {ok}")
        print(f"  of which Sandbox.create()              {summary(create)}")
        print(f"  of which commands.run('echo ok')       {summary(first)}")

        time.sleep(3)  # let background destroys finish
        before = mem_available()
        held = [Sandbox.create("base") for _ in range(args.idle)]
        time.sleep(5)
        after = mem_available()
        pss = [host_pss(s.sandbox_id) for s in held]
        cg = [c for c in (cgroup_usage(s.sandbox_id) for s in held) if c is not None]
        mib = 1024 * 1024
        print(f"\nidle sandboxes held: {len(held)}")
        print(f"  host PSS per sandbox (runsc + gofer):  median {statistics.median(pss) / mib:.1f} MiB, max {max(pss) / mib:.1f} MiB")
        if cg:
            print(f"  cgroup memory usage per sandbox:       median {statistics.median(cg) / mib:.1f} MiB, max {max(cg) / mib:.1f} MiB")
        print(f"  MemAvailable drop / sandbox:           {(before - after) / len(held) / mib:.1f} MiB")
        for s in held:
            s.kill()
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
