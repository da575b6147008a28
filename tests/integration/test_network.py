"""Outbound network policy, enforced on the host: internet by default, never private ranges;
`allow_internet_access=False`; `allowOut` domains matched by TLS SNI and by the HTTP Host of every
request, on any port, and DNS answers only for protocols that name nothing; public names only;
`allowOut`/`denyOut` networks; and clear errors for rules that make no sense.

Two targets. What is about addresses and flows goes to `outside` (tests/outside.py): the tests'
own listener on a public address outside this machine, and on a private and the cloud metadata
address. What needs a real name (DNS, SNI, `Host`) goes to pypi.org, which every machine that
runs this suite reaches (it installs the SDK from there); on ours it also serves TLS on 8443 and
HTTP on 8080, which is how "any port" is shown. A host that cannot reach those fails these tests:
it does not skip them."""

import json
import socket
import ssl
import subprocess
import uuid
from pathlib import Path

import pytest
from e2b import ALL_TRAFFIC

from outside import METADATA

NAME = "pypi.org"
OTHER = "deb.debian.org"  # another registry name; on our machines it has pypi.org's address

PROBES = r'''
import json, socket, ssl
def tls(ip, port, sni):
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((ip, port), timeout=4) as s:
            with ctx.wrap_socket(s, server_hostname=sni) as t:
                t.sendall(b"GET / HTTP/1.1\r\nHost: " + sni.encode() + b"\r\nConnection: close\r\n\r\n")
                return t.recv(8).decode(errors="replace")
    except Exception as e:
        return "blocked: " + type(e).__name__
def raw(ip, port, data):
    try:
        with socket.create_connection((ip, port), timeout=4) as s:
            s.sendall(data.encode())
            return s.recv(8).decode(errors="replace") or "blocked: closed"
    except Exception as e:
        return "blocked: " + type(e).__name__
def reach(ip, port):
    try:
        socket.create_connection((ip, port), timeout=4).close()
        return "connected"
    except ConnectionRefusedError:
        return "refused"  # a host answered: it was reached
    except Exception as e:
        return "blocked: " + type(e).__name__
def resolve(name):
    try:
        return socket.gethostbyname(name)
    except Exception as e:
        return "blocked: " + type(e).__name__
'''

HTTP = "HTTP/1.1"
GARBAGE = "\x00hello\r\n\r\n"


def http_get(host):
    return f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"


def probe(sbx, *calls, at_once=False):
    """Runs the probe calls (Python expressions over PROBES) inside the sandbox: in order, or
    `at_once` (each in a thread of its own, so that the blocked ones time out together)."""
    if at_once:
        code = PROBES + ("from concurrent.futures import ThreadPoolExecutor\n"
                         f"print(json.dumps(list(ThreadPoolExecutor({len(calls)}).map(lambda c: eval(c), {list(calls)!r}))))")
    else:
        code = PROBES + f"print(json.dumps([{', '.join(calls)}]))"
    result = sbx.commands.run(f"python3 - <<'EOF'\n{code}\nEOF", timeout=120)
    return json.loads(result.stdout)


def host_reaches(ip, port, tls_name=None):
    try:
        with socket.create_connection((ip, port), timeout=5) as s:
            if tls_name:
                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                with ctx.wrap_socket(s, server_hostname=tls_name) as t:
                    t.sendall(http_get(tls_name).encode())
                    return t.recv(8).decode(errors="replace") == HTTP
            s.sendall(GARBAGE.encode())
            return s.recv(8).decode(errors="replace") == HTTP
    except OSError:
        return False


@pytest.fixture(scope="module")
def target():
    """pypi.org's address, as the host resolves it; the host must reach it on every port the
    tests use."""
    try:
        ip = socket.gethostbyname(NAME)
    except OSError as e:
        pytest.fail(f"the host cannot resolve {NAME}: {e}")
    for port, tls in ((443, NAME), (8443, NAME), (8080, None)):
        assert host_reaches(ip, port, tls), f"the host cannot reach {NAME} ({ip}) on port {port}"
    return ip


def host_network_targets():
    """Addresses on the host's own network that the host itself reaches (a connection, or a
    refusal, which also means an answer): its resolvers on TCP 53 and its gateway on port 80.
    Each is in a range the platform denies (private, or the host's LAN), so a sandbox must not
    reach it; one the host cannot reach either would prove nothing, so it is left out."""
    targets = []
    for line in open("/etc/resolv.conf"):
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver" and ":" not in words[1]:
            targets.append((words[1], 53))
    route = subprocess.run(["ip", "-4", "route", "show", "default"], capture_output=True, text=True).stdout.split()
    if "via" in route:
        targets.append((route[route.index("via") + 1], 80))
    reached = []
    for ip, port in targets:
        if ip.startswith("127."):
            continue  # a sandbox's loopback is its own
        try:
            socket.create_connection((ip, port), timeout=4).close()
        except ConnectionRefusedError:
            pass
        except OSError:
            continue
        reached.append((ip, port))
    return reached


def test_internet_by_default(sandbox, target):
    got = probe(sandbox, f"resolve({NAME!r})", f"tls({target!r}, 443, {NAME!r})")
    assert got[0] == target, "DNS works through the host's forwarder"
    assert got[1] == HTTP, "the internet is reachable"


def out_of_reach(outside, sbx):
    """Probes the metadata and the private address of `outside` from `sbx` by HTTP on 80 and TLS
    on 443 (and, as the control, its public address); returns what answered or arrived there."""
    closed = (METADATA, outside.private)
    before = {addr: len(outside.seen(addr)) for addr in closed}
    calls = [f"raw({outside.public!r}, 80, {http_get(NAME)!r})"]
    for addr in closed:
        calls += [f"raw({addr!r}, 80, {http_get(NAME)!r})", f"tls({addr!r}, 443, {NAME!r})"]
    got = probe(sbx, *calls, at_once=True)
    assert got[0] == HTTP, "the control: the same listener answers at its public address"
    # Both halves: nothing answered, and nothing arrived.
    reached = {call: r for call, r in zip(calls[1:], got[1:]) if not r.startswith("blocked")}
    reached.update({f"arrived at {addr}": outside.seen(addr)[before[addr]:] for addr in closed
                    if outside.seen(addr)[before[addr]:]})
    return reached


def test_the_hosts_network_metadata_and_private_ranges_are_out_of_reach(sandbox, outside):
    assert out_of_reach(outside, sandbox) == {}
    # And the host's own resolvers and gateway, where the host reaches them.
    private = host_network_targets()
    if private:
        got = probe(sandbox, *(f"reach({ip!r}, {port})" for ip, port in private))
        assert all(r.startswith("blocked") for r in got), list(zip(private, got))


def test_no_rule_opens_metadata_or_private_ranges(sandbox_factory, outside):
    """What the README promises: an `allowOut` naming them (as networks, or everything) leaves
    them closed, as does a domain rule, which sends connections to netd's proxy."""
    named = [f"{METADATA}/32", f"{outside.private}/32", "172.16.0.0/12", outside.public]
    for network in ({"allow_out": named, "deny_out": [ALL_TRAFFIC]},
                    {"allow_out": ["0.0.0.0/0"]},
                    {"allow_out": [NAME, outside.public], "deny_out": [ALL_TRAFFIC]}):
        sbx = sandbox_factory(network=network)
        assert out_of_reach(outside, sbx) == {}, network
        sbx.kill()


def test_no_internet_access_blocks_everything_including_dns(sandbox_factory, sandbox, target, outside):
    sbx = sandbox_factory(allow_internet_access=False)
    calls = [
        f"resolve({NAME!r})",
        f"tls({outside.public!r}, 443, {NAME!r})",
        f"raw({outside.public!r}, 8080, {http_get(NAME)!r})",
    ]
    assert probe(sandbox, *calls) == [target, HTTP, HTTP], "the control: the same probes, open"
    assert all(r.startswith("blocked") for r in probe(sbx, *calls))
    # The rule follows the sandbox through a pause, into whatever slot it resumes in.
    assert sbx.pause() is True
    sbx.connect()
    assert all(r.startswith("blocked") for r in probe(sbx, *calls))
    assert sbx.commands.run("echo alive").stdout == "alive\n", "only the network is off"


def test_allowed_domains_are_matched_by_sni_and_host_on_any_port(sandbox_factory, target):
    sbx = sandbox_factory(network={"allow_out": [NAME], "deny_out": [ALL_TRAFFIC]})
    # Before the sandbox has resolved anything: only what names an allowed domain gets through,
    # whatever the port, even to the same address.
    got = probe(
        sbx,
        f"tls({target!r}, 443, {NAME!r})",
        f"tls({target!r}, 8443, {NAME!r})",
        f"tls({target!r}, 443, {OTHER!r})",
        f"raw({target!r}, 8080, {http_get(NAME)!r})",
        f"raw({target!r}, 8080, {http_get(OTHER)!r})",
        f"raw({target!r}, 8080, {GARBAGE!r})",
    )
    assert got[:2] == [HTTP, HTTP], "TLS naming an allowed domain, on 443 and 8443"
    assert got[2].startswith("blocked"), "TLS naming another domain"
    assert got[3] == HTTP, "HTTP naming an allowed domain, on 8080"
    assert got[4].startswith("blocked"), "HTTP naming another domain"
    assert got[5].startswith("blocked"), "bytes that name nothing"
    # DNS answers only allowed names. An answer opens its addresses to protocols that name
    # nothing, but never to a TLS or HTTP connection naming another site at the same address:
    # every registry here shares one address, as sites behind a CDN do.
    got = probe(
        sbx,
        f"resolve({OTHER!r})",
        f"resolve({NAME!r})",
        f"raw({target!r}, 8080, {GARBAGE!r})",
        f"tls({target!r}, 443, {OTHER!r})",
        f"raw({target!r}, 8080, {http_get(OTHER)!r})",
        f"tls({target!r}, 443, {NAME!r})",
    )
    assert got[0].startswith("blocked"), "names outside allowOut do not resolve"
    assert got[1] == target
    assert got[2] == HTTP, "the resolved address takes a protocol that names nothing"
    assert got[3].startswith("blocked"), "TLS naming another site at the shared address"
    assert got[4].startswith("blocked"), "HTTP naming another site at the shared address"
    assert got[5] == HTTP, "the control: the allowed name still works"
    # What a user would try: curl pinning another registry's name to the shared address.
    curl = "curl -s -o /dev/null -w '%{http_code}' --max-time 10 "
    pinned = sbx.commands.run(f"{curl} --resolve {OTHER}:443:{target} https://{OTHER}/ || true")
    allowed = sbx.commands.run(f"{curl} https://{NAME}/ || true")
    assert allowed.stdout.strip() not in ("", "000"), "the control: curl reaches the allowed name"
    assert pinned.stdout.strip() in ("", "000"), pinned.stdout


# Sandbox-side: one HEAD request on an open socket; the response's status, or "closed".
HEAD = r'''
def head(s, host):
    s.sendall(f"HEAD / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = s.recv(4096)
        if not chunk:
            return "closed"
        answer += chunk
    return answer.split(b" ")[1].decode()
'''

KEPT_ALIVE = HEAD + r'''
import json, socket
def exchange(second_host):
    """Two HEAD requests on one kept-alive connection; the status of each, or how it ended."""
    s = socket.create_connection((TARGET, 8080), timeout=8)
    try:
        return [head(s, NAME), head(s, second_host)]
    except OSError as e:
        return ["error", type(e).__name__]
print(json.dumps([exchange(NAME), exchange(OTHER)]))
'''


def test_every_request_of_a_kept_alive_connection_is_checked(sandbox_factory, target):
    sbx = sandbox_factory(network={"allow_out": [NAME], "deny_out": [ALL_TRAFFIC]})
    code = f"TARGET, NAME, OTHER = {target!r}, {NAME!r}, {OTHER!r}\n" + KEPT_ALIVE
    same, other = json.loads(sbx.commands.run(f"python3 - <<'EOF'\n{code}\nEOF", timeout=60).stdout)
    assert same[0] == same[1] and same[0].isdigit(), f"the control: two requests for {NAME}: {same}"
    assert other[0] == same[0], "the first request is let through"
    assert other[1] in ("closed", "ConnectionResetError"), f"the second, for {OTHER}: {other}"


@pytest.fixture
def host_names(outside):
    """Names the host resolves and no public DNS does: its own hostname, and a name under a
    public-looking domain that the test puts in the host's /etc/hosts (restored afterwards)."""
    added = f"airlock-{uuid.uuid4().hex[:8]}.example.com"
    hosts = Path("/etc/hosts")
    saved = hosts.read_text()
    hosts.write_text(saved + f"\n{outside.public} {added}\n")
    try:
        names = [socket.gethostname(), added]
        for name in names:
            try:
                socket.gethostbyname(name)
            except OSError as e:
                pytest.fail(f"the control: the host resolves {name} ({e})")
        yield names
    finally:
        hosts.write_text(saved)


def test_sandboxes_resolve_only_public_names(sandbox, target, host_names):
    search = [w for line in open("/etc/resolv.conf") for w in line.split()[1:]
              if line.split()[:1] in (["search"], ["domain"])]
    internal = [*host_names, "intranet", "printer.local", "db.internal", "router.home.arpa",
                "1.0.0.10.in-addr.arpa", *(f"host.{d}" for d in search)]
    got = probe(sandbox, f"resolve({NAME!r})", *(f"resolve({n!r})" for n in internal))
    assert got[0] == target, "the control: public names resolve"
    assert all(r.startswith("blocked") for r in got[1:]), list(zip(internal, got[1:]))


def test_allowed_and_denied_networks(sandbox_factory, target, outside):
    only = sandbox_factory(network={"allow_out": [f"{outside.public}/32"], "deny_out": [ALL_TRAFFIC]})
    got = probe(only, f"raw({outside.public!r}, 8080, {http_get(NAME)!r})",
                f"raw({outside.public2!r}, 8080, {http_get(NAME)!r})", f"resolve({NAME!r})")
    assert got[0] == HTTP, "an allowed address needs no DNS"
    assert got[1].startswith("blocked"), "its neighbour is not allowed"
    assert got[2].startswith("blocked"), "with everything denied, DNS answers allowed domains only"

    denied = sandbox_factory(network={"deny_out": [f"{outside.public}/32"]})
    got = probe(denied, f"resolve({NAME!r})", f"tls({outside.public!r}, 443, {NAME!r})",
                f"tls({outside.public2!r}, 443, {NAME!r})")
    assert got[0] == target, "names still resolve"
    assert got[1].startswith("blocked"), f"{outside.public} is denied"
    assert got[2] == HTTP, "the control: its neighbour is not"


def test_rules_can_be_replaced_while_the_sandbox_runs(server, sandbox, outside):
    reach = f"tls({outside.public!r}, 443, {NAME!r})"
    assert probe(sandbox, reach) == [HTTP]
    sandbox.update_network({"deny_out": [ALL_TRAFFIC]})
    assert probe(sandbox, reach)[0].startswith("blocked")
    sandbox.update_network({})  # what is left out is cleared
    assert probe(sandbox, reach) == [HTTP]

    status, body = server.api("PUT", f"/sandboxes/{sandbox.sandbox_id}/network", {"denyOut": ["pypi.org"]})
    assert status == 400 and "domains can only be allowed" in body["message"]
    status, _ = server.api("PUT", "/sandboxes/nosuchsandbox/network", {})
    assert status == 404


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"network": {"denyOut": ["example.com"]}}, "domains can only be allowed"),
        ({"network": {"allowOut": ["::/0"]}}, "IPv6"),
        ({"network": {"allowOut": ["10.0.0.0/40"]}}, "not a valid IPv4"),
        ({"network": {"allowOut": ["not a name"]}}, "not a domain name"),
        ({"cpuCount": 0}, "cpuCount must be between 1 and"),
        ({"memoryMB": 1}, "memoryMB must be between"),
        ({"diskSizeMB": 10**9}, "diskSizeMB must be between"),
    ],
)
def test_bad_rules_and_sizes_are_refused_clearly(server, extra, words):
    status, body = server.api("POST", "/v2/sandboxes", {"templateID": "base", **extra})
    assert status == 400, body
    assert words in body["message"] and body["code"] == 400
