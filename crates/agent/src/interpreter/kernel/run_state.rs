//! What one execution has seen of the kernel's messages, and the events it sends for them.

use super::process::KernelMessage;
use crate::interpreter::events::{self, Event, Output, ResultEvent, StreamName};
use crate::interpreter::kernelspec::Dialect;
use serde_json::{Map, Value};
use tokio::time::Instant;

/// What one execution has seen so far.
#[derive(Default)]
pub(super) struct RunState {
    pub(super) count_sent: bool,
    pub(super) errored: bool,
    pub(super) replied: bool,
    pub(super) idle_at: Option<Instant>,
    /// The kernel sends values as displays ([`Dialect::values_as_display`]).
    values_as_display: bool,
    /// Its latest display that is no image, held back until what comes next says whether it
    /// was the cell's value: more output (it was not), or the end of the run (it was).
    held: Option<ResultEvent>,
}

impl RunState {
    pub(super) fn new(dialect: Dialect) -> RunState {
        RunState {
            values_as_display: dialect.values_as_display(),
            ..RunState::default()
        }
    }

    /// Sends the held display, as the main result if the run ended with it and completed.
    pub(super) async fn release(&mut self, ended_with_it: bool, out: &mut Output) {
        if let Some(mut held) = self.held.take() {
            held.is_main_result = ended_with_it && !self.errored;
            out.result(held).await;
        }
    }

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
        if matches!(
            m.msg_type.as_str(),
            "stream" | "execute_result" | "display_data" | "error"
        ) {
            self.release(false, out).await;
        }
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
                let image = result.png.is_some() || result.jpeg.is_some() || result.svg.is_some();
                if self.values_as_display && !result.is_main_result && !image {
                    self.held = Some(result);
                } else {
                    out.result(result).await;
                }
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

    #[tokio::test]
    async fn an_r_cells_last_value_is_its_main_result() {
        let display = |text: &str| KernelMessage {
            msg_type: "display_data".into(),
            parent_id: Some("x".into()),
            date: None,
            content: serde_json::json!({"data": {"text/plain": text}}),
        };
        let plot = || KernelMessage {
            content: serde_json::json!({"data": {"image/png": "iVBOR", "text/plain": "plot"}}),
            ..display("")
        };
        let stream = || KernelMessage {
            msg_type: "stream".into(),
            content: serde_json::json!({"name": "stdout", "text": "out\n"}),
            ..display("")
        };
        // (messages, dialect) -> the results' (text, is_main_result), in the order sent.
        let results = |messages: Vec<KernelMessage>, dialect| async move {
            let (tx, mut rx) = mpsc::channel(16);
            let mut out = Output::new(tx);
            let mut run = RunState::new(dialect);
            for m in messages {
                run.on_iopub(m, &mut out).await;
            }
            run.release(true, &mut out).await;
            drop(out);
            let mut got = Vec::new();
            while let Some(line) = rx.recv().await {
                let event: Value = serde_json::from_slice(&line).unwrap();
                if event["type"] != "result" {
                    continue;
                }
                got.push((
                    event["text"].as_str().unwrap().to_owned(),
                    event["is_main_result"] == true,
                ));
            }
            got
        };
        let main = |t: &str, is_main| (t.to_owned(), is_main);
        assert_eq!(
            results(vec![display("[1] 1"), display("[1] 6")], Dialect::R).await,
            [main("[1] 1", false), main("[1] 6", true)]
        );
        assert_eq!(
            results(vec![display("[1] 6"), stream()], Dialect::R).await,
            [main("[1] 6", false)],
            "output after it: it was not the last expression"
        );
        assert_eq!(
            results(vec![display("[1] 6"), plot()], Dialect::R).await,
            [main("[1] 6", false), main("plot", false)],
            "a plot is never the value"
        );
        assert_eq!(
            results(vec![display("6")], Dialect::Python).await,
            [main("6", false)],
            "other kernels' displays are displays"
        );
    }
}
