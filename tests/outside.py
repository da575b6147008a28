"""A stand-in for a host beyond this machine, which the tests own: a network namespace behind a
veth, routed from the host like any next hop, listening on addresses a sandbox's packets name.

- `public` and `public2` (TEST-NET-2): addresses no policy of the platform denies, so a sandbox
  reaches them through the host's NAT as it reaches the internet, without the internet;
- `METADATA` (169.254.169.254) and `private` (its link's own address, in 172.16.0.0/12):
  addresses the platform denies whatever a policy says, with a real listener behind them, so a
  probe that reaches them sees an answer.

Every address answers HTTP/1.1 on ports 80 and 8080 and TLS (a self-signed certificate, then
HTTP/1.1) on 443 and 8443: one `HTTP/1.1 200` per request head, kept alive. Each connection
is logged (`seen`), so a test can tell that nothing arrived, not only that nothing answered.
One at a time per host (the serve lock): the names are fixed, and a run that died is cleaned up
by the next."""

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

NETNS = "airlock-test-outside"
HOST_LINK, OUTSIDE_LINK = "airt-host", "airt-outside"
HOST_ADDR, OUTSIDE_ADDR = "172.31.255.1", "172.31.255.2"
PUBLIC, PUBLIC2 = "198.51.100.80", "198.51.100.81"
METADATA = "169.254.169.254"
ROUTED = (PUBLIC, PUBLIC2, METADATA)  # OUTSIDE_ADDR is on the link itself

LISTENER = r'''
import asyncio, ssl, sys
cert, key, log = sys.argv[1:4]
seen = open(log, "a", buffering=1)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain(cert, key)

async def serve(reader, writer):
    local, peer = writer.get_extra_info("sockname"), writer.get_extra_info("peername")
    seen.write(f"{local[0]} {local[1]} {peer[0]}\n")
    try:
        while True:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            if b"connection: close" in head.lower():
                break
    except Exception:
        pass
    writer.close()

async def main():
    servers = [await asyncio.start_server(serve, "0.0.0.0", port, ssl=tls if port % 1000 == 443 else None,
                                          backlog=1024)
               for port in (80, 443, 8080, 8443)]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))

asyncio.run(main())
'''


def ip(*args, check=True):
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def remove():
    """Takes down what a run made (the link goes with the namespace), if anything."""
    for addr in ROUTED:
        ip("route", "del", f"{addr}/32", check=False)
    ip("netns", "del", NETNS, check=False)
    ip("link", "del", HOST_LINK, check=False)


class Outside:
    """The namespace, its routes and its listener; `stop()` removes them all."""

    public, public2, private = PUBLIC, PUBLIC2, OUTSIDE_ADDR

    def __init__(self):
        remove()
        self.dir = Path(tempfile.mkdtemp(prefix="airlock-outside-"))
        self.log = self.dir / "seen"
        self.log.touch()
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                        "-subj", "/CN=outside.airlock.test", "-keyout", str(self.dir / "key"),
                        "-out", str(self.dir / "cert")], check=True, capture_output=True)
        ip("netns", "add", NETNS)
        ip("link", "add", HOST_LINK, "type", "veth", "peer", "name", OUTSIDE_LINK)
        ip("link", "set", OUTSIDE_LINK, "netns", NETNS)
        ip("addr", "add", f"{HOST_ADDR}/30", "dev", HOST_LINK)
        ip("link", "set", HOST_LINK, "up")
        for args in (("link", "set", "lo", "up"),
                     ("addr", "add", f"{OUTSIDE_ADDR}/30", "dev", OUTSIDE_LINK),
                     *(("addr", "add", f"{a}/32", "dev", OUTSIDE_LINK) for a in ROUTED),
                     ("link", "set", OUTSIDE_LINK, "up"),
                     ("route", "add", "default", "via", HOST_ADDR)):
            ip("-n", NETNS, *args)
        for addr in ROUTED:
            ip("route", "replace", f"{addr}/32", "via", OUTSIDE_ADDR)
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, sys.executable, "-c", LISTENER,
             str(self.dir / "cert"), str(self.dir / "key"), str(self.log)],
            stdout=subprocess.PIPE, stderr=open(self.dir / "listener.err", "ab"), text=True)
        if self.proc.stdout.readline().strip() != "ready":
            why = (self.dir / "listener.err").read_text()
            self.stop()
            raise RuntimeError(f"the outside listener did not start: {why}")
        # The control for every test that uses it: the host itself reaches it.
        socket.create_connection((PUBLIC, 80), timeout=5).close()

    def seen(self, addr):
        """The sources of the connections that arrived at `addr`, in order."""
        return [words[2] for words in map(str.split, self.log.read_text().splitlines())
                if words[0] == addr]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        remove()
        shutil.rmtree(self.dir, ignore_errors=True)
