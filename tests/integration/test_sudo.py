"""`sudo` as E2B's `user` has it: passwordless, for anything, through the stock SDKs. gVisor
ignores set-user-ID bits, so `/usr/bin/sudo` is the agent's (it checks the sandbox's sudoers
files and runs the command as root on the caller's own stdio). What the agent guarantees still
holds: no process it starts, root through sudo included, holds CAP_SYS_ADMIN."""

import asyncio

from e2b import AsyncSandbox, CommandExitException

CAP_SYS_ADMIN = 21


def caps(status_line):
    """The capability mask of a `/proc/*/status` line such as `CapEff:\t000001ff...`."""
    return int(status_line.split(":")[1].strip(), 16)


def test_sudo_runs_as_root_with_the_callers_stdio_env_and_exit_code(sandbox):
    run = sandbox.commands.run
    assert run("whoami").stdout.strip() == "user"
    assert run("sudo whoami").stdout.strip() == "root"
    assert run("sudo -u nobody id -un").stdout.strip() == "nobody"
    assert run("echo piped | sudo cat").stdout == "piped\n"
    assert run("sudo sh -c 'echo to-stderr >&2'").stderr == "to-stderr\n"
    try:
        run("sudo sh -c 'exit 7'")
        raise AssertionError("the exit code is lost")
    except CommandExitException as e:
        assert e.exit_code == 7
    run("sudo sh -c 'echo written > /etc/by-sudo'")
    assert sandbox.files.read("/etc/by-sudo") == "written\n"

    env = dict(line.split("=", 1) for line in
               run("MINE=kept sudo env", envs={"SSL_CERT_FILE": "x"}).stdout.splitlines()
               if "=" in line)
    assert env["USER"] == "root" and env["HOME"] == "/root" and env["SUDO_USER"] == "user"
    assert "MINE" not in env, "sudo resets the environment"
    # What PAM gives a sudo session: /etc/environment (the CA bundle for pip and requests).
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"
    assert "MINE=kept" in run("MINE=kept sudo -E env").stdout.splitlines()
    assert run("sudo -i pwd").stdout.strip() == "/root"
    assert run("cd /tmp && sudo pwd").stdout.strip() == "/tmp"


def test_a_root_process_through_sudo_lacks_cap_sys_admin(sandbox):
    run = sandbox.commands.run
    own = run("sudo grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status").stdout.splitlines()
    assert len(own) == 3, own
    for line in own:
        assert not caps(line) & (1 << CAP_SYS_ADMIN), line
    # The positive control: the probe sees the capability where it is (the agent keeps it).
    agent = run("sudo grep '^CapEff:' /proc/1/status").stdout
    assert caps(agent) & (1 << CAP_SYS_ADMIN), agent
    # Root through sudo cannot trace the agent, though it can trace a process of its own (the
    # control: ptrace works at all).
    # The traced child gets no stdout: stopped by the attach, it would hold the command's
    # output open, and the command would never end.
    attach = ("import ctypes, subprocess, sys; libc = ctypes.CDLL(None, use_errno=True); "
              "pid = int(sys.argv[1]) or subprocess.Popen(['sleep', '30'], "
              "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid; "
              "print(libc.ptrace(16, pid, 0, 0), ctypes.get_errno())")
    assert run(f'sudo python3 -c "{attach}" 1').stdout.split() == ["-1", "1"]  # EPERM
    assert run(f'sudo python3 -c "{attach}" 0').stdout.split()[0] == "0"


def test_only_users_the_sudoers_files_allow_may_sudo(sandbox):
    run = sandbox.commands.run
    try:
        run("sudo -u nobody sudo true")
        raise AssertionError("nobody has no sudoers rule")
    except CommandExitException as e:
        assert e.exit_code == 1 and "nobody may not run sudo" in e.stderr, e.stderr
    # A rule the sandbox's root writes grants it (the files are read at every call).
    run("echo 'nobody ALL=(ALL) NOPASSWD: ALL' | sudo tee /etc/sudoers.d/nobody")
    assert run("sudo -u nobody sudo whoami").stdout.strip() == "root"
    # Unknown options are refused by name.
    try:
        run("sudo -b true")
        raise AssertionError("-b is not supported")
    except CommandExitException as e:
        assert "'-b' is not supported" in e.stderr, e.stderr


def test_killing_sudo_kills_what_it_runs(sandbox):
    handle = sandbox.commands.run("sudo sleep 4242", background=True)
    assert sandbox.commands.run("sleep 1; pgrep -u root -f 'sleep 4242'").exit_code == 0
    handle.kill()
    gone = sandbox.commands.run("sleep 1; pgrep -u root -f 'sleep 4242' || echo gone")
    assert gone.stdout.strip() == "gone"


def test_sudo_installs_packages_with_apt(sandbox):
    out = sandbox.commands.run(
        "sudo apt-get update -qq && sudo apt-get install -y -qq cowsay >/dev/null "
        "&& /usr/games/cowsay moo", timeout=300)
    assert "moo" in out.stdout


def test_sudo_through_the_async_sdk(server):
    async def main():
        sbx = await AsyncSandbox.create()
        try:
            return (await sbx.commands.run("sudo whoami")).stdout.strip()
        finally:
            await sbx.kill()

    assert asyncio.run(main()) == "root"


def test_sudo_through_the_js_sdk(server):
    js = """
      import { Sandbox } from 'e2b'
      const sbx = await Sandbox.create()
      try {
        const run = await sbx.commands.run('sudo id -u; whoami')
        console.log(JSON.stringify(run.stdout.split('\\n').filter(Boolean)))
      } finally { await sbx.kill() }
    """
    assert server.js(js) == ["0", "user"]
