//! `airlock-netd`, the DNS forwarder and domain proxy for sandboxes (crate `airlock-netd`), run
//! as a process of its own: started under the `airlock-net` user with no capabilities, handed
//! the sockets it serves on and a channel, told every sandbox's policy, and started again (and
//! told again) if it dies. Its crash never takes the server down: sandboxes' DNS and named
//! connections fail closed until it is back.

use crate::host_cmd;
use airlock_core::driver::DriverError;
use airlock_core::egress::{Egress, Ipv4Net};
use airlock_netd::protocol::{self, Ack, Command, CHANNEL_FD, DNS_FD, PROXY_FD};
use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// The user netd runs as; made at the first start if the host has none.
pub(crate) const USER: &str = "airlock-net";
/// How long a policy change waits for netd to confirm it is in force.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// What netd is told at every start.
pub(crate) struct Config {
    pub binary: PathBuf,
    pub deny: Vec<Ipv4Net>,
    pub upstreams: Vec<SocketAddr>,
    pub search: Vec<String>,
    /// The sockets it serves on: sandboxes' DNS (UDP) and the domain proxy (TCP).
    pub dns: std::net::UdpSocket,
    pub proxy: std::net::TcpListener,
}

/// The server's end: policy changes go through here.
pub(crate) struct Services {
    requests: mpsc::UnboundedSender<Request>,
}

enum Change {
    Set(Egress),
    Clear,
}

struct Request {
    addr: Ipv4Addr,
    change: Change,
    applied: oneshot::Sender<()>,
}

/// `airlock-net`'s uid and gid, making the user first if the host does not have it.
pub(crate) fn service_user() -> Result<(u32, u32), DriverError> {
    let lookup = || nix::unistd::User::from_name(USER).ok().flatten();
    let user = match lookup() {
        Some(user) => user,
        None => {
            let mut cmd = std::process::Command::new("useradd");
            cmd.args([
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
                USER,
            ]);
            host_cmd::run_sync(&format!("useradd {USER}"), cmd, "")?;
            tracing::info!("made the system user {USER}, which the network services run as");
            lookup().ok_or_else(|| DriverError::Command {
                what: format!("finding the user {USER}"),
                detail: "useradd succeeded but the user does not exist".into(),
            })?
        }
    };
    if user.uid.is_root() {
        return Err(DriverError::Command {
            what: format!("using the user {USER}"),
            detail: "it has uid 0".into(),
        });
    }
    Ok((user.uid.as_raw(), user.gid.as_raw()))
}

impl Services {
    /// Starts netd (and keeps it running) as `uid`/`gid`, with `known` policies in force.
    pub fn start(config: Config, uid: u32, gid: u32, known: &[(Ipv4Addr, Egress)]) -> Self {
        let (requests, rx) = mpsc::unbounded_channel();
        let policies: BTreeMap<Ipv4Addr, Egress> = known.iter().cloned().collect();
        tokio::spawn(supervise(config, uid, gid, policies, rx));
        Services { requests }
    }

    /// Puts `egress` in force for the sandbox at `addr`, and waits (a while) until netd says so.
    pub async fn set(&self, addr: Ipv4Addr, egress: &Egress) {
        self.send(addr, Change::Set(egress.clone())).await
    }

    /// Forgets the sandbox at `addr` and cuts its connections.
    pub async fn clear(&self, addr: Ipv4Addr) {
        self.send(addr, Change::Clear).await
    }

    async fn send(&self, addr: Ipv4Addr, change: Change) {
        let (applied, done) = oneshot::channel();
        let request = Request {
            addr,
            change,
            applied,
        };
        if self.requests.send(request).is_err() {
            return;
        }
        // Without an answer netd is down or restarting: it fails closed meanwhile (it knows no
        // sandbox), and gets this change with all the others when it is back.
        if tokio::time::timeout(ACK_TIMEOUT, done).await.is_err() {
            tracing::warn!(%addr, "the network services did not confirm a policy change");
        }
    }
}

/// Runs netd, feeds it, and starts it again whenever it ends.
async fn supervise(
    config: Config,
    uid: u32,
    gid: u32,
    mut policies: BTreeMap<Ipv4Addr, Egress>,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let started = tokio::time::Instant::now();
        match run_once(&config, uid, gid, &mut policies, &mut requests).await {
            Ok(Ended::ServerGone) => return,
            Ok(Ended::Exited(status)) => {
                tracing::error!(%status, "the network services (airlock-netd) stopped; starting them again")
            }
            Err(e) => {
                tracing::error!(error = %e, "the network services (airlock-netd) failed; starting them again")
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

enum Ended {
    /// The driver is gone: nothing will ask for netd again.
    ServerGone,
    Exited(std::process::ExitStatus),
}

async fn run_once(
    config: &Config,
    uid: u32,
    gid: u32,
    policies: &mut BTreeMap<Ipv4Addr, Egress>,
    requests: &mut mpsc::UnboundedReceiver<Request>,
) -> Result<Ended, String> {
    let (ours, theirs) =
        std::os::unix::net::UnixStream::pair().map_err(|e| format!("making the channel: {e}"))?;
    let mut child = spawn(config, uid, gid, theirs.into())?;
    ours.set_nonblocking(true).map_err(|e| e.to_string())?;
    let channel = tokio::net::UnixStream::from_std(ours).map_err(|e| e.to_string())?;
    let (read, mut write) = channel.into_split();
    let mut acks = BufReader::new(read);
    let mut seq = 0u64;
    let mut next = || {
        seq += 1;
        seq
    };
    let init = Command::Init {
        seq: next(),
        deny: config.deny.clone(),
        upstreams: config.upstreams.clone(),
        search: config.search.clone(),
    };
    let mut sent = protocol::encode(&init);
    for (addr, egress) in policies.iter() {
        sent.extend(protocol::encode(&Command::Set {
            seq: next(),
            addr: *addr,
            egress: egress.clone(),
        }));
    }
    write.write_all(&sent).await.map_err(|e| e.to_string())?;
    let mut waiting: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
    let mut line = String::new();
    loop {
        tokio::select! {
            request = requests.recv() => {
                let Some(Request { addr, change, applied }) = request else {
                    return Ok(Ended::ServerGone);
                };
                let seq = next();
                let command = match change {
                    Change::Set(egress) => {
                        policies.insert(addr, egress.clone());
                        Command::Set { seq, addr, egress }
                    }
                    Change::Clear => {
                        policies.remove(&addr);
                        Command::Clear { seq, addr }
                    }
                };
                waiting.insert(seq, applied);
                write.write_all(&protocol::encode(&command)).await.map_err(|e| e.to_string())?;
            }
            read = acks.read_line(&mut line) => {
                if read.map_err(|e| e.to_string())? == 0 {
                    let status = child.wait().await.map_err(|e| e.to_string())?;
                    return Ok(Ended::Exited(status));
                }
                // netd is not trusted: a line that is not an ack is ignored.
                if let Ok(Ack { seq }) = serde_json::from_str::<Ack>(line.trim()) {
                    if let Some(applied) = waiting.remove(&seq) {
                        let _ = applied.send(());
                    }
                }
                line.clear();
            }
            status = child.wait() => {
                return Ok(Ended::Exited(status.map_err(|e| e.to_string())?));
            }
        }
    }
}

/// Starts netd with the sockets as fds 3 and 4 and `channel` as fd 5, and nothing else open.
fn spawn(
    config: &Config,
    uid: u32,
    gid: u32,
    channel: OwnedFd,
) -> Result<tokio::process::Child, String> {
    // Copies above 5, so that placing them at 3, 4, 5 in the child cannot overwrite one
    // another; they are close-on-exec, and the child closes everything above 5 anyway.
    let high = |fd: RawFd| -> Result<OwnedFd, String> {
        let dup = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(16))
            .map_err(|e| format!("copying a socket for netd: {e}"))?;
        // SAFETY: F_DUPFD_CLOEXEC just returned this new descriptor, owned by nobody else.
        Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup) })
    };
    let fds = [
        (high(config.dns.as_raw_fd())?, DNS_FD),
        (high(config.proxy.as_raw_fd())?, PROXY_FD),
        (high(channel.as_raw_fd())?, CHANNEL_FD),
    ];
    let placed: Vec<(RawFd, RawFd)> = fds.iter().map(|(fd, to)| (fd.as_raw_fd(), *to)).collect();
    let mut cmd = tokio::process::Command::new(&config.binary);
    cmd.env_clear()
        .envs(
            ["AIRLOCK_LOG", "RUST_LOG", "AIRLOCK_LOG_FORMAT"]
                .into_iter()
                .filter_map(|var| Some((var, std::env::var(var).ok()?))),
        )
        .uid(uid)
        .gid(gid)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // SAFETY: only dup2 and close_range, which are async-signal-safe, on descriptors that stay
    // open in the parent until the spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            for (from, to) in &placed {
                if libc::dup2(*from, *to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            libc::syscall(libc::SYS_close_range, CHANNEL_FD + 1, u32::MAX, 0);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("starting {}: {e}", config.binary.display()))?;
    drop(fds);
    Ok(child)
}
