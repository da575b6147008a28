//! The HTTP edge's error: every failure leaves as E2B's `{code, message}` JSON with its status.

use airlock_core::lifecycle::LifecycleError;
use airlock_wire::api::ErrorBody;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds the client should wait before it tries again (`Retry-After`), when the server
    /// knows.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

impl From<airlock_request::Rejection> for ApiError {
    fn from(r: airlock_request::Rejection) -> Self {
        ApiError::new(r.status, r.message)
    }
}

impl From<airlock_core::store::StoreError> for ApiError {
    fn from(err: airlock_core::store::StoreError) -> Self {
        LifecycleError::from(err).into()
    }
}

impl From<airlock_core::build::uploads::UploadError> for ApiError {
    fn from(err: airlock_core::build::uploads::UploadError) -> Self {
        use airlock_core::build::uploads::UploadError;
        let status = match &err {
            UploadError::BadTicket => StatusCode::FORBIDDEN,
            UploadError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            UploadError::OverQuota(_) | UploadError::DiskFull(_) => {
                StatusCode::INSUFFICIENT_STORAGE
            }
            UploadError::TooManyTickets => StatusCode::TOO_MANY_REQUESTS,
            UploadError::Receive(_) => StatusCode::BAD_REQUEST,
            UploadError::Store(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                StatusCode::INSUFFICIENT_STORAGE
            }
            UploadError::Store(_) => {
                tracing::error!(error = %err, "storing an upload failed");
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "storing the upload failed; see the server log",
                );
            }
        };
        ApiError::new(status, err.to_string())
    }
}

impl From<airlock_core::build::queue::TooManyBuilds> for ApiError {
    fn from(err: airlock_core::build::queue::TooManyBuilds) -> Self {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, err.to_string())
    }
}

impl From<airlock_core::build::BuildError> for ApiError {
    fn from(err: airlock_core::build::BuildError) -> Self {
        match err {
            airlock_core::build::BuildError::Store(e) => e.into(),
            other => {
                tracing::error!(error = %other, "a template build's bookkeeping failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error; see the server log",
                )
            }
        }
    }
}

impl From<LifecycleError> for ApiError {
    fn from(err: LifecycleError) -> Self {
        let err = match err {
            LifecycleError::Volume(err) => return err.into(),
            LifecycleError::Overloaded { retry_after_secs } => {
                return ApiError {
                    retry_after: Some(retry_after_secs),
                    ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, err.to_string())
                }
            }
            other => other,
        };
        let status = match &err {
            LifecycleError::TemplateNotFound(_) | LifecycleError::SandboxNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            LifecycleError::Capacity(_) | LifecycleError::Quota(_) => StatusCode::TOO_MANY_REQUESTS,
            LifecycleError::TimeoutTooLong { .. }
            | LifecycleError::BadSnapshotName(_)
            | LifecycleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            LifecycleError::AlreadyPaused(_)
            | LifecycleError::AlreadyRunning(_)
            | LifecycleError::Busy(_) => StatusCode::CONFLICT,
            // Says what is full and how much is needed; nothing in it is secret.
            LifecycleError::GuestUnresponsive(_)
            | LifecycleError::Draining(_)
            | LifecycleError::TemplateFilesUnavailable
            | LifecycleError::SnapshotUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            // Names only the sandbox, and what its owner can do.
            LifecycleError::ImageGone(_) => {
                return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
            }
            // The same; the store's own error is in the log only.
            LifecycleError::ImageUnavailable(_) => {
                return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string());
            }
            LifecycleError::NoSpace(_) => {
                tracing::warn!(error = %err, "checkpoint refused");
                return ApiError::new(StatusCode::INSUFFICIENT_STORAGE, err.to_string());
            }
            // The template's own command and its output, from inside the sandbox.
            LifecycleError::StartCommand(_) => {
                tracing::warn!(error = %err, "a template's start command failed");
                return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string());
            }
            LifecycleError::Store(e) if e.is_unavailable() => {
                tracing::warn!(error = %err, "the database is unreachable");
                return ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database cannot be reached; retry shortly",
                );
            }
            LifecycleError::Driver(_) | LifecycleError::Agent(_) | LifecycleError::Store(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            LifecycleError::Volume(_) | LifecycleError::Overloaded { .. } => {
                unreachable!("answered above")
            }
        };
        if status.is_server_error() {
            // The full cause chain (which may name host paths) goes to the log, not the client.
            let mut chain = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(s) = source {
                chain.push_str(": ");
                chain.push_str(&s.to_string());
                source = s.source();
            }
            tracing::error!(error = %chain, "request failed");
            let message = match err {
                LifecycleError::Agent(_) => "the sandbox's agent did not start; see the server log",
                LifecycleError::Driver(_) => "the sandbox runtime failed; see the server log",
                _ => "internal error; see the server log",
            };
            return ApiError::new(status, message);
        }
        ApiError::new(status, err.to_string())
    }
}

impl From<airlock_core::volumes::VolumeError> for ApiError {
    fn from(err: airlock_core::volumes::VolumeError) -> Self {
        use airlock_core::volumes::VolumeError;
        let status = match &err {
            VolumeError::NotFound(_) | VolumeError::PathNotFound(_) => StatusCode::NOT_FOUND,
            VolumeError::NameTaken(_)
            | VolumeError::Exists(_)
            | VolumeError::InUse { .. }
            | VolumeError::Elsewhere { .. } => StatusCode::CONFLICT,
            VolumeError::BadName(_) | VolumeError::BadPath(_) => StatusCode::BAD_REQUEST,
            VolumeError::Unauthorized => StatusCode::UNAUTHORIZED,
            VolumeError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            VolumeError::Full(_) | VolumeError::KeyFull { .. } => StatusCode::INSUFFICIENT_STORAGE,
            VolumeError::NoDisk { .. } => {
                tracing::warn!(error = %err, "a volume create found too little disk");
                StatusCode::INSUFFICIENT_STORAGE
            }
            VolumeError::Moving { name, .. } => {
                // Its detail may name host paths: the log gets it, the client does not.
                tracing::warn!(error = %err, "a moved volume could not be taken in");
                return ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "volume '{name}' is moving between nodes and could not be brought \
                         here now; try again"
                    ),
                );
            }
            VolumeError::Store(_) | VolumeError::Io { .. } | VolumeError::Driver(_) => {
                // Names host paths: the log gets it, the client does not.
                tracing::error!(error = %err, "a volume request failed");
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error; see the server log",
                );
            }
        };
        ApiError::new(status, err.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(ErrorBody {
                code: self.status.as_u16(),
                message: self.message,
            }),
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}
