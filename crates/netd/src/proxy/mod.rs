//! Domain rules for TCP: a transparent proxy that the firewall sends a domain-restricted
//! sandbox's connections to, on any port, whenever their address is not allowed by a network
//! rule (`allowOut` CIDRs).
//!
//! What the sandbox sends first decides (see [`peek`]):
//! - **TLS**: the ClientHello's SNI must be an allowed domain. TLS without SNI is refused.
//! - **HTTP/1**: every request head on the connection must name an allowed domain in `Host`
//!   (and in an absolute-form target), checked before a byte of it goes on (see [`http1`]).
//! - **Anything else names nothing** (SSH, databases, a server that speaks first): it may reach
//!   only an address that this sandbox's DNS answered for one of its allowed domains.
//!
//! A named connection goes to the address the sandbox dialled if the name resolves to it (or the
//! address is one its DNS answered for an allowed domain), else to the name's first address;
//! never to an address the name does not have and DNS did not give. So an allowed name is not
//! a key to everything behind a shared address: a ClientHello or Host naming another site on
//! the same CDN or registry address is refused like any other.

pub mod http1;
pub mod peek;

use crate::sandboxes::{RelayGuard, Sandbox};
use crate::State;
use peek::First;
use std::net::{IpAddr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Connections relayed at once for all sandboxes (each also counts against its sandbox's
/// share, [`crate::sandboxes::CONNECTIONS_PER_SANDBOX`]); more are refused.
const MAX_CONNECTIONS: usize = 4096;
/// How long a connection has, from its start, to say what it is.
const NAMING_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A relayed connection with no byte either way for this long is closed...
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// ... and any relayed connection after this long.
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Relays connections for as long as netd runs.
pub async fn serve(listener: TcpListener, state: Arc<State>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "domain proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let IpAddr::V4(peer) = from.ip() else {
            continue;
        };
        // Closed at once without a share: the sandbox's own, then the global one.
        let Some(sandbox) = state.sandboxes.get(peer) else {
            continue;
        };
        let (Some(own), Ok(global)) = (
            sandbox.connection_permit(),
            permits.clone().try_acquire_owned(),
        ) else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            tokio::select! {
                result = handle(stream, sandbox.clone(), &state) => {
                    if let Err(why) = result {
                        tracing::debug!(%peer, why, "domain proxy: connection refused");
                    }
                }
                () = sandbox.gone() => {}
            }
            drop((own, global));
        });
    }
}

async fn handle(
    mut inbound: TcpStream,
    sandbox: Arc<Sandbox>,
    state: &State,
) -> Result<(), String> {
    let dialled = original_destination(&inbound)?;
    if state.denied(*dialled.ip()) {
        return Err(format!("{dialled} is never reachable"));
    }
    let learned = sandbox.learned(*dialled.ip());
    // An address DNS answered for an allowed domain may carry a protocol whose server speaks
    // first, so it is dialled at once; anything else waits until the sandbox names its server.
    let early = match learned {
        true => Some(connect(dialled).await?),
        false => None,
    };
    let deadline = tokio::time::Instant::now() + NAMING_TIMEOUT;
    let unnamed = || format!("nothing named a server for {dialled}");

    let mut first = Vec::with_capacity(2048);
    let kind = loop {
        match peek::classify(&first) {
            First::NeedMore => {}
            kind => break kind,
        }
        match read_more(&mut inbound, &mut first, early.as_ref(), deadline).await {
            Wait::Bytes => {}
            Wait::Closed => return Ok(()),
            Wait::ServerSpoke => break First::Unnamed,
            Wait::TimedOut if learned && first.is_empty() => break First::Unnamed,
            Wait::TimedOut => return Err(unnamed()),
        }
    };
    let egress = sandbox.egress();
    let allowed = |name: &str| egress.allows_domain(name);
    let mut http = None;
    let (name, first) = match kind {
        First::Tls(name) if allowed(&name) => (Some(name), first),
        First::Tls(name) => return Err(format!("{name} is not an allowed domain")),
        First::Http => {
            // The first request head must be whole, and allowed, before anything goes on.
            let mut requests = http1::Requests::default();
            let mut passed = requests.feed(&first, &allowed).map_err(|r| r.0)?;
            while passed.names.is_empty() {
                let mut more = Vec::new();
                match read_more(&mut inbound, &mut more, None, deadline).await {
                    Wait::Bytes => {
                        let next = requests.feed(&more, &allowed).map_err(|r| r.0)?;
                        passed.bytes.extend(next.bytes);
                        passed.names.extend(next.names);
                    }
                    Wait::Closed => return Ok(()),
                    Wait::ServerSpoke | Wait::TimedOut => return Err(unnamed()),
                }
            }
            http = Some(requests);
            (passed.names.into_iter().next(), passed.bytes)
        }
        First::Unnamed if learned => (None, first),
        First::Unnamed => return Err(unnamed()),
        First::Refused | First::NeedMore => return Err("TLS without a server name".into()),
    };
    let outbound = match (early, &name) {
        (Some(out), _) => out,
        (None, Some(name)) => connect(target(name, dialled, state).await?).await?,
        (None, None) => return Err(unnamed()),
    };
    let guard = sandbox.relay(name, *dialled.ip());
    relay(inbound, outbound, first, http, &sandbox, guard).await;
    Ok(())
}

/// What waiting for the sandbox's next bytes came to.
enum Wait {
    Bytes,
    /// The server (dialled early) sent something before the sandbox did.
    ServerSpoke,
    TimedOut,
    Closed,
}

/// Reads the sandbox's next bytes into `into`, until `deadline`; with `server` (dialled early,
/// and only while the sandbox has sent nothing) also stops when the server speaks first.
async fn read_more(
    inbound: &mut TcpStream,
    into: &mut Vec<u8>,
    server: Option<&TcpStream>,
    deadline: tokio::time::Instant,
) -> Wait {
    let server = server.filter(|_| into.is_empty());
    let server_spoke = async {
        match server {
            Some(server) => server.readable().await,
            None => std::future::pending().await,
        }
    };
    let mut chunk = [0u8; 4096];
    tokio::select! {
        read = inbound.read(&mut chunk) => match read {
            Ok(0) | Err(_) => Wait::Closed,
            Ok(n) => {
                into.extend_from_slice(&chunk[..n]);
                Wait::Bytes
            }
        },
        _ = server_spoke => Wait::ServerSpoke,
        () = tokio::time::sleep_until(deadline) => Wait::TimedOut,
    }
}

/// Where a connection naming `name` goes: the address dialled if `name` has it, else the
/// name's first reachable address.
async fn target(name: &str, dialled: SocketAddrV4, state: &State) -> Result<SocketAddrV4, String> {
    let addrs = state.resolver.lookup(name).await;
    if addrs.contains(dialled.ip()) {
        return Ok(dialled);
    }
    addrs
        .into_iter()
        .find(|ip| !state.denied(*ip))
        .map(|ip| SocketAddrV4::new(ip, dialled.port()))
        .ok_or_else(|| format!("{name} has no reachable IPv4 address"))
}

async fn connect(target: SocketAddrV4) -> Result<TcpStream, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target))
        .await
        .map_err(|_| format!("connecting to {target} timed out"))?
        .map_err(|e| format!("connecting to {target}: {e}"))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Relays both ways until both are done, the connection idles out, lives too long, or its
/// sandbox's policy (or the sandbox) goes. `first` are client bytes already read and allowed;
/// `http` checks the client's further requests.
async fn relay(
    inbound: TcpStream,
    outbound: TcpStream,
    first: Vec<u8>,
    http: Option<http1::Requests>,
    sandbox: &Arc<Sandbox>,
    guard: RelayGuard,
) {
    let idle = Idle::default();
    let fds = [inbound.as_raw_fd(), outbound.as_raw_fd()];
    let (client_read, client_write) = inbound.into_split();
    let (server_read, mut server_write) = outbound.into_split();
    let both = async {
        if server_write.write_all(&first).await.is_err() {
            return;
        }
        let up = pump_up(client_read, server_write, http, sandbox, &idle);
        let down = pump(server_read, client_write, &idle);
        tokio::join!(up, down);
    };
    tokio::select! {
        () = both => {}
        () = idle.expired() => {}
        () = tokio::time::sleep(MAX_LIFETIME) => {}
        () = guard.cut.cancelled() => {
            // Reset, not closed: a sandbox that is gone would leave the host's sockets waiting
            // for it for minutes, and a policy that forbids the connection wants it gone now.
            for fd in fds {
                // SAFETY: both streams' halves live in `both` until this arm ends, so the fds
                // are open.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                let linger = libc::linger { l_onoff: 1, l_linger: 0 };
                let _ = nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::Linger, &linger);
            }
        }
    }
}

/// The time of the last byte either way.
#[derive(Default)]
struct Idle(AtomicU64);

impl Idle {
    fn epoch() -> Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    fn touch(&self) {
        self.0.store(
            Self::epoch().elapsed().as_millis() as u64,
            Ordering::Relaxed,
        );
    }

    /// Resolves once no byte has moved for [`IDLE_TIMEOUT`].
    async fn expired(&self) {
        self.touch();
        loop {
            let last = Duration::from_millis(self.0.load(Ordering::Relaxed));
            let quiet = Self::epoch().elapsed().saturating_sub(last);
            if quiet >= IDLE_TIMEOUT {
                return;
            }
            tokio::time::sleep(IDLE_TIMEOUT - quiet).await;
        }
    }
}

/// Copies until the reading side ends, then passes the end on.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, idle: &Idle) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        idle.touch();
    }
    let _ = to.shutdown().await;
}

/// The client's side: copied as [`pump`] does, but through `http` when the connection is
/// HTTP, which ends it at the first request that names a server the policy does not allow.
async fn pump_up(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    http: Option<http1::Requests>,
    sandbox: &Sandbox,
    idle: &Idle,
) {
    let Some(mut requests) = http else {
        return pump(from, to, idle).await;
    };
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let egress = sandbox.egress();
        let allowed = |name: &str| egress.allows_domain(name);
        match requests.feed(&buf[..n], &allowed) {
            Ok(passed) => {
                if to.write_all(&passed.bytes).await.is_err() {
                    break;
                }
            }
            Err(why) => {
                tracing::debug!(why = why.0, "domain proxy: a later request was refused");
                // Neither side gets more: the server sees the connection end.
                return;
            }
        }
        idle.touch();
    }
    let _ = to.shutdown().await;
}

/// Where the sandbox meant to connect, before the firewall redirected it here.
fn original_destination(stream: &TcpStream) -> Result<SocketAddrV4, String> {
    let raw = nix::sys::socket::getsockopt(&stream.as_fd(), nix::sys::socket::sockopt::OriginalDst)
        .map_err(|e| format!("reading the original destination: {e}"))?;
    Ok(SocketAddrV4::new(
        u32::from_be(raw.sin_addr.s_addr).into(),
        u16::from_be(raw.sin_port),
    ))
}
