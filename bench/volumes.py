"""Benchmark (not a test): what a volume costs. Starts its own `airlock serve`.

Reports the time to create a volume; create → first command for `base` with no volume (from the
pool) and with one mounted (a restore of its own: sandboxes with volumes do not come from the
pool); and `dd` throughput inside a sandbox to and from a mounted volume against its own disk.
Run it with bench/run.sh volumes."""

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Server, free_port, use_server  # noqa: E402

RUNS = 10
MIB = 200


def ms(seconds):
    return f"{seconds * 1000:7.0f} ms"


def summary(label, times):
    times = sorted(times)
    p90 = times[max(0, int(len(times) * 0.9) - 1)]
    print(f"{label:<38} p50 {ms(statistics.median(times))}   p90 {ms(p90)}   (n={len(times)})")


def dd_rate(sbx, command):
    out = sbx.commands.run(f"{command} 2>&1 | tail -1", timeout=300).stdout
    # dd's last line: "... copied, 0.5 s, 400 MB/s"
    return out.strip().split(",")[-1].strip()


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    args = ap.parse_args()
    srv = Server(Path(args.data_dir), free_port())
    srv.start()
    use_server(srv)
    from e2b import Sandbox, Volume

    try:
        time.sleep(20)  # the pools fill after the start
        made = []
        for _ in range(RUNS):
            start = time.monotonic()
            made.append((Volume.create(f"bench-{uuid.uuid4().hex[:8]}"), time.monotonic() - start))
        summary("Volume.create", [t for _, t in made])
        volume = made[0][0]

        for label, mounts in (("create → first command, no volume", None),
                              ("create → first command, one volume", {"/mnt/v": volume})):
            times = []
            for _ in range(RUNS):
                start = time.monotonic()
                sbx = Sandbox.create("base", volume_mounts=mounts) if mounts else Sandbox.create("base")
                sbx.commands.run("true")
                times.append(time.monotonic() - start)
                sbx.kill()
                time.sleep(3)  # let the pool refill, as between a user's creates
            summary(label, times)

        sbx = Sandbox.create("base", volume_mounts={"/mnt/v": volume})
        for where, path in (("own disk", "/home/user/f"), ("volume", "/mnt/v/f")):
            write = dd_rate(sbx, f"dd if=/dev/zero of={path} bs=1M count={MIB} conv=fsync")
            read = dd_rate(sbx, f"dd if={path} of=/dev/null bs=1M")
            print(f"dd {MIB} MiB, {where:<9}  write {write:>12}   read {read:>12}")
            sbx.commands.run(f"rm {path}")
        sbx.kill()
        for vol, _ in made:
            Volume.destroy(vol.volume_id)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
