"""Benchmark (not a test): the code interpreter through the stock e2b-code-interpreter SDK.

Starts its own `airlock serve`, then reports p50/p95/p99 and success rate of:
  * a warm `run_code("1+1")` round trip in one sandbox (N calls);
  * a fresh `code-interpreter-v1` sandbox to its first `run_code` that uses pandas
    (`Sandbox.create()` + `run_code("import pandas as pd; pd.DataFrame({'a': [1]}).shape")`),
    over M sandboxes, each killed before the next.

Run it with `bench/run.sh interpreter`."""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import start_server  # noqa: E402
from stats import summary  # noqa: E402

PANDAS_CODE = "import pandas as pd; pd.DataFrame({'a': [1]}).shape"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", type=int, default=100, help="warm run_code calls")
    ap.add_argument("--fresh", type=int, default=20, help="fresh sandboxes")
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    args = ap.parse_args()

    srv = start_server(Path(args.data_dir))
    from e2b_code_interpreter import Sandbox

    try:
        print(f"# Airlock code-interpreter benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
        print("figure (ms)                                  p50     p95     p99     min     max   ok")
        sbx = Sandbox.create()
        sbx.run_code("1+1")
        warm, failures = [], 0
        for _ in range(args.warm):
            t = time.perf_counter()
            ok = sbx.run_code("1+1").text == "2"
            if ok:
                warm.append((time.perf_counter() - t) * 1000)
            else:
                failures += 1
        sbx.kill()
        print(f"warm run_code('1+1')                         {summary(warm)}  {len(warm)}/{args.warm}")

        fresh, failures = [], 0
        for _ in range(args.fresh):
            try:
                t = time.perf_counter()
                s = Sandbox.create()
                result = s.run_code(PANDAS_CODE)
                elapsed = (time.perf_counter() - t) * 1000
                s.kill()
                if result.error or result.text != "(1, 1)":
                    raise RuntimeError(f"unexpected result {result}")
                fresh.append(elapsed)
            except Exception as e:  # counted, not hidden
                failures += 1
                print(f"  failure: {e}", file=sys.stderr)
        print(f"fresh sandbox → first run_code with pandas   {summary(fresh) if fresh else 'n/a'}  {len(fresh)}/{args.fresh}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
