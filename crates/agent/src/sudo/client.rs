//! The `sudo` command (the agent binary started as `sudo`): reads sudo's options, hands the
//! request and its own stdin, stdout and stderr to the agent, passes on the signals it gets,
//! and ends as the command ended.

use super::{ClientMessage, Outcome, Request};
use nix::sys::signal::{SigSet, Signal};
use std::io::{BufRead, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

const USAGE: &str = "usage: sudo [-EHinSs] [-u user] [-D directory] [--preserve-env=list] \
[VAR=value] [--] command [arg ...]
Runs the command as root (or -u user) through the Airlock agent: this sandbox's kernel
(gVisor) ignores set-user-ID programs. Who may use it is read from /etc/sudoers and
/etc/sudoers.d: rules `NAME ALL=(ALL:ALL) NOPASSWD: ALL` (no password is ever asked).";

/// Signals passed on to the command.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

pub fn main(args: &[String]) -> ! {
    let request = match parse(args) {
        Ok(Parsed::Run(request)) => request,
        Ok(Parsed::Done(message)) => {
            if !message.is_empty() {
                println!("{message}");
            }
            std::process::exit(0)
        }
        Err(message) => fail(&message),
    };
    match run(&request) {
        Ok(Outcome::Exited(code)) => std::process::exit(code),
        Ok(Outcome::Signaled(signal)) => die_of(signal),
        Ok(Outcome::Refused(message)) => fail(&message),
        Err(e) => fail(&format!("cannot reach the sandbox's agent ({e})")),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("sudo: {message}");
    std::process::exit(1)
}

/// Ends this process as the command ended: by the same signal, as sudo does.
fn die_of(signal: i32) -> ! {
    if let Ok(signal) = Signal::try_from(signal) {
        let mut set = SigSet::empty();
        set.add(signal);
        // SAFETY: restoring a signal's default action involves no handler of ours.
        let _ = unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl) };
        let _ = set.thread_unblock();
        let _ = nix::sys::signal::raise(signal);
    }
    std::process::exit(128 + signal)
}

#[derive(Debug)]
enum Parsed {
    Run(Request),
    /// Nothing to run (`-v`, `-k`, `-V`, `-h`); print this.
    Done(String),
}

fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut request = Request {
        user: "root".into(),
        command: Vec::new(),
        login: false,
        shell: false,
        preserve_env: false,
        keep: Vec::new(),
        set: Vec::new(),
        env: std::env::vars().collect(),
        cwd: std::env::current_dir()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/".into()),
    };
    let mut only_validate = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut value_of = |name: &str, attached: &str| -> Result<String, String> {
            if !attached.is_empty() {
                return Ok(attached.to_owned());
            }
            rest.next()
                .cloned()
                .ok_or_else(|| format!("option '{name}' requires an argument\n{USAGE}"))
        };
        if arg == "--" {
            request.command.extend(rest.cloned());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, attached) = long.split_once('=').unwrap_or((long, ""));
            match name {
                "user" => request.user = value_of("--user", attached)?,
                "chdir" => request.cwd = value_of("--chdir", attached)?,
                "preserve-env" if attached.is_empty() => request.preserve_env = true,
                "preserve-env" => {
                    request.keep.extend(attached.split(',').map(str::to_owned));
                }
                "login" => request.login = true,
                "shell" => request.shell = true,
                "set-home" | "non-interactive" | "stdin" => {}
                "prompt" => {
                    value_of("--prompt", attached)?;
                }
                "validate" | "reset-timestamp" | "remove-timestamp" => only_validate = true,
                "version" => return Ok(Parsed::Done(version())),
                "help" => return Ok(Parsed::Done(USAGE.into())),
                _ => return Err(unsupported(arg)),
            }
            continue;
        }
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            // The command, after any NAME=value assignments.
            let mut words = std::iter::once(arg).chain(rest.by_ref());
            for word in words.by_ref() {
                match assignment(word) {
                    Some(pair) => request.set.push(pair),
                    None => {
                        request.command.push(word.clone());
                        break;
                    }
                }
            }
            request.command.extend(words.cloned());
            break;
        };
        for (i, flag) in flags.char_indices() {
            let attached = &flags[i + flag.len_utf8()..];
            match flag {
                'u' => {
                    request.user = value_of("-u", attached)?;
                    break;
                }
                'D' => {
                    request.cwd = value_of("-D", attached)?;
                    break;
                }
                'p' => {
                    value_of("-p", attached)?;
                    break;
                }
                'E' => request.preserve_env = true,
                'i' => request.login = true,
                's' => request.shell = true,
                'H' | 'n' | 'S' => {}
                'v' | 'k' | 'K' => only_validate = true,
                'V' => return Ok(Parsed::Done(version())),
                'h' => return Ok(Parsed::Done(USAGE.into())),
                _ => return Err(unsupported(&format!("-{flag}"))),
            }
        }
    }
    if request.login && request.shell {
        return Err(format!(
            "you may not specify both the -i and -s options\n{USAGE}"
        ));
    }
    if request.command.is_empty() && !request.login && !request.shell {
        if only_validate {
            // No credentials are cached, so there is nothing to validate or forget.
            return Ok(Parsed::Done(String::new()));
        }
        return Err(USAGE.into());
    }
    Ok(Parsed::Run(request))
}

fn unsupported(option: &str) -> String {
    format!("option '{option}' is not supported by Airlock's sudo\n{USAGE}")
}

fn version() -> String {
    format!(
        "Airlock sudo {} (runs commands through the sandbox's agent)",
        env!("CARGO_PKG_VERSION")
    )
}

/// `NAME=value`, where NAME is a variable name.
fn assignment(word: &str) -> Option<(String, String)> {
    let (name, value) = word.split_once('=')?;
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then(|| (name.to_owned(), value.to_owned()))
}

/// Sends the request with this process's stdio, then waits for the outcome while passing on
/// the signals this process gets.
fn run(request: &Request) -> std::io::Result<Outcome> {
    let mut signals = SigSet::empty();
    for signal in FORWARDED {
        signals.add(signal);
    }
    // Blocked before any thread starts, so that every thread inherits it and only `sigwait`
    // below takes these signals.
    signals.thread_block()?;
    let stream = UnixStream::connect_addr(&super::socket_addr()?)?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    let stdio = [0, 1, 2];
    // This process's own pid, uid and gid: the kernel refuses to send anyone else's.
    let credentials = nix::sys::socket::UnixCredentials::new();
    let rights = [
        nix::sys::socket::ControlMessage::ScmRights(&stdio),
        nix::sys::socket::ControlMessage::ScmCredentials(&credentials),
    ];
    let sent = nix::sys::socket::sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&line)],
        &rights,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )?;
    (&stream).write_all(&line[sent..])?;

    let mut forward = stream.try_clone()?;
    std::thread::spawn(move || {
        while let Ok(signal) = signals.wait() {
            let message = ClientMessage::Signal(signal as i32);
            let mut text = serde_json::to_vec(&message).unwrap_or_default();
            text.push(b'\n');
            if forward.write_all(&text).is_err() {
                return;
            }
        }
    });
    let mut answer = String::new();
    std::io::BufReader::new(&stream).read_line(&mut answer)?;
    serde_json::from_str(&answer).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the agent ended the call without an answer",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Request {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        match parse(&args) {
            Ok(Parsed::Run(r)) => r,
            Ok(Parsed::Done(m)) => panic!("nothing to run: {m}"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn reads_sudos_options_assignments_and_command() {
        let r = parsed(&["apt-get", "install", "-y", "cowsay"]);
        assert_eq!((r.user.as_str(), r.command.len()), ("root", 4));
        let r = parsed(&["-nEu", "postgres", "A=1", "psql", "-c", "B=2"]);
        assert_eq!(r.user, "postgres");
        assert!(r.preserve_env);
        assert_eq!(r.set, [("A".to_string(), "1".to_string())]);
        assert_eq!(r.command, ["psql", "-c", "B=2"]);
        let r = parsed(&["-uroot", "--preserve-env=PATH,X", "--", "-weird"]);
        assert_eq!(r.keep, ["PATH", "X"]);
        assert_eq!(r.command, ["-weird"]);
        let r = parsed(&["-i"]);
        assert!(r.login && r.command.is_empty());
        let r = parsed(&["-s", "echo", "hi"]);
        assert!(r.shell);
        let r = parsed(&["-D", "/tmp", "--user=x", "id"]);
        assert_eq!((r.cwd.as_str(), r.user.as_str()), ("/tmp", "x"));
    }

    #[test]
    fn refuses_what_it_cannot_do_and_needs_a_command() {
        let run = |args: &[&str]| parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        assert!(run(&[]).is_err());
        assert!(run(&["-u"]).is_err());
        assert!(run(&["-b", "sleep", "1"])
            .unwrap_err()
            .contains("'-b' is not supported"));
        assert!(run(&["-i", "-s"]).is_err());
        assert!(matches!(run(&["-v"]), Ok(Parsed::Done(_))));
        assert!(matches!(run(&["-n", "true"]), Ok(Parsed::Run(_))));
    }
}
