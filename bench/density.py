"""Benchmark (not a test): many idle sandboxes on one host. Starts its own `airlock serve`.

Holds N idle `base` sandboxes for each N of `--counts` (adding sandboxes as N grows, while the
host has memory to spare), and reports at each N:
  * how many are frozen, and the CPU all sandboxes use together (their cgroups' `cpuacct.usage`
    over 10 s, in cores), with the host's load average;
  * host memory per idle sandbox (the drop in `MemAvailable` since the start, divided by N);
  * a neighbour's command latency: another sandbox's `commands.run("echo ok")`, 2 s apart (so
    each one finds it frozen again and thaws it);
  * a paced create series: create → first command → kill, 1 s apart (failures are shown).

Run it with bench/run.sh density [--counts 200,500,1000] [--freeze-after-ms 0 to compare]."""

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Server, free_port, use_server  # noqa: E402

CGROUP = Path("/sys/fs/cgroup")
# The host keeps this much memory free: sandboxes stop being added below it.
RESERVE_MB = 2048


def mem_available_mb():
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def sandbox_cgroups():
    return [d for d in (CGROUP / "cpuacct/airlock").iterdir() if d.is_dir()]


def cores_used(seconds=10):
    """All sandboxes' CPU use together, in cores, over `seconds`."""

    def total():
        used = 0
        for d in sandbox_cgroups():
            try:
                used += int((d / "cpuacct.usage").read_text())
            except OSError:
                pass  # gone meanwhile
        return used

    before, start = total(), time.monotonic()
    time.sleep(seconds)
    return (total() - before) / 1e9 / (time.monotonic() - start)


def frozen(ids):
    def state(i):
        try:
            return (CGROUP / "freezer/airlock" / i / "freezer.state").read_text().strip()
        except OSError:
            return None

    return sum(1 for i in ids if state(i) == "FROZEN")


def ms_summary(values):
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"p50 {statistics.median(values) * 1000:6.0f} ms  p99 {p99 * 1000:6.0f} ms  (n={len(values)})"


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    ap.add_argument("--counts", default="200,500,1000", help="idle sandboxes to hold, in turn")
    ap.add_argument("--freeze-after-ms", type=int, default=1000, help="the server's flag")
    ap.add_argument("--parallel", type=int, default=4, help="creates at once while filling up")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    srv = Server(Path(args.data_dir), free_port())
    srv.extra_args = ["--max-sandboxes", str(max(counts) + 20),
                      "--freeze-after-ms", str(args.freeze_after_ms)]
    srv.start()
    use_server(srv)
    from e2b import Sandbox

    held = []
    try:
        time.sleep(20)  # the pools fill after the start
        baseline_mb = mem_available_mb()
        neighbour = Sandbox.create("base", timeout=3600)

        failures = []

        def make():
            try:
                sbx = Sandbox.create("base", timeout=3600)
                sbx.commands.run("echo ok")
                return [sbx]
            except Exception as e:  # counted and shown, not hidden
                failures.append(e)
                print(f"  create failed: {e}", file=sys.stderr)
                return []

        print(f"freeze after {args.freeze_after_ms} ms; host MemAvailable {baseline_mb} MiB")
        for n in counts:
            started = time.monotonic()
            with ThreadPoolExecutor(args.parallel) as pool:
                while len(held) < n and mem_available_mb() > RESERVE_MB and len(failures) < 10:
                    batch = min(args.parallel * 4, n - len(held))
                    for made in pool.map(lambda _: make(), range(batch)):
                        held.extend(made)
            filled = time.monotonic() - started
            if len(held) < n:
                print(f"held {len(held)} sandboxes, not {n}: {len(failures)} creates failed, "
                      f"MemAvailable {mem_available_mb()} MiB")
            time.sleep(15)  # let them go quiet
            ids = [s.sandbox_id for s in held]
            cores = cores_used()
            load = os.getloadavg()[0]
            per_sandbox = (baseline_mb - mem_available_mb()) / len(held)
            print(f"\nN = {len(held)} idle (filled in {filled:.0f} s)")
            print(f"  frozen                  {frozen(ids)}/{len(ids)}")
            print(f"  CPU of all sandboxes    {cores:.3f} cores   load average (1 min) {load:.2f}")
            print(f"  host memory per sandbox {per_sandbox:.1f} MiB")
            neighbour_times = []
            for _ in range(10):
                start = time.monotonic()
                neighbour.commands.run("echo ok")
                neighbour_times.append(time.monotonic() - start)
                time.sleep(2)
            print(f"  neighbour's echo        {ms_summary(neighbour_times)}")
            create_times = []
            for _ in range(10):
                start = time.monotonic()
                made = make()
                if made:
                    create_times.append(time.monotonic() - start)
                    made[0].kill()
                time.sleep(1)
            if create_times:
                print(f"  paced create → first command {ms_summary(create_times)}")
            if len(held) < n:
                break
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: s.kill(), held))
        srv.stop()


if __name__ == "__main__":
    main()
