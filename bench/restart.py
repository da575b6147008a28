"""Benchmark (not a test): how long a restart takes to put every sandbox's network policy back
and adopt every sandbox.

Starts its own `airlock serve`, creates N sandboxes (default 50), each with a policy
(`allow_out: ["pypi.org"]`, everything else denied), stops the server (SIGKILL by default, as a
crash; `--signal term` as an upgrade or `systemctl restart` does: the sandboxes keep running
either way) and starts it again. Reports how long the stop took, and, from the moment the new
process was started:
  * when the host firewall held every adopted sandbox's rules (the server logs it);
  * when the API answered `/health`;
  * when recovery had adopted every sandbox (the server logs it);
and checks that all N sandboxes answer a command afterwards. Run it with
bench/run.sh restart [--sandboxes N] [--signal kill|term]."""

import argparse
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Server, free_port, use_server  # noqa: E402

TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z")


def logged_at(log: Path, needle: str, after: int):
    """The time (unix seconds) of the first line containing `needle` past byte `after`."""
    text = log.read_bytes()[after:].decode(errors="replace")
    for line in text.splitlines():
        if needle in line:
            stamp = TIMESTAMP.search(line)
            if stamp:
                t = time.strptime(stamp.group(1).split(".")[0], "%Y-%m-%dT%H:%M:%S")
                frac = float("0." + stamp.group(1).split(".")[1])
                return time.mktime(t) - time.timezone + frac
    return None


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandboxes", type=int, default=50)
    ap.add_argument("--signal", choices=["kill", "term"], default="kill",
                    help="how the server is stopped: SIGKILL (a crash) or SIGTERM (a clean stop)")
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    args = ap.parse_args()

    srv = Server(Path(args.data_dir), free_port())
    srv.stop_sandboxes_on_exit = False  # the server's default: sandboxes outlive its stops
    srv.log.write_text("")
    srv.extra_args = ["--pool-size", "2"]
    srv.start()
    use_server(srv)
    from e2b import ALL_TRAFFIC, Sandbox

    made = []
    try:
        rules = {"allow_out": ["pypi.org"], "deny_out": [ALL_TRAFFIC]}
        for _ in range(args.sandboxes):
            made.append(Sandbox.create("base", network=rules, timeout=1800))
        stopping = time.time()
        srv.stop(sig=signal.SIGKILL if args.signal == "kill" else signal.SIGTERM)
        stopped = time.time()
        mark = srv.log.stat().st_size
        started = time.time()
        srv.start()
        healthy = time.time()
        recovered = None
        for _ in range(600):
            recovered = logged_at(srv.log, "recovered sandboxes", mark)
            if recovered:
                break
            time.sleep(0.1)
        firewall = logged_at(srv.log, "host firewall installed, with the rules", mark)
        alive = sum(1 for s in made if Sandbox.connect(s.sandbox_id).commands.run("echo ok").stdout == "ok\n")
        print(f"# Airlock restart benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
        how = "killed with SIGKILL" if args.signal == "kill" else "stopped with SIGTERM"
        print(f"{args.sandboxes} sandboxes, each with allowOut/denyOut rules; the server {how} and started again")
        print(f"  the stop took:                     {(stopped - stopping) * 1000:.0f} ms")
        print(f"  every policy in the host firewall: {'%.0f ms' % ((firewall - started) * 1000) if firewall else 'not logged (before the firewall held them at start)'}")
        print(f"  /health answered:                  {(healthy - started) * 1000:.0f} ms")
        print(f"  every sandbox adopted:             {'%.0f ms' % ((recovered - started) * 1000) if recovered else 'not logged'}")
        print(f"  sandboxes answering a command afterwards: {alive}/{len(made)}")
    finally:
        for s in made:
            try:
                s.kill()
            except Exception:
                pass
        srv.stop()


if __name__ == "__main__":
    main()
