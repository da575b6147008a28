"""Benchmark (not a test): moving bytes in and out of a sandbox. Starts its own `airlock serve`.

Reports, for one file of random bytes: `files.write` (upload), `files.read` (download), a raw GET
of the file's download URL, and `cat` of it inside the sandbox (the floor); then a command whose
stdout is streamed back (base64 of random bytes). Run it with bench/run.sh transfer."""

import argparse
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Server, free_port, use_server  # noqa: E402

RUNS = 5


def rate(label, size, times):
    best, median = min(times), statistics.median(times)
    mib = size / 2**20
    print(f"{label:<36} {mib:5.0f} MiB   p50 {mib / median:7.0f} MiB/s   best {mib / best:7.0f} MiB/s")


def timed(fn):
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def raw_get(url):
    with urllib.request.urlopen(url) as resp:
        while resp.read(1 << 20):
            pass


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    ap.add_argument("--mib", type=int, default=200, help="file size")
    args = ap.parse_args()
    srv = Server(Path(args.data_dir), free_port())
    srv.start()
    use_server(srv)
    from e2b import Sandbox

    data = os.urandom(args.mib << 20)
    path = "/home/user/blob"
    try:
        sbx = Sandbox.create("base", timeout=600)
        rate("files.write (upload)", len(data),
             [timed(lambda: sbx.files.write(path, data)) for _ in range(RUNS)])
        assert sbx.files.read(path, format="bytes") == data
        rate("files.read (download)", len(data),
             [timed(lambda: sbx.files.read(path, format="bytes")) for _ in range(RUNS)])
        url = sbx.download_url(path)
        rate("GET download URL", len(data), [timed(lambda: raw_get(url)) for _ in range(RUNS)])
        rate("cat inside the sandbox", len(data),
             [timed(lambda: sbx.commands.run(f"cat {path} > /dev/null")) for _ in range(RUNS)])
        out_mib = 50
        cmd = f"head -c {out_mib}M {path} | base64 -w 0"
        rate("command stdout (base64, streamed)", out_mib * 4 / 3 * 2**20,
             [timed(lambda: sbx.commands.run(cmd, timeout=300)) for _ in range(RUNS)])
        sbx.kill()
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
