//! An ordered single-writer queue: any task pushes without waiting, one writer takes the items
//! in order, and a flush waits until everything pushed before it is written. Build logs and
//! lifecycle events are written this way, so that no step or verb waits for the database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

pub(crate) struct OrderedQueue<T> {
    queue: mpsc::UnboundedSender<T>,
    /// Taken by the writer when it starts.
    unwritten: Mutex<Option<mpsc::UnboundedReceiver<T>>>,
    pushed: AtomicU64,
    /// How many items the writer is done with.
    written: Arc<watch::Sender<u64>>,
}

impl<T> Default for OrderedQueue<T> {
    fn default() -> Self {
        let (queue, unwritten) = mpsc::unbounded_channel();
        OrderedQueue {
            queue,
            unwritten: Mutex::new(Some(unwritten)),
            pushed: AtomicU64::new(0),
            written: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl<T> OrderedQueue<T> {
    pub fn push(&self, item: T) {
        self.pushed.fetch_add(1, Ordering::SeqCst);
        // Only fails once the writer is gone with its runtime, when nothing reads any more.
        let _ = self.queue.send(item);
    }

    /// Waits, at most `wait`, until the items pushed so far are written.
    pub async fn flush(&self, wait: Duration) {
        let pushed = self.pushed.load(Ordering::SeqCst);
        let mut written = self.written.subscribe();
        let _ = tokio::time::timeout(wait, written.wait_for(|n| *n >= pushed)).await;
    }

    /// The items, for the one writer; none if a writer took them already.
    pub fn writer(&self) -> Option<Writer<T>> {
        let unwritten = self
            .unwritten
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        Some(Writer {
            unwritten,
            written: self.written.clone(),
        })
    }
}

/// The writer's end of an [`OrderedQueue`].
pub(crate) struct Writer<T> {
    unwritten: mpsc::UnboundedReceiver<T>,
    written: Arc<watch::Sender<u64>>,
}

impl<T> Writer<T> {
    /// The next item, in push order; none once the queue is dropped and drained.
    pub async fn next(&mut self) -> Option<T> {
        self.unwritten.recv().await
    }

    /// The item [`Writer::next`] gave is done with (written, or given up).
    pub fn written(&self) {
        self.written.send_modify(|n| *n += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_flush_waits_for_what_was_pushed_before_it_in_order() {
        let queue = Arc::new(OrderedQueue::default());
        let mut writer = queue.writer().unwrap();
        assert!(queue.writer().is_none(), "one writer");
        let (tx, mut got) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(n) = writer.next().await {
                tokio::time::sleep(Duration::from_millis(5)).await;
                tx.send(n).unwrap();
                writer.written();
            }
        });
        for n in 0..10 {
            queue.push(n);
        }
        queue.flush(Duration::from_secs(10)).await;
        let mut seen = Vec::new();
        while let Ok(n) = got.try_recv() {
            seen.push(n);
        }
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
    }
}
