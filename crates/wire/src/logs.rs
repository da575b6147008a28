//! A sandbox's own log (E2B's sandbox logs): what its agent did and what its template's start
//! command wrote. The agent keeps it in memory and hands the whole of it to the server at
//! [`LOGS_PATH`]; the server filters and pages it for the API.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The agent's route for its log, for the server only (the proxy refuses it).
pub const LOGS_PATH: &str = "/airlock/logs";
/// The process tag the server starts a template's start command with; the agent logs the
/// output of a process so tagged.
pub const START_CMD_TAG: &str = "start-cmd";
/// Longest line the log (and the server's view of a command's output) holds; a longer one is
/// cut into pieces of this many bytes.
pub const MAX_LINE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Debug, Self::Info, Self::Warn, Self::Error]
            .into_iter()
            .find(|level| level.as_str() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Unix milliseconds.
    pub at_ms: i64,
    pub level: LogLevel,
    pub message: String,
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

/// Output bytes cut into lines: without their `\n` (or `\r\n`), at most [`MAX_LINE`] bytes,
/// invalid UTF-8 replaced.
#[derive(Debug, Default)]
pub struct LineBuffer(Vec<u8>);

impl LineBuffer {
    /// Adds `data`, handing each line it completes to `line`.
    pub fn push(&mut self, data: &[u8], line: &mut dyn FnMut(String)) {
        for &byte in data {
            if byte == b'\n' || self.0.len() >= MAX_LINE {
                self.flush(line);
            }
            if byte != b'\n' {
                self.0.push(byte);
            }
        }
    }

    /// Hands on the unfinished last line, if any.
    pub fn flush(&mut self, line: &mut dyn FnMut(String)) {
        if !self.0.is_empty() {
            let text = String::from_utf8_lossy(&self.0)
                .trim_end_matches('\r')
                .to_owned();
            self.0.clear();
            line(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_at_newlines_and_at_the_cap() {
        let mut lines = Vec::new();
        let mut buffer = LineBuffer::default();
        let long = "x".repeat(MAX_LINE + 10);
        buffer.push(b"one\r\ntw", &mut |l| lines.push(l));
        buffer.push(format!("o\n{long}\nlast").as_bytes(), &mut |l| {
            lines.push(l)
        });
        buffer.flush(&mut |l| lines.push(l));
        assert_eq!(lines[..2], ["one", "two"]);
        assert_eq!(lines[2].len(), MAX_LINE);
        assert_eq!(lines[3], "x".repeat(10));
        assert_eq!(lines[4], "last");
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn levels_order_by_severity() {
        assert!(LogLevel::Debug < LogLevel::Info && LogLevel::Warn < LogLevel::Error);
        assert_eq!(LogLevel::parse("warn"), Some(LogLevel::Warn));
        assert_eq!(LogLevel::parse("fatal"), None);
    }
}
