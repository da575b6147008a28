//! The agent's side of `sudo`: one thread per call. It learns who calls from the kernel,
//! checks the sandbox's sudoers files, starts the command as the target user on the caller's
//! own stdin, stdout and stderr, passes on the caller's signals, and reports how the command
//! ended. If the caller goes away (killed, say), so does the command, as it would with the
//! caller's process group.
//!
//! Who calls comes from the `SCM_CREDENTIALS` that the call's first message carries: the
//! kernel refuses to send any but the sender's own (measured under gVisor: a forged uid or pid
//! fails with EPERM). Not from `SO_PEERCRED`: gVisor (20240729) answers it with uid 0 for
//! every peer.

use super::{sudoers, ClientMessage, Outcome, Request};
use crate::users::{User, DEFAULT_PATH};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// The caller's variables kept under sudo's `env_reset`.
const KEPT: &[&str] = &[
    "TERM",
    "COLORTERM",
    "DISPLAY",
    "XAUTHORITY",
    "LANG",
    "LANGUAGE",
    "TZ",
    "COLUMNS",
    "LINES",
];

/// The largest request accepted (the caller's environment is most of it).
const MAX_REQUEST: u64 = 4 << 20;

/// Starts answering `sudo` calls, on a thread of its own.
pub fn listen() -> std::io::Result<()> {
    let listener = UnixListener::bind_addr(&super::socket_addr()?)?;
    // Accepted sockets inherit it: the kernel then hands over the sender's credentials.
    nix::sys::socket::setsockopt(&listener, nix::sys::socket::sockopt::PassCred, &true)?;
    std::thread::Builder::new()
        .name("sudo".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let spawned = std::thread::Builder::new()
                    .name("sudo-call".into())
                    .spawn(move || answer(stream));
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot start a thread for a sudo call");
                }
            }
        })?;
    Ok(())
}

fn answer(stream: UnixStream) {
    let outcome = match call(&stream) {
        Ok(outcome) => outcome,
        Err(message) => Outcome::Refused(message),
    };
    let mut line = serde_json::to_vec(&outcome).unwrap_or_default();
    line.push(b'\n');
    let _ = (&stream).write_all(&line);
}

fn call(stream: &UnixStream) -> Result<Outcome, String> {
    nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::PassCred, &true)
        .map_err(|e| format!("cannot learn who is calling: {e}"))?;
    let (request, stdio, uid) = receive(stream)?;
    let caller =
        User::with_uid(uid).ok_or_else(|| format!("you (uid {uid}) are not in /etc/passwd"))?;
    let root = Path::new("/");
    let groups = sudoers::groups_of(root, &caller.name, caller.gid);
    let asking = sudoers::Caller {
        name: &caller.name,
        uid: caller.uid,
        groups: &groups,
    };
    let entries = sudoers::read(root);
    if caller.uid != 0 && !sudoers::grants(&entries, &asking) {
        let unread: Vec<&str> = entries
            .iter()
            .filter_map(|e| match e {
                sudoers::Entry::Unreadable(why) => Some(why.as_str()),
                sudoers::Entry::Line(_) => None,
            })
            .collect();
        let unread = match unread.is_empty() {
            true => String::new(),
            false => format!("; not read: {}", unread.join("; ")),
        };
        return Err(format!(
            "{0} may not run sudo here: it needs a `{0} ALL=(ALL:ALL) NOPASSWD: ALL` rule in \
             /etc/sudoers or /etc/sudoers.d, as the last rule for {0} (Airlock's sudo asks for \
             no password){unread}",
            caller.name
        ));
    }
    let target =
        User::lookup(&request.user).map_err(|_| format!("unknown user {}", request.user))?;
    let mut command = command(&request, &caller, &target);
    let [stdin, stdout, stderr] = stdio;
    command
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0);
    become_user(&mut command, &target);
    crate::pid1::rlimits::cap_processes(&mut command);
    let mut child = command
        .spawn()
        .map_err(|e| format!("{}: {e}", request.command.first().map_or("shell", |c| c)))?;
    crate::pid1::reaper::track(child.id());
    relay(stream, &mut child)
}

/// The request, the caller's stdin, stdout and stderr, and its uid, which all come with its
/// first bytes.
fn receive(stream: &UnixStream) -> Result<(Request, [OwnedFd; 3], u32), String> {
    let bad = |what: &str| format!("a malformed request ({what})");
    let mut first = vec![0u8; 64 * 1024];
    let mut space = nix::cmsg_space!([RawFd; 3], nix::sys::socket::UnixCredentials);
    let mut uid = None;
    let (read, fds) = {
        let mut iov = [IoSliceMut::new(&mut first)];
        let msg = nix::sys::socket::recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| bad(&e.to_string()))?;
        let mut fds = Vec::new();
        for cmsg in msg.cmsgs().map_err(|e| bad(&e.to_string()))? {
            match cmsg {
                nix::sys::socket::ControlMessageOwned::ScmRights(rights) => {
                    // SAFETY: the kernel just installed these descriptors in this process for
                    // us; nothing else owns them.
                    fds.extend(
                        rights
                            .into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
                nix::sys::socket::ControlMessageOwned::ScmCredentials(creds) => {
                    uid = Some(creds.uid());
                }
                _ => {}
            }
        }
        (msg.bytes, fds)
    };
    let stdio: [OwnedFd; 3] = fds.try_into().map_err(|_| bad("stdio missing"))?;
    let uid = uid.ok_or_else(|| bad("no credentials"))?;
    first.truncate(read);
    let mut line = first;
    if !line.ends_with(b"\n") {
        use std::io::Read;
        let mut reader = BufReader::new(stream).take(MAX_REQUEST);
        reader
            .read_until(b'\n', &mut line)
            .map_err(|e| bad(&e.to_string()))?;
    }
    let request = serde_json::from_slice(&line).map_err(|e| bad(&e.to_string()))?;
    Ok((request, stdio, uid))
}

/// What sudo runs for the request, with sudo's environment and working directory.
fn command(request: &Request, caller: &User, target: &User) -> Command {
    let shell = |fallback: &Path| {
        let from_env = request.env.iter().find(|(k, _)| k == "SHELL");
        from_env.map_or_else(
            || fallback.to_string_lossy().into_owned(),
            |(_, v)| v.clone(),
        )
    };
    let (program, args): (String, Vec<String>) = if request.login {
        let mut args = vec!["-l".to_owned()];
        if !request.command.is_empty() {
            args.extend(["-c".to_owned(), shell_words(&request.command)]);
        }
        (target.shell.to_string_lossy().into_owned(), args)
    } else if request.shell {
        let mut args = Vec::new();
        if !request.command.is_empty() {
            args.extend(["-c".to_owned(), shell_words(&request.command)]);
        }
        (shell(&target.shell), args)
    } else {
        (request.command[0].clone(), request.command[1..].to_vec())
    };
    let mut command = Command::new(&program);
    command.args(&args).env_clear();
    command.envs(environment(request, caller, target, &program, &args));
    if request.login {
        command.current_dir(&target.home);
    } else {
        command.current_dir(&request.cwd);
    }
    command
}

/// sudo's environment: the caller's (all of it with `-E`, else only [`KEPT`] and LC_*), the
/// sandbox's `/etc/environment` (as PAM gives a sudo session), and the target's identity.
fn environment(
    request: &Request,
    caller: &User,
    target: &User,
    program: &str,
    args: &[String],
) -> Vec<(String, String)> {
    let kept = |name: &str| {
        request.preserve_env
            || KEPT.contains(&name)
            || name.starts_with("LC_")
            || request.keep.iter().any(|k| k == name)
    };
    let mut env: Vec<(String, String)> = etc_environment();
    env.extend(request.env.iter().filter(|(k, _)| kept(k)).cloned());
    let command = std::iter::once(program.to_owned())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    env.extend([
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), target.home.to_string_lossy().into_owned()),
        ("SHELL".into(), target.shell.to_string_lossy().into_owned()),
        ("USER".into(), target.name.clone()),
        ("LOGNAME".into(), target.name.clone()),
        ("MAIL".into(), format!("/var/mail/{}", target.name)),
        ("SUDO_USER".into(), caller.name.clone()),
        ("SUDO_UID".into(), caller.uid.to_string()),
        ("SUDO_GID".into(), caller.gid.to_string()),
        ("SUDO_COMMAND".into(), command),
    ]);
    env.extend(request.set.iter().cloned());
    env
}

/// `NAME=value` lines of `/etc/environment` (quotes stripped, comments skipped).
fn etc_environment() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("/etc/environment").unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.strip_prefix("export ").unwrap_or(l))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_owned(),
                v.trim().trim_matches(['"', '\'']).to_owned(),
            )
        })
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// The command as one `sh -c` line: each word single-quoted unless it is plain.
fn shell_words(words: &[String]) -> String {
    let plain = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    };
    words
        .iter()
        .map(|w| match plain(w) {
            true => w.clone(),
            false => format!("'{}'", w.replace('\'', r"'\''")),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Makes the child the target user, with the target's groups, as its last step before exec.
fn become_user(command: &mut Command, target: &User) {
    let mut gids: Vec<nix::unistd::Gid> =
        sudoers::groups_of(Path::new("/"), &target.name, target.gid)
            .into_iter()
            .map(|(_, gid)| nix::unistd::Gid::from_raw(gid))
            .collect();
    gids.push(nix::unistd::Gid::from_raw(target.gid));
    gids.dedup();
    let (uid, gid) = (target.uid, target.gid);
    // SAFETY: between fork and exec only setgroups, setgid and setuid run: async-signal-safe
    // system calls on memory prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setgroups(&gids)?;
            nix::unistd::setgid(nix::unistd::Gid::from_raw(gid))?;
            nix::unistd::setuid(nix::unistd::Uid::from_raw(uid))?;
            Ok(())
        });
    }
}

/// Passes the caller's signals on to the command's process group until it ends; if the caller
/// goes away first, the group is killed. Reports how the command ended.
fn relay(stream: &UnixStream, child: &mut std::process::Child) -> Result<Outcome, String> {
    let group = Pid::from_raw(child.id() as i32);
    // Set once the command has ended (before it is reaped): its group id may then be reused.
    let ended = Arc::new(Mutex::new(false));
    let reader = stream
        .try_clone()
        .map_err(|e| format!("cannot follow the caller: {e}"))?;
    let watcher_ended = ended.clone();
    std::thread::spawn(move || {
        let signal_group = |signal: Signal| {
            let ended = watcher_ended.lock().unwrap_or_else(|e| e.into_inner());
            if !*ended {
                let _ = killpg(group, signal);
            }
        };
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if let Ok(ClientMessage::Signal(n)) = serde_json::from_str(&line) {
                if let Ok(signal) = Signal::try_from(n) {
                    signal_group(signal);
                }
            }
        }
        signal_group(Signal::SIGKILL);
    });
    // Learn that it ended without reaping it, so the group id stays ours until `ended` is set.
    let _ = nix::sys::wait::waitid(
        nix::sys::wait::Id::Pid(group),
        nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT,
    );
    *ended.lock().unwrap_or_else(|e| e.into_inner()) = true;
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the command: {e}"))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => Outcome::Exited(code),
        (None, Some(signal)) => Outcome::Signaled(signal),
        (None, None) => Outcome::Exited(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shell_line_keeps_every_word_whole() {
        let words: Vec<String> = ["echo", "a b", "it's", "$HOME", "x=1"]
            .iter()
            .map(|w| w.to_string())
            .collect();
        assert_eq!(shell_words(&words), r#"echo 'a b' 'it'\''s' '$HOME' x=1"#);
    }
}
