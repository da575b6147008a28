//! Signed `/files` URLs (protocol doc §3.6): which running sandbox's access token made a URL's
//! signature, found once and then remembered.

use crate::AppState;
use airlock_core::ids::{constant_time_eq, SandboxId};
use airlock_core::lifecycle::Sandbox;
use airlock_request::url_pairs;
use airlock_wire::signed_url::{signature, FileOperation};
use axum::http::{Method, Uri};
use std::sync::Arc;

/// What a signed URL claims: a signature over its path, user, expiry and operation, made with
/// some sandbox's access token (protocol doc §3.6). The SDK puts no sandbox id in such a URL.
pub(crate) struct SignedUrl {
    operation: FileOperation,
    given: String,
    path: String,
    username: String,
    expiration: Option<String>,
}

impl SignedUrl {
    /// The signed URL a request is for, if it is one (the method fixes the operation).
    pub(crate) fn of(method: &Method, uri: &Uri) -> Option<SignedUrl> {
        let operation = match *method {
            Method::GET | Method::HEAD => FileOperation::Read,
            Method::POST => FileOperation::Write,
            _ => return None,
        };
        let query: Vec<(String, String)> = uri.query().map(url_pairs).unwrap_or_default();
        let get = |k: &str| {
            query
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        Some(SignedUrl {
            operation,
            given: get("signature")?,
            path: get("path").unwrap_or_default(),
            username: get("username").unwrap_or_default(),
            expiration: get("signature_expiration"),
        })
    }

    pub(crate) fn signature(&self) -> &str {
        &self.given
    }

    /// Whether `token` made the signature.
    pub(crate) fn signed_by(&self, token: &str) -> bool {
        let expected = signature(
            &self.path,
            self.operation,
            &self.username,
            token,
            self.expiration.as_deref(),
        );
        constant_time_eq(expected.as_bytes(), self.given.as_bytes())
    }
}

/// The running sandbox whose access token produced this URL's signature. The first request
/// for a signature checks it against each running sandbox's token, one hash each, and
/// remembers the answer: requests for that URL after it are found in O(1).
pub(crate) async fn signer_of(
    state: &AppState,
    method: &Method,
    uri: &Uri,
) -> Option<Arc<Sandbox>> {
    let url = SignedUrl::of(method, uri)?;
    let signed_by = |token: &str| url.signed_by(token);
    if let Some(id) = state.signers.get(url.signature()) {
        if let Ok(sandbox) = state.lifecycle.running(id.as_str()).await {
            if sandbox.access_token().as_deref().is_some_and(signed_by) {
                return Some(sandbox);
            }
        }
    }
    let sandbox = state.lifecycle.find_by_access_token(signed_by)?;
    state
        .signers
        .remember(url.signature(), sandbox.id().clone());
    Some(sandbox)
}

/// Signatures already matched to their sandbox. Bounded: when full it starts over, which costs
/// only a new lookup per URL.
#[derive(Default)]
pub struct Signers(std::sync::Mutex<std::collections::HashMap<String, SandboxId>>);

impl Signers {
    const MAX: usize = 4096;

    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, SandboxId>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, signature: &str) -> Option<SandboxId> {
        self.map().get(signature).cloned()
    }

    pub(crate) fn remember(&self, signature: &str, sandbox: SandboxId) {
        let mut map = self.map();
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(signature.to_owned(), sandbox);
    }
}
