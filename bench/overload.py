"""Benchmark (not a test): a burst of creates far past what the host starts at once.

Starts its own `airlock serve` (extra flags after `--`), waits for the golden images and pools,
then for each size in `--sizes` sends that many `POST /v2/sandboxes` (template `base`) at once,
and runs the first command (`echo ok`, through the e2b SDK) in each sandbox that was made. While
the burst runs, `/health` is asked every 0.25 s. Reports, per burst:
  * made: 201 and its first command answered; refused: 429 (with its Retry-After); failed: else;
  * wall: from the burst's start until the last create or first command answered;
  * the slowest made create + first command, and the slowest 429 (how prompt a refusal is);
  * /health: answers and the slowest of them, and how many failed or took over 5 s.
Every sandbox made is killed before the next burst (20 s apart, so the host is quiet again).

Run it with bench/run.sh overload [--sizes 100,300] [-- serve flags]."""

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import API_KEY, Server, fetch, free_port, use_server  # noqa: E402
from startup import wait_for_pools  # noqa: E402

HEADERS = {"X-API-KEY": API_KEY, "Content-Type": "application/json"}


def watch_health(url, stop, answers):
    """Asks `/health` every 0.25 s until `stop` is set; appends each answer's seconds (None for
    a failure)."""
    while not stop.is_set():
        t = time.perf_counter()
        try:
            status, _, _ = fetch(url + "/health")
            answers.append(time.perf_counter() - t if status == 200 else None)
        except OSError:
            answers.append(None)
        stop.wait(0.25)


def burst(srv, size):
    from e2b import Sandbox

    body = json.dumps({"templateID": "base"}).encode()
    t0 = time.perf_counter()

    def once(_):
        try:
            status, headers, text = fetch(srv.url + "/v2/sandboxes", HEADERS, "POST", body)
        except OSError as e:
            return "failed", time.perf_counter() - t0, str(e), None
        if status == 429:
            return "refused", time.perf_counter() - t0, headers.get("Retry-After"), None
        if status != 201:
            return "failed", time.perf_counter() - t0, f"{status} {text[:200]!r}", None
        sandbox_id = json.loads(text)["sandboxID"]
        try:
            ok = Sandbox.connect(sandbox_id).commands.run("echo ok").stdout == "ok\n"
        except Exception as e:  # counted, not hidden
            return "failed", time.perf_counter() - t0, str(e), sandbox_id
        return ("made" if ok else "failed"), time.perf_counter() - t0, None, sandbox_id

    stop, answers = threading.Event(), []
    watcher = threading.Thread(target=watch_health, args=(srv.url, stop, answers))
    watcher.start()
    with ThreadPoolExecutor(size) as pool:
        results = list(pool.map(once, range(size)))
    stop.set()
    watcher.join()
    for sandbox_id in {r[3] for r in results if r[3]}:
        fetch(srv.url + f"/sandboxes/{sandbox_id}", HEADERS, "DELETE")
    by = {k: [r for r in results if r[0] == k] for k in ("made", "refused", "failed")}
    for _, _, why, _ in by["failed"][:3]:
        print(f"  failure: {why}", file=sys.stderr)
    answered = [a for a in answers if a is not None]
    return {
        "size": size,
        "made": len(by["made"]),
        "refused": len(by["refused"]),
        "failed": len(by["failed"]),
        "wall": max(r[1] for r in results),
        "slowest_made": max((r[1] for r in by["made"]), default=0),
        "slowest_429": max((r[1] for r in by["refused"]), default=0),
        "retry_after": sorted({r[2] for r in by["refused"]}, key=lambda s: int(s or 0)),
        "health": f"{len(answered)}/{len(answers)}, slowest {max(answered, default=0):.2f}s, "
                  f"{sum(1 for a in answers if a is None or a > 5)} over 5 s or failed",
    }


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,300", help="comma-separated burst sizes (creates at once)")
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    ap.add_argument("serve_flags", nargs="*", help="more `airlock serve` flags (after --)")
    args = ap.parse_args()
    data_dir = Path(args.data_dir)
    srv = Server(data_dir, free_port())
    srv.log.write_text("")
    srv.extra_args = list(args.serve_flags)
    srv.start()
    use_server(srv)
    try:
        wait_for_pools(srv)
        print(f"# Airlock overload benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
        print(f"serve flags: {' '.join(srv.extra_args)}\n")
        print(f"{'creates':>7} {'made':>5} {'429':>5} {'failed':>6} {'wall s':>7} {'slowest made s':>14} "
              f"{'slowest 429 s':>13}  Retry-After    /health")
        for i, size in enumerate(int(s) for s in args.sizes.split(",")):
            if i:
                time.sleep(20)
            r = burst(srv, size)
            print(f"{r['size']:>7} {r['made']:>5} {r['refused']:>5} {r['failed']:>6} {r['wall']:>7.1f} "
                  f"{r['slowest_made']:>14.1f} {r['slowest_429']:>13.2f}  {','.join(r['retry_after']) or '-':<13}  "
                  f"{r['health']}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
