//! A kernel's process and channels: its process group, connection file, ports, and the tasks
//! that read its ZeroMQ channels. Each piece cleans up after itself when dropped.

use crate::users::User;
use jupyter_protocol::ConnectionInfo;
use jupyter_zmq_client::{Connection, RawMessage};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::sleep;

/// Why we killed a kernel, so the run it interrupts can say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    Restarted,
    Deleted,
    /// It ignored interrupts after its client left.
    Unresponsive,
}

/// Kills a kernel's process group from anywhere, e.g. a restart while a run holds the kernel.
#[derive(Debug)]
pub struct KillSwitch {
    pub(super) pgid: i32,
    pub(super) exited: AtomicBool,
    pub(super) reason: Mutex<Option<KillReason>>,
}

impl KillSwitch {
    pub fn kill(&self, reason: KillReason) {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(reason);
        if !self.exited.load(Ordering::SeqCst) {
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
        }
    }

    pub(super) fn reason(&self) -> Option<KillReason> {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Kills the whole process group when dropped: no kernel (or anything it started in its group)
/// outlives its owner, including a launch that failed or was cancelled half-way.
pub(super) struct GroupGuard(pub(super) i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

/// The private directory holding the connection file; removed when dropped.
pub(super) struct ConnectionDir(pub(super) PathBuf);

impl ConnectionDir {
    /// Writes the connection file, readable only by the kernel's user.
    pub(super) fn create(
        user: &User,
        info: &ConnectionInfo,
    ) -> std::io::Result<(ConnectionDir, PathBuf)> {
        let dir = std::env::temp_dir().join(format!("airlock-kernel-{}", uuid::Uuid::new_v4()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let guard = ConnectionDir(dir.clone());
        std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid))?;
        let file = dir.join("connection.json");
        let json = serde_json::to_vec(info).map_err(std::io::Error::other)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)?;
        std::io::Write::write_all(&mut f, &json)?;
        std::os::unix::fs::chown(&file, Some(user.uid), Some(user.gid))?;
        Ok((guard, file))
    }
}

impl Drop for ConnectionDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Aborts a channel reader when the kernel goes away.
pub(super) struct AbortOnDrop(pub(super) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A decoded kernel message: just the parts we route on, content as raw JSON.
#[derive(Debug)]
pub struct KernelMessage {
    pub msg_type: String,
    pub parent_id: Option<String>,
    pub date: Option<String>,
    pub content: Value,
}

impl KernelMessage {
    pub(super) fn decode(raw: RawMessage) -> Result<KernelMessage, String> {
        let part = |i: usize| -> Result<Value, String> {
            let bytes = raw.jparts.get(i).ok_or("missing message part")?;
            serde_json::from_slice(bytes).map_err(|e| e.to_string())
        };
        let header = part(0)?;
        let parent = part(1)?;
        let content = part(3)?;
        let field = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
        Ok(KernelMessage {
            msg_type: field(&header, "msg_type").ok_or("message without msg_type")?,
            parent_id: field(&parent, "msg_id"),
            date: field(&header, "date"),
            content,
        })
    }

    pub(super) fn is_child_of(&self, msg_id: &str) -> bool {
        self.parent_id.as_deref() == Some(msg_id)
    }

    pub(super) fn str(&self, key: &str) -> Option<&str> {
        self.content.get(key).and_then(Value::as_str)
    }
}

/// Forwards one channel's messages until the kernel is dropped.
pub(super) async fn pump<S>(
    mut conn: Connection<S>,
    tx: mpsc::Sender<KernelMessage>,
    channel: &'static str,
) where
    S: zeromq::SocketRecv + Send,
{
    loop {
        let received = tokio::select! {
            _ = tx.closed() => return,
            r = conn.socket.recv() => r,
        };
        match received {
            Ok(zmq) => match RawMessage::from_multipart(zmq, &conn.mac)
                .map_err(|e| e.to_string())
                .and_then(KernelMessage::decode)
            {
                Ok(msg) => {
                    tracing::trace!(
                        "{channel} <- {} (parent {:?}) {:.200}",
                        msg.msg_type,
                        msg.parent_id,
                        msg.content.to_string()
                    );
                    if tx.send(msg).await.is_err() {
                        return;
                    }
                }
                Err(e) => tracing::warn!("dropping a malformed {channel} message: {e}"),
            },
            Err(e) => {
                // A kernel that went away makes the socket fail at once: don't spin.
                tracing::debug!("{channel} channel: {e}");
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Resolves once the kernel process has exited (or its watcher is gone).
pub(super) async fn exited(exit: &mut watch::Receiver<Option<String>>) {
    // The borrow `wait_for` returns is not Send: drop it here, not across the caller's awaits.
    let _ = exit.wait_for(Option::is_some).await;
}

pub(super) fn describe_exit(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(sig)) => match Signal::try_from(sig) {
                Ok(name) => format!("killed by signal {sig} ({name})"),
                Err(_) => format!("killed by signal {sig}"),
            },
            _ => s.to_string(),
        },
        Err(e) => format!("unknown exit: {e}"),
    }
}

/// Ports handed to kernels that are alive (or still starting). A kernel binds its ports seconds
/// after we pick them; without this, two kernels starting at once could be given the same ones.
pub(super) static LEASED_PORTS: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// Returns its ports to the pool when the kernel is gone.
pub(super) struct PortLease(pub(super) Vec<u16>);

impl Drop for PortLease {
    fn drop(&mut self) {
        let mut leased = LEASED_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        leased.retain(|p| !self.0.contains(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;

    fn raw(header: Value, parent: Value, content: Value) -> RawMessage {
        RawMessage {
            zmq_identities: vec![],
            jparts: vec![
                Bytes::from(header.to_string()),
                Bytes::from(parent.to_string()),
                Bytes::from("{}"),
                Bytes::from(content.to_string()),
            ],
        }
    }

    #[test]
    fn decodes_messages() {
        let m = KernelMessage::decode(raw(
            serde_json::json!({"msg_type": "stream", "msg_id": "b", "date": "2025-01-01T00:00:00Z"}),
            serde_json::json!({"msg_id": "a"}),
            serde_json::json!({"name": "stdout", "text": "hi"}),
        ))
        .unwrap();
        assert_eq!(m.msg_type, "stream");
        assert!(m.is_child_of("a"));
        assert!(!m.is_child_of("b"));
        assert_eq!(m.str("text"), Some("hi"));
        assert_eq!(m.date.as_deref(), Some("2025-01-01T00:00:00Z"));

        let orphan = KernelMessage::decode(raw(
            serde_json::json!({"msg_type": "status"}),
            serde_json::json!({}),
            serde_json::json!({"execution_state": "starting"}),
        ))
        .unwrap();
        assert_eq!(orphan.parent_id, None);
        assert!(KernelMessage::decode(raw(
            serde_json::json!({}),
            serde_json::json!({}),
            serde_json::json!({})
        ))
        .is_err());
    }
}
