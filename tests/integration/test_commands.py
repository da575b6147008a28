"""Commands through the stock SDK: output, exit codes, cwd, env, background processes, stdin."""

import asyncio
import threading
import time

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox, TimeoutException


def test_create_with_env_vars_and_metadata(sandbox_factory):
    sbx = sandbox_factory(envs={"GREETING": "hello from create"}, metadata={"owner": "alice b"})
    assert sbx.commands.run("echo $GREETING").stdout == "hello from create\n"
    info = sbx.get_info()
    assert info.metadata["owner"] == "alice b"
    assert info.template_id == "base"
    assert sbx.is_running()


def test_stdout_stderr_and_exit_codes(sandbox):
    r = sandbox.commands.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 0)
    with pytest.raises(CommandExitException) as exc:
        sandbox.commands.run("echo partial; exit 7")
    assert exc.value.exit_code == 7
    assert exc.value.stdout == "partial\n"


def test_runs_as_user_in_home_by_default_and_as_root_on_request(sandbox):
    r = sandbox.commands.run("whoami; pwd; echo $HOME")
    assert r.stdout.split() == ["user", "/home/user", "/home/user"]
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"


def test_cwd_and_env(sandbox):
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sandbox.commands.run("echo $A-$B", envs={"A": "1", "B": "two"}).stdout == "1-two\n"
    with pytest.raises(Exception) as exc:
        sandbox.commands.run("pwd", cwd="/does/not/exist")
    assert "does not exist" in str(exc.value)


def test_streaming_callbacks_arrive_in_order(sandbox):
    seen = []
    sandbox.commands.run("for i in 1 2 3; do echo $i; sleep 0.1; done", on_stdout=seen.append)
    assert "".join(seen) == "1\n2\n3\n"


def test_background_process_list_and_kill(sandbox):
    handle = sandbox.commands.run("sleep 600", background=True)
    pids = [p.pid for p in sandbox.commands.list()]
    assert handle.pid in pids
    listed = next(p for p in sandbox.commands.list() if p.pid == handle.pid)
    assert listed.args[-1] == "sleep 600"
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid) is False


def test_connect_to_running_process(sandbox):
    handle = sandbox.commands.run("sleep 1; echo later", background=True)
    again = sandbox.commands.connect(handle.pid)
    assert again.wait().stdout == "later\n"


def test_stdin(sandbox):
    handle = sandbox.commands.run("read line; echo got:$line", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello\n")
    assert handle.wait().stdout == "got:hello\n"


def test_command_that_never_ends_is_killed_at_its_timeout(sandbox):
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 1000", timeout=2)
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(p.args[-1:] == ["sleep 1000"] for p in sandbox.commands.list()):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the timed-out command is still running")
    assert sandbox.commands.run("echo still fine").stdout == "still fine\n"


def test_sandbox_is_gvisor_with_its_own_hostname(sandbox):
    # gVisor's kernel reports itself in dmesg; the sandbox never sees the host's kernel log.
    assert "gVisor" in sandbox.commands.run("dmesg", user="root").stdout
    assert sandbox.commands.run("hostname").stdout.strip() == sandbox.sandbox_id


def test_a_terminal_session_runs_resizes_and_ends(sandbox):
    """`sandbox.pty`: a shell on a terminal of the asked size, which it controls; input goes
    in, output comes out, a resize reaches it, and `exit` ends it with its exit code."""
    from e2b import PtySize

    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(terminal.pid, b"stty size; tty; echo sum $((6*7))\n")
    output = bytearray()
    events = iter(terminal)
    while b"sum 42" not in output:  # the first line has run: only now resize
        _, _, chunk = next(events)
        output.extend(chunk or b"")
    sandbox.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(terminal.pid, b"stty size; exit 3\n")
    for _, _, chunk in events:
        output.extend(chunk or b"")
    text = output.decode(errors="replace")
    with pytest.raises(CommandExitException) as ended:
        terminal.wait()
    assert ended.value.exit_code == 3
    assert "24 80" in text and "30 100" in text, text
    assert "/dev/pts/" in text, text


@pytest.mark.parametrize("user", ["user", "root"])
def test_a_login_shell_gets_debians_path_without_asking_id(sandbox, user):
    """Every SDK command is `bash -l -c CMD`. The base template's /etc/profile picks root's PATH
    by bash's own `$EUID` instead of forking `id -u`; a login shell that must still ask `id`
    (dash, `sh -l`) gets the same PATH, and it is Debian's for that user."""
    debian = {
        "user": "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games",
        "root": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }[user]
    # `env -i`: dash starts from an empty environment, so nothing of bash's carries over.
    by_id = sandbox.commands.run(
        "env -i HOME=$HOME /bin/sh -l -c 'echo $PATH'", user=user
    ).stdout
    by_euid = sandbox.commands.run("echo $PATH", user=user).stdout
    assert by_euid == by_id
    assert by_euid.rstrip("\n").endswith(debian), by_euid


# A command that prints until it is stopped: its stream is mid-flight when the sandbox goes.
TICKING = "while true; do echo tick; sleep 0.05; done"


def killed_after(seconds, sandbox_id):
    """Kills the sandbox from another handle after `seconds`, as another client would."""
    killer = threading.Timer(seconds, Sandbox.kill, args=(sandbox_id,))
    killer.start()
    return killer


@pytest.mark.newest_sdk
def test_a_command_whose_sandbox_is_killed_raises_not_running_at_once(sandbox_factory):
    """The proxy ends the command's Connect stream with E2B's `unavailable` "was not found"
    (not a body cut mid-chunk, which the SDK reads as a broken connection): the SDK raises its
    sandbox-not-running error at once, with no health probe, sync and async alike."""
    from e2b.exceptions import SandboxNotRunningException

    sbx = sandbox_factory()
    # Positive control: a command nobody kills ends with all its output.
    assert sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.1; done").stdout == "1\n2\n3\n"

    killer = killed_after(1, sbx.sandbox_id)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxNotRunningException) as exc:
            sbx.commands.run(TICKING, timeout=60)
    finally:
        killer.join()
    assert time.monotonic() - started < 10
    assert f"The sandbox {sbx.sandbox_id} was not found" in str(exc.value), exc.value

    async def run_async():
        asbx = await AsyncSandbox.create("base")
        killer = killed_after(1, asbx.sandbox_id)
        try:
            await asbx.commands.run(TICKING, timeout=60)
        finally:
            killer.join()

    with pytest.raises(SandboxNotRunningException) as exc:
        asyncio.run(run_async())
    assert "was not found" in str(exc.value), exc.value
