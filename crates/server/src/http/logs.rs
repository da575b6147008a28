//! A sandbox's log (`GET /v2/sandboxes/{id}/logs`, and E2B's first version without it):
//! what its agent did and what its template's start command wrote. The agent holds the log;
//! this pages and filters it as E2B's API does. A key sees its own sandboxes' logs only.
//! A build's log is paged the same way ([`Page`], for `templates/builds.rs`).

use crate::http::auth::Owned;
use crate::http::error::ApiError;
use crate::AppState;
use airlock_wire::api::{SandboxLogEntry, SandboxLogLine, SandboxLogsV1, SandboxLogsV2};
use airlock_wire::logs::{LogEntry, LogLevel};
use axum::extract::{Query, State};
use axum::Json;
use std::collections::HashMap;

/// Entries one call returns unless it asks for fewer (E2B's default, and its most).
const MAX_PAGE: usize = 1000;

/// What a page chooses a log entry by: a sandbox's and a build's entries alike.
pub(crate) trait Logged {
    fn at_ms(&self) -> i64;
    fn level(&self) -> LogLevel;
    fn message(&self) -> &str;
}

impl Logged for LogEntry {
    fn at_ms(&self) -> i64 {
        self.at_ms
    }
    fn level(&self) -> LogLevel {
        self.level
    }
    fn message(&self) -> &str {
        &self.message
    }
}

impl Logged for airlock_core::store::LogEntry {
    fn at_ms(&self) -> i64 {
        self.at_ms
    }
    fn level(&self) -> LogLevel {
        self.level
    }
    fn message(&self) -> &str {
        &self.message
    }
}

/// Which entries to return, in which order.
#[derive(Debug, PartialEq)]
pub(crate) struct Page {
    /// Unix milliseconds: from here on (forward) or back from here (backward).
    cursor: Option<i64>,
    backward: bool,
    limit: usize,
    min_level: LogLevel,
    /// Case-sensitive, in the message.
    search: Option<String>,
}

impl Page {
    pub(crate) fn parse(
        query: &HashMap<String, String>,
        cursor_name: &str,
    ) -> Result<Page, ApiError> {
        let number = |name: &str| -> Result<Option<i64>, ApiError> {
            query
                .get(name)
                .map(|v| {
                    v.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                        ApiError::bad_request(format!("{name} must be a whole number, not {v:?}"))
                    })
                })
                .transpose()
        };
        let limit = match number("limit")? {
            None => MAX_PAGE,
            Some(n @ 1..) if n as usize <= MAX_PAGE => n as usize,
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "limit must be 1 to {MAX_PAGE}"
                )))
            }
        };
        let backward = match query.get("direction").map(String::as_str) {
            None | Some("forward") => false,
            Some("backward") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "direction must be forward or backward, not {other:?}"
                )))
            }
        };
        let min_level = match query.get("level") {
            None => LogLevel::Debug,
            Some(name) => LogLevel::parse(name).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "level must be debug, info, warn or error, not {name:?}"
                ))
            })?,
        };
        Ok(Page {
            cursor: number(cursor_name)?,
            backward,
            limit,
            min_level,
            search: query.get("search").cloned(),
        })
    }

    /// The entries of `log` (oldest first) this page holds, in its direction.
    pub(crate) fn select<'a, E: Logged>(&self, log: &'a [E]) -> Vec<&'a E> {
        let wanted = |e: &&E| {
            e.level() >= self.min_level
                && self
                    .search
                    .as_deref()
                    .is_none_or(|s| e.message().contains(s))
        };
        if self.backward {
            let until = self.cursor.unwrap_or(i64::MAX);
            let newest_first = log.iter().rev().filter(|e| e.at_ms() <= until);
            newest_first.filter(wanted).take(self.limit).collect()
        } else {
            let from = self.cursor.unwrap_or(i64::MIN);
            let oldest_first = log.iter().filter(|e| e.at_ms() >= from);
            oldest_first.filter(wanted).take(self.limit).collect()
        }
    }
}

/// A log entry's time as E2B's answers carry it.
pub(crate) fn timestamp(at_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(at_ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn entry_body(e: &LogEntry) -> SandboxLogEntry {
    SandboxLogEntry {
        timestamp: timestamp(e.at_ms),
        level: e.level,
        message: e.message.clone(),
        fields: e.fields.clone(),
    }
}

/// Entries from `cursor` (Unix ms) on by default; `direction=backward` reads back from it,
/// newest first; `level` is the least severe level shown; `search` matches messages.
pub(crate) async fn logs_v2(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<SandboxLogsV2>, ApiError> {
    let page = Page::parse(&query, "cursor")?;
    let log = state.lifecycle.logs(&id).await?;
    let logs = page.select(&log).into_iter().map(entry_body).collect();
    Ok(Json(SandboxLogsV2 { logs }))
}

/// E2B's first version: entries from `start` (Unix ms) on, oldest first, up to `limit`.
pub(crate) async fn logs_v1(
    State(state): State<AppState>,
    Owned { id, .. }: Owned,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<SandboxLogsV1>, ApiError> {
    let only = |name: &str| query.get(name).map(|v| (name.to_owned(), v.clone()));
    let query: HashMap<String, String> = ["start", "limit"].into_iter().filter_map(only).collect();
    let page = Page::parse(&query, "start")?;
    let log = state.lifecycle.logs(&id).await?;
    let entries = page.select(&log);
    Ok(Json(SandboxLogsV1 {
        logs: entries
            .iter()
            .map(|e| SandboxLogLine {
                timestamp: timestamp(e.at_ms),
                line: e.message.clone(),
            })
            .collect(),
        log_entries: entries.into_iter().map(entry_body).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at_ms: i64, level: LogLevel, message: &str) -> LogEntry {
        LogEntry {
            at_ms,
            level,
            message: message.into(),
            fields: Default::default(),
        }
    }

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn messages(page: &Page, log: &[LogEntry]) -> Vec<String> {
        page.select(log).iter().map(|e| e.message.clone()).collect()
    }

    #[test]
    fn pages_filter_and_order() {
        let log = [
            entry(10, LogLevel::Debug, "a"),
            entry(20, LogLevel::Info, "b served"),
            entry(30, LogLevel::Error, "c failed"),
            entry(40, LogLevel::Info, "d served"),
        ];
        let page = |pairs: &[(&str, &str)]| Page::parse(&query(pairs), "cursor").unwrap();
        assert_eq!(
            messages(&page(&[]), &log),
            ["a", "b served", "c failed", "d served"]
        );
        assert_eq!(
            messages(&page(&[("cursor", "20"), ("limit", "2")]), &log),
            ["b served", "c failed"]
        );
        assert_eq!(
            messages(&page(&[("direction", "backward"), ("cursor", "30")]), &log),
            ["c failed", "b served", "a"]
        );
        assert_eq!(
            messages(&page(&[("level", "info"), ("limit", "2")]), &log),
            ["b served", "c failed"]
        );
        assert_eq!(messages(&page(&[("level", "error")]), &log), ["c failed"]);
        assert_eq!(
            messages(&page(&[("search", "served")]), &log),
            ["b served", "d served"]
        );
        assert!(messages(&page(&[("search", "Served")]), &log).is_empty());
    }

    #[test]
    fn bad_queries_are_refused() {
        for bad in [
            ("limit", "0"),
            ("limit", "1001"),
            ("limit", "x"),
            ("cursor", "-1"),
            ("direction", "sideways"),
            ("level", "fatal"),
        ] {
            let err = Page::parse(&query(&[bad]), "cursor").unwrap_err();
            assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }
}
