//! `airlock-netd`: started by `airlock serve` (never by hand), as its own uid, with the sockets
//! and the channel it serves on as fds 3, 4 and 5 (see `airlock_netd::protocol`).

mod seccomp;

use airlock_netd::protocol::{CHANNEL_FD, DNS_FD, PROXY_FD};
use std::os::fd::FromRawFd;
use std::process::ExitCode;

fn main() -> ExitCode {
    airlock_netd::init_logging();
    match start() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("airlock-netd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn start() -> Result<(), String> {
    if nix::unistd::geteuid().is_root() {
        return Err("refusing to run as root: airlock serve starts this as its own user".into());
    }
    airlock_netd::raise_open_files_limit();
    // SAFETY: the server passes exactly these three descriptors, open and of these kinds, and
    // nothing else in this process owns them.
    let (dns, proxy, channel) = unsafe {
        (
            std::net::UdpSocket::from_raw_fd(DNS_FD),
            std::net::TcpListener::from_raw_fd(PROXY_FD),
            std::os::unix::net::UnixStream::from_raw_fd(CHANNEL_FD),
        )
    };
    for result in [
        dns.set_nonblocking(true),
        proxy.set_nonblocking(true),
        channel.set_nonblocking(true),
    ] {
        result.map_err(|e| format!("the sockets from the server: {e}"))?;
    }
    // The runtime's own descriptors first: the filter allows using them, not making more.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let _guard = runtime.enter();
    let dns = tokio::net::UdpSocket::from_std(dns).map_err(|e| e.to_string())?;
    let proxy = tokio::net::TcpListener::from_std(proxy).map_err(|e| e.to_string())?;
    let channel = tokio::net::UnixStream::from_std(channel).map_err(|e| e.to_string())?;
    seccomp::install()?;
    tracing::info!("serving sandbox DNS and the domain proxy");
    runtime.block_on(airlock_netd::run(dns, proxy, channel))
}
