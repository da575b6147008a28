//! Domain rules for connections the sandbox's DNS did not open: a transparent proxy on the host.
//!
//! In a sandbox whose `allowOut` names domains, a TCP connection to an address that its rules
//! would drop is redirected here by the firewall instead (see [`crate::firewall`]), on any port.
//! The proxy reads the first bytes the sandbox sends: the SNI of a TLS ClientHello or the `Host`
//! header of an HTTP/1 request. If that name is allowed, it resolves the name itself and
//! connects to the address the sandbox dialled if the name resolves to it, else to the name's
//! first address, never to an address the name does not have: a sandbox cannot reach an
//! arbitrary host by claiming an allowed name. Anything else is closed.
//!
//! Protocols where the server speaks first (SSH, SMTP, databases) send no name, so they work
//! only through addresses the sandbox's DNS answered for an allowed domain.

pub(crate) mod peek;

use crate::firewall::{slot_of_peer, Firewall};
use peek::Peek;
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Connections relayed at once; more are refused, so no sandbox can exhaust the host's sockets.
const MAX_CONNECTIONS: usize = 1024;
/// How long the sandbox has to send the bytes that name the server.
const PEEK_TIMEOUT: Duration = Duration::from_secs(10);
/// The most read before giving up on finding a name: one full TLS record.
const MAX_PEEK: usize = 5 + (16 << 10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Relays connections (arriving on [`crate::firewall::PROXY_PORT`]) for the server's life.
pub(crate) async fn serve(listener: TcpListener, firewall: Arc<Firewall>) {
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
        let Some(slot) = slot_of_peer(from) else {
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue;
        };
        let firewall = firewall.clone();
        tokio::spawn(async move {
            if let Err(why) = relay(stream, slot, &firewall).await {
                tracing::debug!(slot, why, "domain proxy: connection refused");
            }
            drop(permit);
        });
    }
}

async fn relay(mut inbound: TcpStream, slot: u32, firewall: &Firewall) -> Result<(), String> {
    let dialled = original_destination(&inbound)?;
    let policy = firewall
        .policy(slot)
        .ok_or("the sandbox has no domain rules")?;
    let mut first_bytes = Vec::with_capacity(2048);
    let name = tokio::time::timeout(PEEK_TIMEOUT, async {
        loop {
            match peek::server_name(&first_bytes) {
                Peek::Name(name) => return Some(name),
                Peek::NoName => return None,
                Peek::NeedMore if first_bytes.len() >= MAX_PEEK => return None,
                Peek::NeedMore => {
                    let mut chunk = [0u8; 4096];
                    let want = chunk.len().min(MAX_PEEK - first_bytes.len());
                    match inbound.read(&mut chunk[..want]).await {
                        Ok(0) | Err(_) => return None,
                        Ok(n) => first_bytes.extend_from_slice(&chunk[..n]),
                    }
                }
            }
        }
    })
    .await
    .ok()
    .flatten()
    .ok_or(format!("no server name sent to {dialled}"))?;
    if !policy.allows_domain(&name) {
        return Err(format!("{name} is not an allowed domain"));
    }
    let resolved: Vec<SocketAddrV4> = tokio::net::lookup_host((name.as_str(), dialled.port()))
        .await
        .map_err(|e| format!("resolving {name}: {e}"))?
        .filter_map(|a| match a {
            SocketAddr::V4(a) if !firewall.platform_denies(*a.ip()) => Some(a),
            _ => None,
        })
        .collect();
    let target = if resolved.contains(&dialled) {
        dialled
    } else {
        *resolved
            .first()
            .ok_or(format!("{name} has no public IPv4 address"))?
    };
    let mut outbound = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target))
        .await
        .map_err(|_| format!("connecting to {target} timed out"))?
        .map_err(|e| format!("connecting to {target}: {e}"))?;
    outbound
        .write_all(&first_bytes)
        .await
        .map_err(|e| e.to_string())?;
    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    Ok(())
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
