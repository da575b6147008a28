//! Starting a kernel: its ports, connection file and process, then its channels, until it
//! answers on shell and IOPub.

use super::process::{
    describe_exit, exited, pump, AbortOnDrop, ConnectionDir, GroupGuard, PortLease, LEASED_PORTS,
};
use super::{Kernel, KernelError, KillSwitch, READY_TIMEOUT};
use crate::interpreter::envcode::EnvState;
use crate::interpreter::kernelspec::{Dialect, Kernelspec};
use crate::pid1::{idle, reaper, rlimits};
use crate::users::User;
use jupyter_protocol::{ConnectionInfo, KernelInfoRequest, Transport};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

/// IOPub messages buffered before the channel's reader waits for the execution loop.
const IOPUB_DEPTH: usize = 1024;
const SHELL_DEPTH: usize = 64;
/// Bytes of the kernel's own stderr kept, to explain a kernel that fails to start.
const STDERR_TAIL: usize = 8 * 1024;

impl Kernel {
    /// Starts the kernel and waits until it answers on its shell and IOPub channels. `identity`
    /// is the agent's identity generation, read before the process starts.
    pub async fn launch(
        spec: &Kernelspec,
        user: &User,
        cwd: &Path,
        globals: &BTreeMap<String, String>,
        identity: u64,
    ) -> Result<Kernel, KernelError> {
        let name = spec.name.clone();
        if !cwd.is_dir() {
            return Err(KernelError::Setup(format!(
                "working directory '{}' does not exist",
                cwd.display()
            )));
        }
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        // The listeners hold the ports until the kernel is spawned (see `peek_ports_with_listeners`);
        // the lease keeps them from other kernels starting meanwhile, until this one has bound them.
        let (ports, listeners, ports_lease) = lease_ports(ip).await?;
        let info = ConnectionInfo {
            ip: ip.to_string(),
            transport: Transport::TCP,
            shell_port: ports[0],
            iopub_port: ports[1],
            stdin_port: ports[2],
            control_port: ports[3],
            hb_port: ports[4],
            key: uuid::Uuid::new_v4().to_string(),
            signature_scheme: "hmac-sha256".into(),
            kernel_name: Some(name.clone()),
        };
        let (dir, connection_file) = ConnectionDir::create(user, &info)
            .map_err(|e| KernelError::Setup(format!("writing the connection file: {e}")))?;

        let mut base: BTreeMap<String, String> = user
            .base_env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        if spec.dialect() == Dialect::Deno {
            // Deno colours its `text/plain` results and console output with ANSI codes otherwise.
            base.insert("NO_COLOR".into(), "1".into());
        }
        base.extend(spec.spec.env.clone().unwrap_or_default());
        let env = EnvState::new(spec.dialect(), base.clone(), globals);
        let launch_env = base.into_iter().chain(
            globals
                .iter()
                .filter(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'))
                .map(|(k, v)| (k.clone(), v.clone())),
        );

        let argv = spec.argv(&connection_file);
        let Some((program, args)) = argv.split_first() else {
            return Err(KernelError::Setup(format!(
                "kernelspec '{name}' has an empty argv"
            )));
        };
        let mut cmd = std::process::Command::new(program);
        cmd.args(args)
            .current_dir(cwd)
            .env_clear()
            .envs(launch_env)
            .uid(user.uid)
            .gid(user.gid)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        rlimits::cap_processes(&mut cmd);
        let mut child = tokio::process::Command::from(cmd)
            .spawn()
            .map_err(|source| KernelError::Spawn {
                name: name.clone(),
                program: program.to_string_lossy().into_owned(),
                source,
            })?;
        drop(listeners);
        let pid = child.id().ok_or_else(|| KernelError::ExitedEarly {
            name: name.clone(),
            status: "already reaped".into(),
            stderr: String::new(),
        })? as i32;
        reaper::track(pid as u32);
        idle::quiet(pid);
        let group = GroupGuard(pid);

        let stderr_tail = Arc::new(Mutex::new(Vec::<u8>::new()));
        if let Some(mut stderr) = child.stderr.take() {
            let tail = stderr_tail.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                    tail.extend_from_slice(&buf[..n]);
                    let excess = tail.len().saturating_sub(STDERR_TAIL);
                    tail.drain(..excess);
                }
            });
        }
        let switch = Arc::new(KillSwitch {
            pgid: pid,
            exited: AtomicBool::new(false),
            reason: Mutex::new(None),
        });
        let (exit_tx, mut exit) = watch::channel(None);
        {
            let switch = switch.clone();
            tokio::spawn(async move {
                let status = describe_exit(child.wait().await);
                switch.exited.store(true, Ordering::SeqCst);
                let _ = exit_tx.send(Some(status));
            });
        }
        let exited_early = |status: String| KernelError::ExitedEarly {
            name: name.clone(),
            status,
            stderr: {
                let tail = stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
                let text = String::from_utf8_lossy(&tail);
                let text = text.trim();
                if text.is_empty() {
                    String::new()
                } else {
                    format!(": {text}")
                }
            },
        };

        let deadline = Instant::now() + READY_TIMEOUT;
        let session = uuid::Uuid::new_v4().to_string();
        let connect = async {
            let identity = jupyter_zmq_client::peer_identity_for_session(&session)?;
            let shell = jupyter_zmq_client::create_client_shell_connection_with_identity(
                &info, &session, identity,
            )
            .await?;
            let iopub =
                jupyter_zmq_client::create_client_iopub_connection(&info, "", &session).await?;
            let control =
                jupyter_zmq_client::create_client_control_connection(&info, &session).await?;
            Ok::<_, KernelError>((shell, iopub, control))
        };
        let (shell, iopub, control) = tokio::select! {
            r = connect => r?,
            _ = exited(&mut exit) => {
                let status = exit.borrow().clone().unwrap_or_default();
                return Err(exited_early(status));
            }
            _ = sleep_until(deadline) => return Err(KernelError::Timeout { name: name.clone() }),
        };

        let (shell, shell_recv) = shell.split();
        let (control, control_recv) = control.split();
        let (shell_tx, shell_rx) = mpsc::channel(SHELL_DEPTH);
        let (iopub_tx, iopub_rx) = mpsc::channel(IOPUB_DEPTH);
        // Control replies (interrupt, shutdown) are not needed; they are read and dropped.
        let (control_tx, mut control_rx) = mpsc::channel(SHELL_DEPTH);
        let readers = vec![
            AbortOnDrop(tokio::spawn(pump(shell_recv, shell_tx, "shell"))),
            AbortOnDrop(tokio::spawn(pump(iopub, iopub_tx, "iopub"))),
            AbortOnDrop(tokio::spawn(pump(control_recv, control_tx, "control"))),
            AbortOnDrop(tokio::spawn(async move {
                while control_rx.recv().await.is_some() {}
            })),
        ];

        let mut kernel = Kernel {
            spec: spec.clone(),
            identity,
            switch,
            exit,
            shell,
            control,
            shell_rx,
            iopub_rx,
            env,
            _readers: readers,
            _dir: dir,
            _group: group,
            _ports: ports_lease,
        };
        match kernel.wait_ready(deadline).await {
            Ok(()) => Ok(kernel),
            Err(KernelError::Died) => {
                let status = kernel.exit.borrow().clone().unwrap_or_default();
                Err(exited_early(status))
            }
            Err(e) => Err(e),
        }
    }

    /// Sends `kernel_info_request`s until the reply arrives on shell and the kernel's status
    /// shows up on IOPub (a SUB socket misses whatever is published before it has subscribed).
    async fn wait_ready(&mut self, deadline: Instant) -> Result<(), KernelError> {
        let mut shell_ok = false;
        let mut iopub_ok = false;
        self.shell.send(KernelInfoRequest {}.into()).await?;
        let mut resend = tokio::time::interval(Duration::from_millis(500));
        resend.tick().await;
        while !(shell_ok && iopub_ok) {
            tokio::select! {
                Some(m) = self.shell_rx.recv() => {
                    shell_ok |= m.msg_type == "kernel_info_reply";
                }
                Some(_) = self.iopub_rx.recv() => iopub_ok = true,
                _ = resend.tick() => {
                    if shell_ok && !iopub_ok {
                        self.shell.send(KernelInfoRequest {}.into()).await?;
                    }
                }
                _ = exited(&mut self.exit) => return Err(KernelError::Died),
                _ = sleep_until(deadline) => {
                    return Err(KernelError::Timeout { name: self.spec.name.clone() })
                }
            }
        }
        Ok(())
    }
}

/// Five free loopback ports that no other kernel holds, with listeners keeping them until spawn.
async fn lease_ports(
    ip: IpAddr,
) -> Result<(Vec<u16>, Vec<tokio::net::TcpListener>, PortLease), KernelError> {
    for _ in 0..20 {
        let (ports, listeners) = jupyter_zmq_client::peek_ports_with_listeners(ip, 5).await?;
        let mut leased = LEASED_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        if ports.iter().any(|p| leased.contains(p)) {
            continue;
        }
        leased.extend(&ports);
        return Ok((ports.clone(), listeners, PortLease(ports)));
    }
    Err(KernelError::Setup(
        "no free loopback ports for the kernel".into(),
    ))
}
