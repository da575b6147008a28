//! `airlock-netd`: the network services for sandboxes, in a process of their own.
//!
//! The DNS forwarder ([`dns`]) and the domain proxy ([`proxy`]) read bytes that sandboxes
//! choose: DNS queries, TLS ClientHellos, HTTP heads. So they do not run in the root server,
//! which holds every access token, but here: under a uid of its own, with no capabilities and a
//! seccomp allow-list, knowing of each sandbox only its address and policy. The server starts
//! it, hands it its sockets and a channel ([`protocol`]), tells it every policy, and starts it
//! again if it dies.

pub mod dns;
pub mod protocol;
pub mod proxy;
pub mod sandboxes;

use airlock_wire::egress::Ipv4Net;
use protocol::{Ack, Command, MAX_LINE};
use std::net::Ipv4Addr;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UdpSocket, UnixStream};

/// What both services share.
pub struct State {
    pub sandboxes: sandboxes::Sandboxes,
    pub resolver: dns::resolver::Resolver,
    /// What no policy can open.
    deny: Vec<Ipv4Net>,
    /// The host's search domains.
    search: Vec<String>,
}

impl State {
    /// Whether `ip` is in a range no sandbox may reach.
    pub fn denied(&self, ip: Ipv4Addr) -> bool {
        self.deny.iter().any(|net| net.contains(ip))
    }
}

/// Logs to stderr at the level `AIRLOCK_LOG` names, or else `RUST_LOG` (`info` if neither is
/// set, with the MCP library's line per session left out), as text, or as one JSON object a line when `AIRLOCK_LOG_FORMAT` is `json`. The server
/// and netd log alike, so that their lines read as one.
pub fn init_logging() {
    let filter = ["AIRLOCK_LOG", "RUST_LOG"]
        .into_iter()
        .find_map(|var| tracing_subscriber::EnvFilter::try_from_env(var).ok())
        .unwrap_or_else(|| "info,rmcp=warn".into());
    // Colours for a person at a terminal only, not in a file or the journal.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match std::env::var("AIRLOCK_LOG_FORMAT").as_deref() {
        Ok("json") => logs.json().init(),
        _ => logs.init(),
    }
}

/// Raises this process's open-files limit to the hard limit (and says so): every sandbox, proxied
/// connection and client connection costs descriptors, and the usual soft limit of 1024 would
/// run out long before the budgets do. The server and netd both call it.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= hard {
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => tracing::info!(from = soft, to = hard, "raised the open files limit"),
        Err(e) => tracing::warn!(limit = soft, error = %e, "could not raise the open files limit"),
    }
}

/// Serves DNS on `dns` and the proxy on `proxy`, as `channel` says, until the channel ends.
pub async fn run(dns: UdpSocket, proxy: TcpListener, channel: UnixStream) -> Result<(), String> {
    let (read, mut write) = channel.into_split();
    let mut lines = BufReader::new(read.take(u64::MAX));
    let Some(Command::Init {
        seq,
        deny,
        upstreams,
        search,
    }) = next_command(&mut lines).await?
    else {
        return Err("the channel did not start with init".into());
    };
    let state = Arc::new(State {
        sandboxes: sandboxes::Sandboxes::default(),
        resolver: dns::resolver::Resolver::new(upstreams),
        deny,
        search,
    });
    ack(&mut write, seq).await?;
    tokio::spawn(dns::serve(dns, state.clone()));
    tokio::spawn(proxy::serve(proxy, state.clone()));
    while let Some(command) = next_command(&mut lines).await? {
        let seq = command.seq();
        match command {
            Command::Init { .. } => return Err("init came twice".into()),
            Command::Set { addr, egress, .. } => state.sandboxes.set(addr, egress),
            Command::Clear { addr, .. } => state.sandboxes.clear(addr),
        }
        ack(&mut write, seq).await?;
    }
    Ok(())
}

/// The next command, or `None` when the server closed the channel.
async fn next_command(
    lines: &mut BufReader<tokio::io::Take<tokio::net::unix::OwnedReadHalf>>,
) -> Result<Option<Command>, String> {
    let mut line = Vec::new();
    lines.get_mut().set_limit(MAX_LINE as u64);
    let n = lines
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| format!("reading the channel: {e}"))?;
    if n == 0 {
        return Ok(None);
    }
    if !line.ends_with(b"\n") {
        return Err("a line on the channel is too long".into());
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| format!("a malformed command: {e}"))
}

async fn ack(write: &mut tokio::net::unix::OwnedWriteHalf, seq: u64) -> Result<(), String> {
    write
        .write_all(&protocol::encode(&Ack { seq }))
        .await
        .map_err(|e| format!("writing to the channel: {e}"))
}
