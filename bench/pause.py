"""Benchmark (not a test): what a full and a filesystem-only pause each write, and how long
the pause and the resume after it take.

Starts its own `airlock serve`. For `base` and `code-interpreter-v1`, a sandbox writes a 50 MB
file (and, in the code interpreter, holds 80 MB of numpy array in its kernel), is paused with
memory, resumed, paused with its files only, and resumed again. Reports the paused image's
size on disk and each step's wall time, as the SDK sees it. Run it with bench/run.sh pause."""

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Server, free_port, use_server  # noqa: E402


def image_mib(data_dir: Path, sandbox_id: str) -> float:
    image = data_dir / "gvisor" / "images" / f"paused-{sandbox_id}"
    out = subprocess.run(["du", "-sb", str(image)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0]) / 2**20


def timed(step):
    start = time.monotonic()
    result = step()
    return result, time.monotonic() - start


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    args = ap.parse_args()
    data_dir = Path(args.data_dir)

    srv = Server(data_dir, free_port())
    srv.start()
    use_server(srv)
    from e2b_code_interpreter import Sandbox

    try:
        print(f"{'template':<22}{'pause':<12}{'image MiB':>10}{'pause s':>9}{'resume s':>10}")
        for template in ("base", "code-interpreter-v1"):
            sbx = Sandbox.create(template)
            if template != "base":
                sbx.run_code("import numpy; held = numpy.ones(10_000_000)")
            sbx.commands.run("head -c 50000000 /dev/urandom > /home/user/blob")
            for mode in ("full", "filesystem"):
                _, paused = timed(lambda: sbx.pause(mode=mode))
                size = image_mib(data_dir, sbx.sandbox_id)
                sbx, resumed = timed(lambda: Sandbox.connect(sbx.sandbox_id))
                print(f"{template:<22}{mode:<12}{size:>10.0f}{paused:>9.2f}{resumed:>10.2f}")
            sbx.kill()
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
