//! The processes the service started, by pid: each one's input, terminal and the streams its
//! events fan out to.

use crate::config::Config;
use crate::envd::log::SandboxLog;
use crate::rpc::RpcError;
use airlock_wire::envd::{
    EndEvent, ListResponse, ProcessConfig, ProcessEvent, ProcessInfo, ProcessSelector,
};
use axum::extract::State;
use axum::Json;
use nix::sys::signal::{killpg, Signal as NixSignal};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

/// Events buffered per attached stream before the process's output waits for it.
const STREAM_BUFFER: usize = 64;

/// The process service: the processes it started, the settings they start with, and the log
/// that records them.
pub(super) struct Processes {
    pub(super) config: Arc<Config>,
    pub(super) log: Arc<SandboxLog>,
    pub(super) table: ProcessTable,
}

/// Where a process's input goes.
pub(super) enum Input {
    Pipe(pipe::Sender),
    Pty(tokio::fs::File),
}

/// Who gets a process's events, and how it ended once it has.
pub(super) struct Fanout {
    pub(super) subscribers: Vec<mpsc::Sender<ProcessEvent>>,
    pub(super) ended: Option<EndEvent>,
}

pub(super) struct ProcessHandle {
    pub(super) pid: u32,
    pub(super) config: ProcessConfig,
    pub(super) tag: Option<String>,
    pub(super) input: tokio::sync::Mutex<Option<Input>>,
    /// The terminal's master side, kept for resizing.
    pub(super) pty_master: Option<OwnedFd>,
    pub(super) fanout: Mutex<Fanout>,
}

impl ProcessHandle {
    fn info(&self) -> ProcessInfo {
        ProcessInfo {
            config: self.config.clone(),
            pid: self.pid,
            tag: self.tag.clone(),
        }
    }

    /// Attaches a new stream. After the end it still gets the end event, alone.
    pub(super) fn subscribe(&self) -> mpsc::Receiver<ProcessEvent> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let mut fanout = self.fanout.lock().unwrap_or_else(|e| e.into_inner());
        match &fanout.ended {
            Some(end) => {
                let _ = tx.try_send(ProcessEvent::End(end.clone()));
            }
            None => fanout.subscribers.push(tx),
        }
        rx
    }

    pub(super) async fn publish(&self, event: ProcessEvent) {
        let subscribers = self
            .fanout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribers
            .clone();
        for tx in &subscribers {
            // A closed receiver is a client that went away: the process goes on regardless.
            let _ = tx.send(event.clone()).await;
        }
        self.fanout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribers
            .retain(|tx| !tx.is_closed());
    }

    pub(super) async fn finish(&self, end: EndEvent) {
        let subscribers = {
            let mut fanout = self.fanout.lock().unwrap_or_else(|e| e.into_inner());
            fanout.ended = Some(end.clone());
            std::mem::take(&mut fanout.subscribers)
        };
        for tx in subscribers {
            let _ = tx.send(ProcessEvent::End(end.clone())).await;
        }
    }

    pub(super) fn signal(&self, signal: NixSignal) -> Result<(), RpcError> {
        // Every process leads its own group, so this reaches its children too.
        killpg(Pid::from_raw(self.pid as i32), signal)
            .map_err(|e| RpcError::internal(format!("signalling process {}: {e}", self.pid)))
    }
}

#[derive(Default)]
pub(super) struct ProcessTable {
    live: Mutex<HashMap<u32, Arc<ProcessHandle>>>,
}

impl ProcessTable {
    pub(super) fn insert(&self, handle: Arc<ProcessHandle>) {
        self.lock().insert(handle.pid, handle);
    }

    pub(super) fn remove(&self, pid: u32) {
        self.lock().remove(&pid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<ProcessHandle>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn find(&self, selector: &ProcessSelector) -> Result<Arc<ProcessHandle>, RpcError> {
        let live = self.lock();
        let found = match selector {
            ProcessSelector::Pid(pid) => live.get(pid).cloned(),
            ProcessSelector::Tag(tag) => live
                .values()
                .find(|p| p.tag.as_deref() == Some(tag.as_str()))
                .cloned(),
        };
        found.ok_or_else(|| match selector {
            ProcessSelector::Pid(pid) => {
                RpcError::not_found(format!("process with pid {pid} not found"))
            }
            ProcessSelector::Tag(tag) => {
                RpcError::not_found(format!("process with tag {tag} not found"))
            }
        })
    }

    fn list(&self) -> Vec<ProcessInfo> {
        let mut out: Vec<ProcessInfo> = self.lock().values().map(|p| p.info()).collect();
        out.sort_by_key(|p| p.pid);
        out
    }
}

pub(super) async fn list(State(processes): State<Arc<Processes>>) -> Json<ListResponse> {
    Json(ListResponse {
        processes: processes.table.list(),
    })
}
