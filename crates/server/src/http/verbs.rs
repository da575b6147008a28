//! The API's sandbox verbs, counted and timed as they answer, for the operator's `/metrics`
//! (see `operator_metrics`, which registers them).

use crate::http::error::ApiError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::time::Instant;

/// The API's sandbox verbs (create, resume, pause, snapshot, kill): how each call ended, and
/// how long it took, counted as they answer.
pub struct Verbs {
    calls: Family<VerbOutcome, Counter>,
    seconds: Family<Verb, Histogram, fn() -> Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbOutcome {
    verb: &'static str,
    /// `ok`, `refused` (the caller's fault or a limit: 4xx) or `failed` (the server's: 5xx).
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Verb {
    verb: &'static str,
}

impl Default for Verbs {
    fn default() -> Self {
        // 5 ms to 41 s: a pooled create to a cold boot of a big template.
        fn histogram() -> Histogram {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        }
        Verbs {
            calls: Family::default(),
            seconds: Family::new_with_constructor(histogram),
        }
    }
}

impl Verbs {
    /// Runs one call of `verb`, counting how it ended and timing it.
    pub async fn timed<T, E: Into<ApiError>>(
        &self,
        verb: &'static str,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, ApiError> {
        let started = Instant::now();
        let result = call.await.map_err(Into::into);
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) if e.status.is_client_error() => "refused",
            Err(_) => "failed",
        };
        self.calls
            .get_or_create(&VerbOutcome { verb, outcome })
            .inc();
        self.seconds
            .get_or_create(&Verb { verb })
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// Adds the counts and times to the operator's metrics.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "airlock_sandbox_verb_calls",
            "Calls of the API's sandbox verbs, by how they ended",
            self.calls.clone(),
        );
        registry.register(
            "airlock_sandbox_verb_seconds",
            "How long the API's sandbox verbs took to answer",
            self.seconds.clone(),
        );
    }
}
