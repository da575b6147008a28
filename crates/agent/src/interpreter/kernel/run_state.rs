//! What one execution has seen of the kernel's messages, and the events it sends for them.

use super::process::KernelMessage;
use crate::interpreter::events::{self, Event, Output, ResultEvent, StreamName};
use serde_json::{Map, Value};
use tokio::time::Instant;

/// What one execution has seen so far.
#[derive(Default)]
pub(super) struct RunState {
    pub(super) count_sent: bool,
    pub(super) errored: bool,
    pub(super) replied: bool,
    pub(super) idle_at: Option<Instant>,
}

impl RunState {
    pub(super) async fn send_count(&mut self, content: &Value, out: &mut Output) {
        if self.count_sent {
            return;
        }
        if let Some(n) = content.get("execution_count").and_then(Value::as_i64) {
            self.count_sent = true;
            out.send(&Event::NumberOfExecutions { execution_count: n })
                .await;
        }
    }

    pub(super) async fn on_iopub(&mut self, m: KernelMessage, out: &mut Output) {
        match m.msg_type.as_str() {
            "execute_input" => self.send_count(&m.content, out).await,
            "stream" => {
                let name = match m.str("name") {
                    Some("stderr") => StreamName::Stderr,
                    _ => StreamName::Stdout,
                };
                let text = m.str("text").unwrap_or_default().to_owned();
                out.stream(name, text, events::timestamp(m.date.as_deref()))
                    .await;
            }
            "execute_result" | "display_data" => {
                let empty = Map::new();
                let bundle = m
                    .content
                    .get("data")
                    .and_then(Value::as_object)
                    .unwrap_or(&empty);
                let result = ResultEvent::from_bundle(bundle, m.msg_type == "execute_result");
                out.result(result).await;
            }
            "error" if !self.errored => {
                self.errored = true;
                out.send(&Event::from_kernel_error(&m.content)).await;
            }
            "status" if m.str("execution_state") == Some("idle") => {
                self.idle_at.get_or_insert_with(Instant::now);
            }
            _ => {}
        }
    }

    pub(super) async fn on_reply(&mut self, m: KernelMessage, out: &mut Output) {
        self.replied = true;
        self.send_count(&m.content, out).await;
        match m.str("status") {
            Some("error") if !self.errored => {
                self.errored = true;
                out.send(&Event::from_kernel_error(&m.content)).await;
            }
            Some("abort") | Some("aborted") => {
                out.send(&Event::error("ExecutionAborted", "Execution was aborted"))
                    .await;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    #[tokio::test]
    async fn run_state_maps_messages() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut out = Output::new(tx);
        let mut run = RunState::default();
        let msg = |t: &str, content: Value| KernelMessage {
            msg_type: t.into(),
            parent_id: Some("x".into()),
            date: None,
            content,
        };
        run.on_iopub(
            msg("execute_input", serde_json::json!({"execution_count": 2})),
            &mut out,
        )
        .await;
        run.on_iopub(
            msg(
                "error",
                serde_json::json!({"ename": "E", "evalue": "v", "traceback": ["a", "b"]}),
            ),
            &mut out,
        )
        .await;
        run.on_iopub(
            msg("status", serde_json::json!({"execution_state": "idle"})),
            &mut out,
        )
        .await;
        run.on_reply(
            msg(
                "execute_reply",
                serde_json::json!({"status": "error", "execution_count": 2, "ename": "E", "evalue": "v", "traceback": []}),
            ),
            &mut out,
        )
        .await;
        drop(out);
        let mut lines = Vec::new();
        while let Some(l) = rx.recv().await {
            lines.push(String::from_utf8(l.to_vec()).unwrap());
        }
        assert_eq!(
            lines,
            vec![
                "{\"type\":\"number_of_executions\",\"execution_count\":2}\n",
                "{\"type\":\"error\",\"name\":\"E\",\"value\":\"v\",\"traceback\":\"a\\nb\"}\n",
            ]
        );
        assert!(run.replied && run.idle_at.is_some());
    }
}
