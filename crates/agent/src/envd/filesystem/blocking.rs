//! What every filesystem RPC does with its work: runs it off the async runtime, and answers its
//! errors as Connect errors naming the path.

use crate::rpc::RpcError;
use std::io;
use std::path::Path;

/// Runs blocking filesystem work off the async runtime.
pub(super) async fn blocking<T, F>(work: F) -> Result<T, RpcError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, RpcError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RpcError::internal(format!("filesystem task failed: {e}")))?
}

pub(super) fn io_error(err: &io::Error, path: &Path) -> RpcError {
    RpcError::from_io(err, &path.to_string_lossy())
}
