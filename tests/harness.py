"""Starting and stopping a real `airlock serve` for the integration tests and the benchmarks."""

import http.client
import ipaddress
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AIRLOCK = Path(os.environ.get("AIRLOCK_BIN", REPO / "target" / "release" / "airlock"))
JS_DIR = REPO / "tests" / "js"  # the pinned npm `e2b` package
# Made afresh by each process that imports this: no key written in the repo opens anything.
API_KEY = "e2b_" + secrets.token_hex(20)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `airlock serve` process; can be killed and started again on the same data dir."""

    def __init__(self, data_dir: Path, port: int):
        self.data_dir = data_dir
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None
        self.log = data_dir / "server-test.log"
        self.extra_args = []  # more `airlock serve` flags
        # Sandboxes die with the server unless a test says otherwise, so that a run leaves the
        # host as it found it (the server's own default keeps them running).
        self.stop_sandboxes_on_exit = True
        self.listen_host = "127.0.0.1"

    def start(self):
        # A short ready timeout, so that a test of a start command that never becomes ready
        # waits for it in seconds, not the default five minutes.
        env = dict(os.environ, AIRLOCK_API_KEY=API_KEY, AIRLOCK_LOG="info",
                   AIRLOCK_READY_TIMEOUT="30",
                   AIRLOCK_STOP_SANDBOXES_ON_EXIT=str(self.stop_sandboxes_on_exit).lower())
        self.proc = subprocess.Popen(
            [str(AIRLOCK), "--data-dir", str(self.data_dir), "serve", "--listen", f"{self.listen_host}:{self.port}", *self.extra_args],
            stdout=open(self.log, "ab"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"airlock serve exited early:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("airlock serve did not become healthy in 60s")

    def stop(self, sig=signal.SIGTERM, timeout=90):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=timeout)
        self.proc = None

    def js(self, code, *args, timeout=300):
        """Runs `code` (an ES module; `process.argv[1]` onwards are `args`) with Node and the
        pinned npm `e2b` SDK pointed at this server; returns the JSON of its last output line."""
        env = dict(os.environ, E2B_API_KEY=API_KEY, E2B_API_URL=self.url,
                   E2B_SANDBOX_URL=self.url)
        out = subprocess.run(["node", "--input-type=module", "-e", code, *args],
                             cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    def sandbox_port(self, sandbox_id, port, path="/", method="GET", body=None, headers=None):
        """A request to a sandbox's `port` through the server's proxy, named by its host as a
        browser would; returns (status, body text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request(method, path, body=body,
                     headers={"Host": f"{port}-{sandbox_id}.airlock.test", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")

    def reset_peak_memory(self):
        """Starts the server's peak resident memory (`peak_memory_mib`) afresh from now."""
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")

    def peak_memory_mib(self):
        """The server's peak resident memory (VmHWM), in MiB."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(l for l in status.splitlines() if l.startswith("VmHWM")).split()[1]) // 1024

    def api(self, method, path, body=None, key=API_KEY, raw=None, headers=None):
        """A raw control-plane call; returns (status, parsed JSON or None)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        sent = {"X-API-KEY": key} if key is not None else {}
        sent = {**sent, "Content-Type": "application/json", **(headers or {})}
        status, _, text = fetch(self.url + path, sent, method, data)
        return status, (json.loads(text) if text else None)


def exports(text):
    """The variables that `export A=1 B="2 3"` lines (a script's output, to eval) set."""
    found = {}
    for line in text.splitlines():
        if line.startswith("export "):
            found.update(word.split("=", 1) for word in shlex.split(line)[1:])
    return found


def fetch(url, headers=None, method="GET", data=None):
    """One HTTP request; returns (status, headers, body bytes), error statuses included."""
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def host_leftovers(data_dir: Path):
    """What Airlock-made host resources exist right now (runsc processes, netns, veths, mounts)."""
    netns = sorted(p.name for p in Path("/run/netns").glob("al-*")) if Path("/run/netns").exists() else []
    links = sorted(p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith("alv"))
    procs = subprocess.run(["pgrep", "-f", f"runsc.*{data_dir}"], capture_output=True, text=True).stdout.split()
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(data_dir) in line]
    return {"netns": netns, "links": links, "runsc": procs, "mounts": mounts}


def slot(address: str) -> int:
    """The network slot of a sandbox's address (`hostname -I` inside it): slot N has the /30
    at 10.77.0.0 + 4N (slots.rs), and its link is `alv{N}`."""
    return (int(ipaddress.IPv4Address(address)) - int(ipaddress.IPv4Address("10.77.0.0"))) // 4


def footprint(data_dir: Path, sandbox_id: str, address: str):
    """What the host holds for one sandbox (its address: `hostname -I` inside it): its netns,
    veth, runsc processes, mounts and cgroups."""
    left = host_leftovers(data_dir)
    procs = subprocess.run(["pgrep", "-f", f"runsc.*{sandbox_id}"], capture_output=True, text=True).stdout.split()
    return {
        "netns": [n for n in left["netns"] if sandbox_id in n],
        "links": [n for n in left["links"] if n == f"alv{slot(address)}"],
        "runsc": [p for p in procs if p in left["runsc"]],
        "mounts": [m for m in left["mounts"] if sandbox_id in m],
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/airlock/{sandbox_id}")),
    }


def use_server(srv: Server):
    """Points the e2b SDK (via its environment variables) at `srv`."""
    os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url,
                      E2B_VOLUME_API_URL=srv.url)
    os.environ.pop("E2B_DEBUG", None)


def start_server(data_dir: Path, extra_args=()) -> Server:
    """Starts `airlock serve` on a free port over `data_dir` (with more `serve` flags, if any)
    and points the SDK at it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    srv = Server(data_dir, free_port())
    srv.extra_args = list(extra_args)
    srv.start()
    use_server(srv)
    return srv


def build_messages(logs):
    """The messages of a template build's log entries (`on_build_logs`)."""
    return [str(entry.message) for entry in logs]
