//! The sandbox's own log (E2B's sandbox logs): processes started and ended through the agent,
//! and the lines a template's start command writes. Kept in memory, so it is part of every
//! checkpoint, and handed whole to the server at [`LOGS_PATH`].

use airlock_wire::logs::{LogEntry, LogLevel, LOGS_PATH};
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Bytes of messages and fields kept; the oldest entries go first beyond it.
const MAX_BYTES: usize = 1 << 20;

pub fn routes(log: Arc<SandboxLog>) -> Router {
    Router::new().route(LOGS_PATH, get(read)).with_state(log)
}

async fn read(State(log): State<Arc<SandboxLog>>) -> Json<Vec<LogEntry>> {
    Json(log.entries())
}

#[derive(Default)]
pub struct SandboxLog(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    entries: VecDeque<LogEntry>,
    bytes: usize,
}

fn size(entry: &LogEntry) -> usize {
    let fields: usize = entry.fields.iter().map(|(k, v)| k.len() + v.len()).sum();
    entry.message.len() + fields
}

impl SandboxLog {
    pub fn write<'a>(
        &self,
        level: LogLevel,
        message: impl Into<String>,
        fields: impl IntoIterator<Item = (&'a str, String)>,
    ) {
        let entry = LogEntry {
            at_ms: now_ms(),
            level,
            message: message.into(),
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<BTreeMap<_, _>>(),
        };
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.bytes += size(&entry);
        kept.entries.push_back(entry);
        while kept.bytes > MAX_BYTES {
            let Some(oldest) = kept.entries.pop_front() else {
                break;
            };
            kept.bytes -= size(&oldest);
        }
    }

    pub fn entries(&self) -> Vec<LogEntry> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.entries.iter().cloned().collect()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_entries_go_beyond_the_cap() {
        let log = SandboxLog::default();
        let line = "x".repeat(1000);
        for i in 0..2000 {
            log.write(LogLevel::Info, line.clone(), [("n", i.to_string())]);
        }
        let entries = log.entries();
        let bytes: usize = entries.iter().map(size).sum();
        assert!(bytes <= MAX_BYTES && bytes > MAX_BYTES - 2000, "{bytes}");
        assert_eq!(entries.last().unwrap().fields["n"], "1999");
        assert!(entries.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    }
}
