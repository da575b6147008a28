//! Which sandbox and port a request is for: by `E2b-Sandbox-Id`, by a Host of the form
//! `{port}-{id}.{domain}`, or by a signed `/files` URL.

use airlock_wire::{ENVD_PORT, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};
use axum::http::{header, HeaderMap, Uri};

/// Which sandbox and port a request is for, if it is sandbox traffic at all.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Sandbox {
        id: String,
        port: u16,
    },
    /// A signed `/files` URL: the sandbox is the one whose token made the signature.
    SignedFiles,
}

pub fn classify(headers: &HeaderMap, uri: &Uri) -> Option<Target> {
    if let Some(id) = headers.get(SANDBOX_ID_HEADER).and_then(|v| v.to_str().ok()) {
        let port = headers
            .get(SANDBOX_PORT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(ENVD_PORT);
        return Some(Target::Sandbox {
            id: id.trim().to_owned(),
            port,
        });
    }
    if let Some(target) = sandbox_host(headers) {
        return Some(target);
    }
    let signed = uri.path() == "/files"
        && uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("signature=")));
    signed.then_some(Target::SignedFiles)
}

/// The sandbox and port the request's Host names, if it names one.
pub fn sandbox_host(headers: &HeaderMap) -> Option<Target> {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_sandbox_host)
}

/// `49983-abc123.example.test[:port]` → sandbox `abc123`, port 49983.
fn parse_sandbox_host(host: &str) -> Option<Target> {
    let label = host.split('.').next()?;
    if label.len() == host.len() {
        return None; // a bare name like `localhost` is the API
    }
    let (port, id) = label.split_once('-')?;
    let port = port.parse().ok()?;
    let id_ok = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    id_ok.then(|| Target::Sandbox {
        id: id.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn classifies_by_header_host_and_signature() {
        let uri: Uri = "/process.Process/Start".parse().unwrap();
        assert_eq!(
            classify(
                &headers(&[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "49999")]),
                &uri
            ),
            Some(Target::Sandbox {
                id: "abc".into(),
                port: 49999
            })
        );
        assert_eq!(
            classify(&headers(&[("host", "8080-abc1.airlock.test:3000")]), &uri),
            Some(Target::Sandbox {
                id: "abc1".into(),
                port: 8080
            })
        );
        assert_eq!(
            classify(&headers(&[("host", "127.0.0.1:3000")]), &uri),
            None
        );
        assert_eq!(
            classify(&headers(&[("host", "localhost:3000")]), &uri),
            None
        );
        let signed: Uri = "/files?path=%2Fa&signature=v1_x".parse().unwrap();
        assert_eq!(classify(&headers(&[]), &signed), Some(Target::SignedFiles));
        let health: Uri = "/health".parse().unwrap();
        assert_eq!(classify(&headers(&[]), &health), None);
    }
}
