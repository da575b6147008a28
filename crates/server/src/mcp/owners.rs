//! Which API key opened each MCP session over HTTP. rmcp finds a session by its
//! `Mcp-Session-Id` alone, for every request that names it: tool calls, notifications (a
//! cancel), replays of its streams (`GET` with `Last-Event-ID`, which resends its results)
//! and its end (`DELETE`, which kills its sandboxes). So a request that names a session is let
//! through only with the key that opened it; any other key is told what an unknown id is told.
//! Each open session holds a task and its buffers until it ends or idles out (5 minutes), so
//! a key may have at most [`MAX_PER_KEY`] open at once.

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Sessions one key may have open at once.
pub const MAX_PER_KEY: usize = 64;

pub struct SessionOwners {
    /// rmcp's sessions, to forget the owners of those that ended on their own (idle).
    sessions: Arc<LocalSessionManager>,
    /// Session id → the id of the key that opened it.
    owners: Mutex<HashMap<String, String>>,
}

impl SessionOwners {
    pub fn new(sessions: Arc<LocalSessionManager>) -> Self {
        SessionOwners {
            sessions,
            owners: Mutex::default(),
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the key `key_id` opened `session` (no for a session nobody opened).
    pub fn owned_by(&self, session: &str, key_id: &str) -> bool {
        self.owners().get(session).is_some_and(|k| k == key_id)
    }

    /// Records the session that a request of `key_id` just opened; or, if that key has
    /// [`MAX_PER_KEY`] open already, ends it and says so (false).
    pub async fn opened(&self, session: &str, key_id: &str) -> bool {
        let admitted = {
            // Under rmcp's lock, so that no session opened meanwhile is taken for an ended one.
            let live = self.sessions.sessions.read().await;
            let mut owners = self.owners();
            owners.retain(|id, _| live.contains_key(id.as_str()));
            let open = owners.values().filter(|k| *k == key_id).count();
            (open < MAX_PER_KEY)
                .then(|| owners.insert(session.to_owned(), key_id.to_owned()))
                .is_some()
        };
        if !admitted {
            let _ = self.sessions.close_session(&session.into()).await;
        }
        admitted
    }

    pub fn closed(&self, session: &str) {
        self.owners().remove(session);
    }
}
