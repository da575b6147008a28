//! Who may use `/files`: with an access token set, a request needs either the `X-Access-Token`
//! header or a signed URL (see [`signature`]); and whom it runs as.

use super::error::FilesError;
use crate::auth;
use crate::config::Config;
use crate::users::User;
use airlock_wire::signed_url::{signature, FileOperation};
use axum::extract::Query;
use axum::http::{HeaderMap, Uri};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub(super) struct FilesQuery {
    pub(super) path: Option<String>,
    pub(super) username: Option<String>,
    pub(super) signature: Option<String>,
    pub(super) signature_expiration: Option<String>,
}

/// With a sandbox token, accepts a matching `X-Access-Token` header or else a valid, unexpired
/// signature (envd's order: a header that is present but wrong fails outright).
fn authorize(
    token: Option<&str>,
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: FileOperation,
    now: i64,
) -> Result<(), FilesError> {
    let Some(token) = token else {
        return Ok(());
    };
    if headers.contains_key(airlock_wire::ACCESS_TOKEN_HEADER) {
        return match auth::header_token_ok(headers, Some(token)) {
            true => Ok(()),
            false => Err(FilesError::unauthorized(auth::UNAUTHORIZED_MESSAGE)),
        };
    }
    let Some(given) = query.signature.as_deref() else {
        return Err(FilesError::unauthorized(auth::UNAUTHORIZED_MESSAGE));
    };
    let expiration = query
        .signature_expiration
        .as_deref()
        .map(|e| {
            e.trim()
                .parse::<i64>()
                .map_err(|_| FilesError::bad_request("signature_expiration must be a unix time"))
        })
        .transpose()?;
    let expected = signature(
        query.path.as_deref().unwrap_or_default(),
        operation,
        query.username.as_deref().unwrap_or_default(),
        token,
        query.signature_expiration.as_deref(),
    );
    if !auth::tokens_match(given.as_bytes(), expected.as_bytes()) {
        return Err(FilesError::unauthorized(auth::UNAUTHORIZED_MESSAGE));
    }
    if expiration.is_some_and(|e| e < now) {
        return Err(FilesError::unauthorized("signature is already expired"));
    }
    Ok(())
}

pub(super) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Parses the query, authorizes the request and finds its user.
pub(super) fn admit(
    config: &Config,
    uri: &Uri,
    headers: &HeaderMap,
    operation: FileOperation,
) -> Result<(FilesQuery, User), FilesError> {
    let Query(query) = Query::<FilesQuery>::try_from_uri(uri)
        .map_err(|e| FilesError::bad_request(format!("invalid query: {e}")))?;
    let token = config.current().access_token;
    authorize(token.as_deref(), headers, &query, operation, unix_now())?;
    // An unknown user is `unauthenticated`, hence 401.
    let user = config.named_user(query.username.as_deref())?;
    Ok((query, user))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn query(
        path: &str,
        username: Option<&str>,
        sig: Option<&str>,
        exp: Option<i64>,
    ) -> FilesQuery {
        FilesQuery {
            path: Some(path.into()),
            username: username.map(Into::into),
            signature: sig.map(Into::into),
            signature_expiration: exp.map(|e| e.to_string()),
        }
    }

    #[test]
    fn authorization_rules() {
        let none = HeaderMap::new();
        let unsigned = query("a.txt", None, None, None);
        assert!(authorize(None, &none, &unsigned, FileOperation::Read, 0).is_ok());
        let err = authorize(Some("tok"), &none, &unsigned, FileOperation::Read, 0).unwrap_err();
        assert_eq!(
            (err.status, err.message.as_str()),
            (StatusCode::UNAUTHORIZED, auth::UNAUTHORIZED_MESSAGE)
        );

        let mut good = HeaderMap::new();
        good.insert("x-access-token", "tok".parse().unwrap());
        assert!(authorize(Some("tok"), &good, &unsigned, FileOperation::Read, 0).is_ok());

        let sig = signature("a.txt", FileOperation::Write, "", "tok", None);
        let signed = query("a.txt", None, Some(&sig), None);
        assert!(authorize(Some("tok"), &none, &signed, FileOperation::Write, 0).is_ok());
        // Signed for writing, not reading; and a wrong header beats a good signature.
        assert!(authorize(Some("tok"), &none, &signed, FileOperation::Read, 0).is_err());
        let mut bad = HeaderMap::new();
        bad.insert("x-access-token", "nope".parse().unwrap());
        assert!(authorize(Some("tok"), &bad, &signed, FileOperation::Write, 0).is_err());

        let sig = signature("a.txt", FileOperation::Read, "root", "tok", Some("100"));
        let expiring = query("a.txt", Some("root"), Some(&sig), Some(100));
        assert!(authorize(Some("tok"), &none, &expiring, FileOperation::Read, 100).is_ok());
        let err = authorize(Some("tok"), &none, &expiring, FileOperation::Read, 101).unwrap_err();
        assert_eq!(err.message, "signature is already expired");
        let err = authorize(
            Some("tok"),
            &none,
            &query("b.txt", Some("root"), Some(&sig), Some(100)),
            FileOperation::Read,
            0,
        )
        .unwrap_err();
        assert_eq!(err.message, auth::UNAUTHORIZED_MESSAGE);
    }
}
