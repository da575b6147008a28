"""Benchmark (not a test): start-up, resume and idle memory, measured through the stock e2b SDKs.

Starts its own `airlock serve` (with `--pool-size`), waits until the templates' golden images
and pools are ready, then reports p50/p95/p99, min, max and success rate of:
  * a cold gVisor launch (`runsc do /bin/true`), for reference, in the same run;
  * create → first command: `Sandbox.create()` then `commands.run("echo ok")`, creates paced
    `--interval` seconds apart (the pool refills in between) and back to back (the pool runs dry
    and creates restore on demand);
  * a fresh code-interpreter sandbox → its first `run_code` that uses pandas;
  * resume of a paused sandbox → its first command (`Sandbox.connect()` + `commands.run`);
  * bursts: N creates at once (`--bursts`), each then running its first command; the wall time
    of each burst and every create's own time, for a few bursts in a row (`--rounds`, 20 s
    apart: the pool grows with demand, so later bursts find more sandboxes ready);
  * the same with network rules (applied to a pooled sandbox as it is handed over) and with a
    size of its own (`memoryMB`: no pool, the golden image is restored on demand);
  * what a command costs inside gVisor (bash -l vs /bin/true), the floor under the figures above;
  * an idle sandbox's CPU use (its cgroup's `cpuacct.usage` over 10 s);
  * idle memory: K sandboxes held at once, each one's cgroup memory and host PSS.

Run it with bench/run.sh startup (which builds everything first)."""

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import API_KEY, Server, free_port, use_server  # noqa: E402

MIB = 1024 * 1024


def pct(values, p):
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def row(label, ms, n):
    if not ms:
        return f"{label:<46} {'-':>7} {'-':>7} {'-':>7} {'-':>7} {'-':>7}  0/{n}"
    return (f"{label:<46} {pct(ms, 50):7.1f} {pct(ms, 95):7.1f} {pct(ms, 99):7.1f} "
            f"{min(ms):7.1f} {max(ms):7.1f}  {len(ms)}/{n}")


def timed(n, once, interval=0.0):
    """Runs `once` n times; returns the successful durations in ms (failures are printed)."""
    out = []
    for _ in range(n):
        try:
            out.append(once())
        except Exception as e:  # counted in the success rate, not hidden
            print(f"  failure: {e}", file=sys.stderr)
        time.sleep(interval)
    return out


def cold_runsc(n):
    def once():
        t = time.perf_counter()
        subprocess.run(["runsc", "--network=none", "do", "/bin/true"], capture_output=True, check=True)
        return (time.perf_counter() - t) * 1000
    return timed(n, once)


def wait_for_pools(srv, seconds=300):
    """Waits until every template's golden image exists and its pool has filled (the server logs
    both); returns how long that took."""
    t = time.time()
    log = srv.log
    while time.time() - t < seconds:
        text = log.read_text(errors="replace")
        if text.count("golden image ready") + text.count("golden image reused") >= 2:
            time.sleep(5)  # the pools fill right after
            return time.time() - t
        time.sleep(0.5)
    raise RuntimeError("golden images were not ready in time; see " + str(log))


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


def mem_available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


# What `--only` can pick; each is a group of the rows described at the top.
SECTIONS = ["cold", "create", "burst", "variants", "interpreter", "resume", "floor", "idle"]


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between paced creates")
    ap.add_argument("--pool-size", type=int, default=2)
    ap.add_argument("--idle", type=int, default=50,
                    help="sandboxes held at once for the memory figure (each idle sandbox costs 3-5%% of a core here)")
    ap.add_argument("--bursts", default="20,40", help="comma-separated burst sizes (creates at once)")
    ap.add_argument("--rounds", type=int, default=3, help="bursts of each size, 20 s apart")
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run, of: {', '.join(SECTIONS)} (default: all)")
    args = ap.parse_args()
    n = args.iterations
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        ap.error(f"unknown sections: {', '.join(sorted(only - set(SECTIONS)))}")

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    srv = Server(data_dir, free_port())
    srv.log.write_text("")
    srv.extra_args = ["--pool-size", str(args.pool_size), "--max-sandboxes", str(max(256, args.idle + 10))]
    srv.start()
    use_server(srv)
    from e2b import Sandbox
    from e2b_code_interpreter import Sandbox as CodeSandbox

    try:
        ready = wait_for_pools(srv)
        print(f"# Airlock start-up benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
        print(f"pool size {args.pool_size} per template; golden images and pools ready {ready:.1f}s after start\n")
        print(f"{'figure (ms)':<46} {'p50':>7} {'p95':>7} {'p99':>7} {'min':>7} {'max':>7}  ok")
        if "cold" in only:
            print(row("cold gVisor launch (runsc do /bin/true)", cold_runsc(n), n))

        Sandbox.create("base").kill()  # warm the SDK's imports and connection pool
        time.sleep(2)

        def create_then_command(create=lambda: Sandbox.create("base")):
            """Times `create()` plus the sandbox's first command."""
            t0 = time.perf_counter()
            sbx = create()
            out = sbx.commands.run("echo ok").stdout
            ms = (time.perf_counter() - t0) * 1000
            sbx.kill()
            if out != "ok\n":
                raise RuntimeError(f"unexpected output {out!r}")
            return ms

        creates = []

        def create_only():
            t0 = time.perf_counter()
            sbx = Sandbox.create("base")
            creates.append((time.perf_counter() - t0) * 1000)
            sbx.kill()
            return creates[-1]

        if "create" in only:
            print(row(f"create → first command, paced {args.interval}s", timed(n, create_then_command, args.interval), n))
            print(row("  Sandbox.create() alone, paced", timed(n, create_only, args.interval), n))
            print(row("create → first command, back to back", timed(n, create_then_command), n))
            time.sleep(5)

        if "burst" in only:
            for size in [int(b) for b in args.bursts.split(",")]:
                for r in range(1, args.rounds + 1):
                    wall, each = burst(size, create_then_command)
                    print(row(f"{size} at once, burst {r}: each (wall {wall:.2f} s)", each, size))
                    time.sleep(20)

        def with_rules():
            rules = {"allow_out": ["pypi.org"], "deny_out": ["0.0.0.0/0"]}
            return create_then_command(lambda: Sandbox.create("base", network=rules))

        def sized():
            status, body = srv.api("POST", "/v2/sandboxes", {"templateID": "base", "memoryMB": 512})
            if status != 201:
                raise RuntimeError(f"create failed: {status} {body}")
            return Sandbox.connect(body["sandboxID"])

        if "variants" in only:
            print(row("  with allowOut/denyOut rules, paced", timed(n, with_rules, args.interval), n))
            print(row("  with memoryMB=512 (no pool), paced", timed(n, lambda: create_then_command(sized), args.interval), n))

        def fresh_pandas():
            t0 = time.perf_counter()
            sbx = CodeSandbox.create()
            ex = sbx.run_code("import pandas as pd\nint(pd.DataFrame({'a': [1, 2, 3]})['a'].sum())")
            ms = (time.perf_counter() - t0) * 1000
            sbx.kill()
            if ex.error or ex.text != "6":
                raise RuntimeError(f"unexpected result {ex.text!r} {ex.error}")
            return ms

        if "interpreter" in only:
            print(row("fresh code interpreter → first pandas run_code", timed(n, fresh_pandas, args.interval), n))

        def resume_then_command():
            paused.pause()
            t0 = time.perf_counter()
            paused.connect()
            out = paused.commands.run("cat /home/user/kept.txt").stdout
            ms = (time.perf_counter() - t0) * 1000
            if out != "kept":
                raise RuntimeError(f"unexpected output {out!r}")
            return ms

        if "resume" in only:
            paused = Sandbox.create("base", timeout=3600)
            paused.files.write("/home/user/kept.txt", "kept")
            print(row("resume of a paused sandbox → first command", timed(n, resume_then_command), n))
            paused.kill()
        if "floor" in only:
            floor()
        if "idle" in only:
            hold_idle(args.idle)
    finally:
        srv.stop()


def burst(size, create_then_command):
    """`size` creates at once, each followed by its first command. Returns the wall time in
    seconds, from the burst's start until the last first command answered (the kills after each
    command are not counted), and each create's own time in ms."""
    from concurrent.futures import ThreadPoolExecutor

    def once(_):
        started = time.perf_counter()
        try:
            ms = create_then_command()
            return ms, started + ms / 1000
        except Exception as e:  # counted in the success rate, not hidden
            print(f"  failure: {e}", file=sys.stderr)
            return None

    t0 = time.perf_counter()
    with ThreadPoolExecutor(size) as pool:
        results = [r for r in pool.map(once, range(size)) if r is not None]
    wall = max((end for _, end in results), default=t0) - t0
    return wall, [ms for ms, _ in results]


def floor():
    """What a command costs inside gVisor, and what an idle sandbox costs the host's CPU."""
    from e2b import Sandbox
    probe = Sandbox.create("base")
    inside = json.loads(probe.commands.run(
        "python3 - <<'EOF'\n"
        "import json, subprocess, time\n"
        "def t(cmd):\n"
        "    out = []\n"
        "    for _ in range(20):\n"
        "        s = time.perf_counter(); subprocess.run(cmd); out.append((time.perf_counter() - s) * 1000)\n"
        "    return sorted(out)[10]\n"
        "print(json.dumps({'bash': t(['/bin/bash', '-l', '-c', 'echo ok >/dev/null']), 'true': t(['/bin/true'])}))\n"
        "EOF").stdout)
    idle_cpu = Path(f"/sys/fs/cgroup/cpuacct/airlock/{probe.sandbox_id}/cpuacct.usage")
    cpu_share = None
    if idle_cpu.exists():
        time.sleep(2)
        c0, t0 = int(idle_cpu.read_text()), time.time()
        time.sleep(10)
        cpu_share = (int(idle_cpu.read_text()) - c0) / 1e9 / (time.time() - t0)
    probe.kill()
    if cpu_share is not None:
        print(f"\nan idle sandbox uses {cpu_share * 100:.1f} % of a core (cpuacct over 10 s)")
    print(f"\ninside gVisor, median of 20: `bash -l -c 'echo ok'` {inside['bash']:.1f} ms, "
          f"`/bin/true` {inside['true']:.1f} ms (what every SDK command starts with)")


def hold_idle(count):
    """Holds `count` idle sandboxes at once and reports their memory."""
    from e2b import Sandbox
    time.sleep(5)
    before = mem_available()
    t0 = time.time()
    held = []
    for _ in range(count):
        try:
            held.append(Sandbox.create("base", timeout=3600))
        except Exception as e:
            print(f"  failure holding sandbox {len(held) + 1}: {e}", file=sys.stderr)
            break
    took = time.time() - t0
    time.sleep(10)
    alive = sum(1 for s in held if s.commands.run("echo ok").stdout == "ok\n")
    after = mem_available()
    cg = [cgroup_usage(s.sandbox_id) for s in held]
    pss = [host_pss(s.sandbox_id) for s in held]
    print(f"\nidle sandboxes held at once: {len(held)}/{count} created in {took:.0f}s, {alive} answering a command")
    known = [c for c in cg if c is not None]
    if known:
        print(f"  cgroup memory per sandbox: median {statistics.median(known) / MIB:.1f} MiB, "
              f"max {max(known) / MIB:.1f} MiB, total {sum(known) / MIB / 1024:.2f} GiB")
    print(f"  host PSS per sandbox (runsc sandbox + gofer): median {statistics.median(pss) / MIB:.1f} MiB, "
          f"max {max(pss) / MIB:.1f} MiB")
    print(f"  MemAvailable drop: {(before - after) / MIB / 1024:.2f} GiB, {(before - after) / max(len(held), 1) / MIB:.1f} MiB per sandbox")
    print("  each sandbox's cgroup memory (MiB), in creation order:")
    values = [f"{c / MIB:.1f}" if c is not None else "?" for c in cg]
    for i in range(0, len(values), 20):
        print("   ", " ".join(values[i:i + 20]))
    for s in held:
        s.kill()


if __name__ == "__main__":
    main()
