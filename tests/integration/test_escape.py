"""Hostile programs inside a sandbox must fail to reach the host, the control API or another
sandbox. Every probe also runs a positive control through the same code path (a target inside
the sandbox that it *may* reach), so a probe that could never detect anything cannot pass."""

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest
from e2b import Sandbox


def py(sbx, code, user="root"):
    """Runs Python inside the sandbox as `user` and returns its JSON answer."""
    result = sbx.commands.run(f"python3 - <<'EOF'\n{code}\nEOF", user=user, timeout=60)
    return json.loads(result.stdout)


@pytest.fixture
def host_secret(tmp_path_factory):
    secret = uuid.uuid4().hex
    d = tmp_path_factory.mktemp("escape")
    (d / "secret.txt").write_text(secret)
    yield str(d / "secret.txt"), secret


def test_host_files_are_out_of_reach(sandbox, host_secret):
    path, secret = host_secret
    sandbox.files.write("/home/user/inside.txt", "inside")
    found = py(sandbox, f"""
import glob, json, os
def read(p):
    try:
        return open(p).read()
    except Exception:
        return ""
tries = [{path!r}, "/proc/1/root" + {path!r}, "/../../.." + {path!r}]
tries += [p + {path!r} for p in glob.glob("/proc/*/root")]
tries += [p + {path!r} for p in glob.glob("/proc/*/cwd/../../..")]
os.symlink("/", "/tmp/rootlink")
tries.append("/tmp/rootlink" + {path!r})
print(json.dumps({{"host": [read(p) for p in tries], "control": read("/proc/self/root/home/user/inside.txt")}}))
""")
    assert found["control"] == "inside", "the probe's reads work"
    assert not any(secret in text for text in found["host"])


def test_host_processes_are_invisible(sandbox):
    marker = uuid.uuid4().hex
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        seen = py(sandbox, """
import glob, json
cmdlines = []
for p in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        cmdlines.append(open(p, "rb").read().decode(errors="replace"))
    except Exception:
        pass
print(json.dumps(cmdlines))
""")
        assert any("airlock-agent" in c for c in seen), "the probe sees the sandbox's own processes"
        assert not any(marker in c for c in seen)
    finally:
        host.kill()


def host_addresses():
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return sorted({line.split()[3].split("/")[0] for line in out.splitlines()})


def probe_network(server, a, b):
    """From sandbox `a`: which of the control API (on every host address), cloud metadata, and
    `b`'s agent and user port does a connect reach?"""
    b_ip = b.commands.run("hostname -I").stdout.split()[0]
    targets = [(ip, server.port) for ip in host_addresses()]
    targets += [("169.254.169.254", 80), (b_ip, 49983), (b_ip, 8000)]
    b.commands.run("python3 -m http.server 8000 --bind 0.0.0.0", background=True)
    b.commands.run("for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8000/ && break; sleep 0.1; done")
    return py(a, f"""
import json, socket
def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False
print(json.dumps({{"targets": {{f"{{h}}:{{p}}": connect(h, p) for h, p in {targets!r}}},
                  "control": connect("127.0.0.1", 49983)}}))
""")


@pytest.fixture
def api_on_all_addresses(restarted):
    """Restarts the server listening on every host address, so that the control API is there to
    be reached from a sandbox, with more flags if given. Restores it afterwards."""
    return lambda *flags: restarted(*flags, listen_host="0.0.0.0")


def test_control_api_metadata_and_neighbours_are_unreachable(server, api_on_all_addresses, sandbox_factory, outside):
    api_on_all_addresses()
    a, b = sandbox_factory(), sandbox_factory()
    result = probe_network(server, a, b)
    assert result["control"] is True, "the probe's connects work"
    assert not any(result["targets"].values()), result["targets"]
    # The neighbour's server does run: reachable from inside itself.
    assert b.commands.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/").stdout == "200"


def test_the_network_probe_sees_leaks_with_the_firewall_off(server, api_on_all_addresses, sandbox_factory, outside):
    """The same probe against a server started with `--insecure-open-network` (a debugging
    mode, never the default) must see the control API, the neighbour and cloud metadata (the
    `outside` fixture's listener). Left out: the host's loopback, which no network namespace
    reaches."""
    api_on_all_addresses("--insecure-open-network")
    a, b = sandbox_factory(), sandbox_factory()
    reached = probe_network(server, a, b)["targets"]
    b_ip = b.commands.run("hostname -I").stdout.split()[0]
    assert reached[f"{b_ip}:49983"] and reached[f"{b_ip}:8000"], reached
    assert reached["169.254.169.254:80"], reached
    api = {t: ok for t, ok in reached.items() if t.endswith(f":{server.port}") and not t.startswith("127.")}
    assert api and all(api.values()), reached


def test_raw_sockets_mount_ptrace_and_kvm_are_refused(sandbox):
    result = py(sandbox, """
import ctypes, json, os, socket, subprocess
out = {}
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    out["raw"] = True
except PermissionError:
    out["raw"] = False
mount = subprocess.run(["mount", "-t", "tmpfs", "none", "/mnt"], capture_output=True)
out["mount"] = mount.returncode == 0
out["mount_control"] = mount.returncode != 127  # the binary ran and decided
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH = 16
out["ptrace_agent"] = libc.ptrace(PTRACE_ATTACH, 1, None, None) == 0
child = subprocess.Popen(["sleep", "30"])
out["ptrace_control"] = libc.ptrace(PTRACE_ATTACH, child.pid, None, None) == 0
child.kill()
out["kvm"] = os.path.exists("/dev/kvm")
status = open("/proc/self/status").read()
capeff = int([l for l in status.splitlines() if l.startswith("CapEff")][0].split()[1], 16)
out["sys_admin"] = bool(capeff & (1 << 21))
print(json.dumps(out))
""")
    assert result["mount_control"] and result["ptrace_control"], "the probes' calls work"
    assert result == {**result, "raw": False, "mount": False, "ptrace_agent": False,
                      "kvm": False, "sys_admin": False}, result


def test_files_api_follows_no_link_out_of_the_sandbox(sandbox, host_secret):
    path, secret = host_secret
    sandbox.commands.run(f"ln -s {path} /home/user/link; ln -s /proc/1/root/.. /home/user/up", user="root")
    sandbox.files.write("/home/user/real.txt", "real")
    assert sandbox.files.read("/home/user/real.txt") == "real", "the probe's reads work"
    for probe in ["/home/user/link", "/home/user/up" + path, "/home/user/../../.." + path]:
        try:
            content = sandbox.files.read(probe)
        except Exception:
            continue
        assert secret not in content
    # Renames and uploads through links land inside the sandbox too.
    sandbox.files.write("/home/user/up/escaped.txt", "written via a link", user="root")
    assert not os.path.exists("/escaped.txt")
    assert sandbox.commands.run("cat /escaped.txt").stdout == "written via a link"
    sandbox.files.rename("/home/user/real.txt", "/home/user/up/home/user/moved.txt", user="root")
    assert sandbox.commands.run("cat /home/user/moved.txt").stdout == "real"
