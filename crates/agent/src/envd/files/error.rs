//! A `/files` failure, answered as `{"code": <status>, "message": ...}`, which the SDK turns into
//! its exceptions.

use crate::rpc::RpcError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::io;
use std::path::Path;

/// A `/files` failure, answered as `{"code": <status>, "message": ...}`.
#[derive(Debug)]
pub(super) struct FilesError {
    pub(super) status: StatusCode,
    pub(super) message: String,
}

impl FilesError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        FilesError {
            status,
            message: message.into(),
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(super) fn io(err: &io::Error, path: &Path) -> Self {
        let status = if is_no_space(err) {
            StatusCode::INSUFFICIENT_STORAGE
        } else if err.raw_os_error() == Some(libc::ENAMETOOLONG) {
            StatusCode::BAD_REQUEST
        } else {
            match err.kind() {
                io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
                io::ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
                io::ErrorKind::NotADirectory
                | io::ErrorKind::IsADirectory
                | io::ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            }
        };
        Self::new(status, format!("{}: {err}", path.display()))
    }

    pub(super) fn unauthorized(message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
}

impl From<RpcError> for FilesError {
    fn from(err: RpcError) -> Self {
        let status = StatusCode::from_u16(err.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        FilesError::new(status, err.0.message)
    }
}

impl IntoResponse for FilesError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

pub(super) fn is_no_space(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::StorageFull
        || matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}
