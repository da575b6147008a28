"""Benchmark (not a test): `airlock mcp` driven by the official Python MCP client.

Starts its own `airlock serve`, then reports p50/p95/p99 of:
  * a warm `run_code("1+1")` round trip over stdio, in one session (N calls), and the same
    through the e2b-code-interpreter SDK in the same run, for comparison;
  * a warm round trip over streamable HTTP at /mcp (a session of the initialize handshake);
  * a fresh stdio session's first `run_code("1+1")`, from the call to its result (the session
    starts its sandbox then), and from starting `airlock mcp` to that result (M sessions).

Run it with `bench/run.sh mcp`."""

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import AIRLOCK, API_KEY, start_server  # noqa: E402
from stats import summary  # noqa: E402

from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402


def stdio(url):
    return StdioServerParameters(command=str(AIRLOCK), args=["--url", url, "mcp"],
                                 env={"AIRLOCK_API_KEY": API_KEY})


def http(url):
    client = create_mcp_http_client(headers={"X-API-Key": API_KEY})
    return streamable_http_client(f"{url}/mcp", http_client=client)


async def timed_call(client):
    """Milliseconds of one `run_code("1+1")`; raises unless it answered 2."""
    t = time.perf_counter()
    result = await client.call_tool("run_code", {"code": "1+1"})
    elapsed = (time.perf_counter() - t) * 1000
    text = "".join(c.text for c in result.content if c.type == "text")
    if result.is_error or "2" not in text:
        raise RuntimeError(f"unexpected result: {text}")
    return elapsed


async def warm(transport, n):
    async with Client(transport, mode="legacy") as client:
        await timed_call(client)  # starts the session's sandbox
        return [await timed_call(client) for _ in range(n)]


async def fresh(url):
    """(first call → result, process start → result) of one new stdio session."""
    t = time.perf_counter()
    async with Client(stdio(url), mode="legacy") as client:
        first = await timed_call(client)
        return first, (time.perf_counter() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", type=int, default=100, help="warm run_code calls")
    ap.add_argument("--fresh", type=int, default=20, help="fresh stdio sessions")
    ap.add_argument("--data-dir", required=True, help="a data dir prepared by scripts/prepare.sh")
    args = ap.parse_args()

    srv = start_server(Path(args.data_dir))
    try:
        print(f"# Airlock MCP benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
        print("figure (ms)                                      p50     p95     p99     min     max   n")
        stdio_warm = asyncio.run(warm(stdio(srv.url), args.warm))
        print(f"MCP stdio: run_code('1+1'), warm             {summary(stdio_warm)}  {len(stdio_warm)}")
        http_warm = asyncio.run(warm(http(srv.url), args.warm))
        print(f"MCP HTTP:  run_code('1+1'), warm             {summary(http_warm)}  {len(http_warm)}")

        from e2b_code_interpreter import Sandbox
        sbx = Sandbox.create()
        sbx.run_code("1+1")
        sdk = []
        for _ in range(args.warm):
            t = time.perf_counter()
            assert sbx.run_code("1+1").text == "2"
            sdk.append((time.perf_counter() - t) * 1000)
        sbx.kill()
        print(f"SDK:       run_code('1+1'), warm             {summary(sdk)}  {len(sdk)}")

        sessions = [asyncio.run(fresh(srv.url)) for _ in range(args.fresh)]
        first = [s[0] for s in sessions]
        whole = [s[1] for s in sessions]
        print(f"MCP stdio: fresh session, first run_code     {summary(first)}  {len(first)}")
        print(f"MCP stdio: process start → first result      {summary(whole)}  {len(whole)}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
