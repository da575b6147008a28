//! The `/execute` response: one JSON object per line, as the SDK's `parse_output` reads it.
//!
//! The SDK runs `json.loads` on every line, so a line is never blank, and every object carries
//! `type`. Output is bounded per execution: stream text past [`STREAM_LIMIT`] is dropped with one
//! notice on stderr, and rich results past [`RESULT_LIMIT`] (each) or [`RESULTS_LIMIT`] (all of a
//! run) are replaced by a notice.

use axum::body::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// stdout + stderr text kept per execution.
pub const STREAM_LIMIT: usize = 8 * 1024 * 1024;
/// Largest single result (its JSON encoding).
pub const RESULT_LIMIT: usize = 32 * 1024 * 1024;
/// All results of one execution together.
pub const RESULTS_LIMIT: usize = 64 * 1024 * 1024;
/// Longest error traceback passed on.
const TRACEBACK_LIMIT: usize = 1024 * 1024;
/// Silence after which a keepalive line is sent, so a vanished client is noticed.
pub const KEEPALIVE_AFTER: Duration = Duration::from_secs(5);
/// Lines buffered between the execution and the HTTP body.
pub const LINE_BUFFER: usize = 32;

/// One line of the response.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    NumberOfExecutions {
        execution_count: i64,
    },
    Stdout {
        text: String,
        timestamp: String,
    },
    Stderr {
        text: String,
        timestamp: String,
    },
    Result(Box<ResultEvent>),
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    Keepalive,
    EndOfExecution,
}

impl Event {
    pub fn error(name: impl Into<String>, value: impl Into<String>) -> Event {
        Event::Error {
            name: name.into(),
            value: value.into(),
            traceback: String::new(),
        }
    }

    /// The kernel's `error` content (`ename`, `evalue`, `traceback` list).
    pub fn from_kernel_error(content: &Value) -> Event {
        let text = |key: &str| {
            content
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let lines: Vec<&str> = content
            .get("traceback")
            .and_then(Value::as_array)
            .map(|l| l.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut traceback = lines.join("\n");
        truncate_at_char(&mut traceback, TRACEBACK_LIMIT);
        Event::Error {
            name: text("ename"),
            value: text("evalue"),
            traceback,
        }
    }

    /// The event as one response line, `\n` included. Compact JSON escapes every newline inside
    /// strings, so the line has exactly one, at its end.
    pub fn to_line(&self) -> Bytes {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|e| {
            // Serialising plain strings and JSON values cannot fail; keep the stream valid anyway.
            format!(r#"{{"type":"error","name":"AirlockError","value":"{e}","traceback":""}}"#)
                .into_bytes()
        });
        line.push(b'\n');
        Bytes::from(line)
    }
}

/// A `result` event: the MIME bundle mapped to the SDK's `Result` fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ResultEvent {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chart: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<Map<String, Value>>,
    pub is_main_result: bool,
}

impl ResultEvent {
    /// Maps a Jupyter MIME bundle (`execute_result` → main result, `display_data` → not).
    pub fn from_bundle(bundle: &Map<String, Value>, is_main_result: bool) -> ResultEvent {
        let mut out = ResultEvent {
            is_main_result,
            ..Default::default()
        };
        let mut extra = Map::new();
        for (mime, value) in bundle {
            // Kernels may send text as a list of lines (the notebook format).
            let text = || text_value(value);
            match mime.as_str() {
                "text/plain" => out.text = text().map(|t| strip_quotes(&t).to_owned()),
                "text/html" => out.html = text(),
                "text/markdown" => out.markdown = text(),
                "image/svg+xml" => out.svg = text(),
                "image/png" => out.png = text(),
                "image/jpeg" => out.jpeg = text(),
                "application/pdf" => out.pdf = text(),
                "text/latex" => out.latex = text(),
                "application/javascript" => out.javascript = text(),
                "application/json" => out.json = Some(value.clone()),
                "e2b/data" => out.data = Some(value.clone()),
                "e2b/chart" => out.chart = Some(value.clone()),
                _ => {
                    extra.insert(mime.clone(), value.clone());
                }
            }
        }
        if !extra.is_empty() {
            out.extra = Some(extra);
        }
        out
    }
}

fn text_value(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(parts.iter().filter_map(Value::as_str).collect()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// E2B strips one pair of surrounding quotes, so a string result (Python's `'abc'`, Deno's
/// `"abc"`) reads as `abc`.
fn strip_quotes(text: &str) -> &str {
    let quoted = |q: char| text.len() >= 2 && text.starts_with(q) && text.ends_with(q);
    if quoted('\'') || quoted('"') {
        &text[1..text.len() - 1]
    } else {
        text
    }
}

fn truncate_at_char(text: &mut String, max: usize) {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
}

/// `2025-01-01T00:00:00.123456+00:00`, from a kernel's header date when it has one.
pub fn timestamp(kernel_date: Option<&str>) -> String {
    let when = kernel_date
        .and_then(|d| chrono::DateTime::parse_from_rfc3339(d).ok())
        .map(|d| d.with_timezone(&chrono::Utc))
        .filter(|d| d.timestamp() > 0)
        .unwrap_or_else(chrono::Utc::now);
    when.format("%Y-%m-%dT%H:%M:%S%.6f+00:00").to_string()
}

/// Which stream a `stream` message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamName {
    Stdout,
    Stderr,
}

/// The response body's writer: sends lines, notices the client leaving, keeps the bounds.
pub struct Output {
    tx: mpsc::Sender<Bytes>,
    gone: bool,
    last_write: Instant,
    stream_bytes: usize,
    stream_truncated: bool,
    result_bytes: usize,
}

impl Output {
    pub fn new(tx: mpsc::Sender<Bytes>) -> Output {
        Output {
            tx,
            gone: false,
            last_write: Instant::now(),
            stream_bytes: 0,
            stream_truncated: false,
            result_bytes: 0,
        }
    }

    /// Whether the client has gone away (a write failed or the body was dropped).
    pub fn is_gone(&self) -> bool {
        self.gone || self.tx.is_closed()
    }

    /// Resolves when the client goes away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    /// When the next keepalive is due.
    pub fn keepalive_at(&self) -> Instant {
        self.last_write + KEEPALIVE_AFTER
    }

    /// Writes one line; after the client left this does nothing.
    pub async fn send(&mut self, event: &Event) {
        if self.gone {
            return;
        }
        if self.tx.send(event.to_line()).await.is_err() {
            self.gone = true;
        }
        self.last_write = Instant::now();
    }

    /// Stream text, within [`STREAM_LIMIT`].
    pub async fn stream(&mut self, name: StreamName, mut text: String, timestamp: String) {
        if self.stream_truncated || text.is_empty() {
            return;
        }
        let room = STREAM_LIMIT - self.stream_bytes;
        let over = text.len() > room;
        truncate_at_char(&mut text, room);
        self.stream_bytes += text.len();
        if !text.is_empty() {
            let event = match name {
                StreamName::Stdout => Event::Stdout {
                    text,
                    timestamp: timestamp.clone(),
                },
                StreamName::Stderr => Event::Stderr {
                    text,
                    timestamp: timestamp.clone(),
                },
            };
            self.send(&event).await;
        }
        if over {
            self.stream_truncated = true;
            let notice = Event::Stderr {
                text: format!(
                    "\n[airlock: output truncated after {} MiB]\n",
                    STREAM_LIMIT / (1024 * 1024)
                ),
                timestamp,
            };
            self.send(&notice).await;
        }
    }

    /// A result, unless it (or all results so far) would be too large.
    pub async fn result(&mut self, result: ResultEvent) {
        let event = Event::Result(Box::new(result));
        let line = event.to_line();
        if line.len() > RESULT_LIMIT || self.result_bytes + line.len() > RESULTS_LIMIT {
            let notice = Event::Stderr {
                text: format!(
                    "[airlock: a result of {} bytes was dropped (limits: {} MiB per result, {} MiB per execution)]\n",
                    line.len(),
                    RESULT_LIMIT / (1024 * 1024),
                    RESULTS_LIMIT / (1024 * 1024)
                ),
                timestamp: timestamp(None),
            };
            self.send(&notice).await;
            return;
        }
        self.result_bytes += line.len();
        if self.gone {
            return;
        }
        if self.tx.send(line).await.is_err() {
            self.gone = true;
        }
        self.last_write = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bundle(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn maps_mime_types() {
        let r = ResultEvent::from_bundle(
            &bundle(json!({
                "text/plain": "'hello'",
                "text/html": "<b>x</b>",
                "text/markdown": "**x**",
                "image/svg+xml": ["<svg>", "</svg>"],
                "image/png": "iVBOR",
                "image/jpeg": "/9j/",
                "application/pdf": "JVBER",
                "text/latex": "$x$",
                "application/json": {"a": 1},
                "application/javascript": "alert(1)",
                "e2b/data": {"d": [1]},
                "e2b/chart": {"type": "line"},
                "application/vnd.custom+json": {"c": true},
                "text/csv": "a,b",
            })),
            true,
        );
        let v = serde_json::to_value(Event::Result(Box::new(r))).unwrap();
        assert_eq!(
            v,
            json!({
                "type": "result",
                "text": "hello",
                "html": "<b>x</b>",
                "markdown": "**x**",
                "svg": "<svg></svg>",
                "png": "iVBOR",
                "jpeg": "/9j/",
                "pdf": "JVBER",
                "latex": "$x$",
                "json": {"a": 1},
                "javascript": "alert(1)",
                "data": {"d": [1]},
                "chart": {"type": "line"},
                "extra": {"application/vnd.custom+json": {"c": true}, "text/csv": "a,b"},
                "is_main_result": true,
            })
        );
    }

    #[test]
    fn omits_absent_fields() {
        let r = ResultEvent::from_bundle(&bundle(json!({"text/plain": "2"})), false);
        assert_eq!(
            serde_json::to_value(Event::Result(Box::new(r))).unwrap(),
            json!({"type": "result", "text": "2", "is_main_result": false})
        );
    }

    #[test]
    fn strips_one_pair_of_single_quotes() {
        assert_eq!(strip_quotes("'abc'"), "abc");
        assert_eq!(strip_quotes("''abc''"), "'abc'");
        assert_eq!(strip_quotes("''"), "");
        assert_eq!(strip_quotes("'"), "'");
        assert_eq!(strip_quotes("\"it's\""), "it's");
        assert_eq!(strip_quotes("\"a'"), "\"a'");
        assert_eq!(strip_quotes("\""), "\"");
        assert_eq!(strip_quotes("42"), "42");
    }

    #[test]
    fn lines_are_single_and_never_blank() {
        let events = [
            Event::NumberOfExecutions { execution_count: 2 },
            Event::Stdout {
                text: "a\nb\n\n".into(),
                timestamp: timestamp(None),
            },
            Event::Stderr {
                text: String::new(),
                timestamp: timestamp(None),
            },
            Event::Error {
                name: "E".into(),
                value: "v\r\n".into(),
                traceback: "l1\nl2".into(),
            },
            Event::Keepalive,
            Event::EndOfExecution,
        ];
        for e in &events {
            let line = e.to_line();
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
            assert_eq!(line.last(), Some(&b'\n'));
            assert!(line.len() > 1);
            let back: Value = serde_json::from_slice(&line).unwrap();
            assert!(back.get("type").is_some());
        }
        assert_eq!(
            &Event::Keepalive.to_line()[..],
            b"{\"type\":\"keepalive\"}\n"
        );
        assert_eq!(
            &Event::EndOfExecution.to_line()[..],
            b"{\"type\":\"end_of_execution\"}\n"
        );
        assert_eq!(
            &Event::NumberOfExecutions { execution_count: 2 }.to_line()[..],
            b"{\"type\":\"number_of_executions\",\"execution_count\":2}\n"
        );
    }

    #[test]
    fn joins_tracebacks_with_newlines() {
        let e = Event::from_kernel_error(&json!({
            "ename": "ZeroDivisionError",
            "evalue": "division by zero",
            "traceback": ["first", "second"],
        }));
        assert_eq!(
            e,
            Event::Error {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback: "first\nsecond".into(),
            }
        );
    }

    #[test]
    fn formats_timestamps() {
        assert_eq!(
            timestamp(Some("2025-01-01T00:00:00.123456Z")),
            "2025-01-01T00:00:00.123456+00:00"
        );
        assert_eq!(
            timestamp(Some("2025-01-01T02:00:00.5+02:00")),
            "2025-01-01T00:00:00.500000+00:00"
        );
        let now = timestamp(Some("garbage"));
        assert!(now.ends_with("+00:00") && now.len() == 32, "{now}");
    }

    #[tokio::test]
    async fn bounds_stream_output() {
        let (tx, mut rx) = mpsc::channel(1024);
        let mut out = Output::new(tx);
        let chunk = "é".repeat(1024 * 1024); // 2 MiB
        for _ in 0..6 {
            out.stream(StreamName::Stdout, chunk.clone(), timestamp(None))
                .await;
        }
        drop(out);
        let mut text_bytes = 0;
        let mut notices = 0;
        while let Some(line) = rx.recv().await {
            let v: Value = serde_json::from_slice(&line).unwrap();
            let text = v["text"].as_str().unwrap();
            if text.contains("[airlock: output truncated") {
                notices += 1;
                assert_eq!(v["type"], "stderr");
            } else {
                text_bytes += text.len();
            }
        }
        assert_eq!(text_bytes, STREAM_LIMIT);
        assert_eq!(notices, 1);
    }

    #[tokio::test]
    async fn notices_a_gone_client() {
        let (tx, rx) = mpsc::channel(4);
        let mut out = Output::new(tx);
        assert!(!out.is_gone());
        drop(rx);
        out.closed().await;
        assert!(out.is_gone());
        out.send(&Event::Keepalive).await;
        assert!(out.is_gone());
    }
}
