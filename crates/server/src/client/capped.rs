//! Reading an answer that a sandbox controls (its agent's, directly or through the proxy) into
//! memory: only up to a cap, since the sandbox may answer without end. Past the cap the read
//! stops (the body is dropped, which closes its connection) with an error that names the cap;
//! of an error answer, the start is kept for its message and the rest is not read.

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;

/// The most a JSON answer of an agent may take.
pub const MAX_JSON: usize = 4 << 20;
/// What is kept of an error answer, for its message.
pub const MAX_ERROR: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum CappedError {
    #[error("{what} is larger than {} MiB, more than is read of it", .cap >> 20)]
    TooLarge { what: String, cap: usize },
    #[error("reading {what}: {detail}")]
    Broken { what: String, detail: String },
}

/// The whole body, if it is at most `cap` bytes; `what` names it in the error.
pub async fn read<B>(body: B, cap: usize, what: &str) -> Result<Bytes, CappedError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (kept, whole) = read_up_to(body, cap, what).await?;
    match whole {
        true => Ok(kept),
        false => Err(CappedError::TooLarge {
            what: what.into(),
            cap,
        }),
    }
}

/// The start of an error answer ([`MAX_ERROR`] at most), for its message; a broken body
/// gives what came before the break.
pub async fn error_text<B>(body: B) -> Bytes
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    match read_up_to(body, MAX_ERROR, "an error answer").await {
        Ok((kept, _)) => kept,
        Err(_) => Bytes::new(),
    }
}

/// At most `cap` bytes of the body, and whether that was all of it.
async fn read_up_to<B>(mut body: B, cap: usize, what: &str) -> Result<(Bytes, bool), CappedError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut kept = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| CappedError::Broken {
            what: what.into(),
            detail: e.to_string(),
        })?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        if kept.len() + data.len() > cap {
            kept.extend_from_slice(&data[..cap - kept.len()]);
            return Ok((kept.into(), false));
        }
        kept.extend_from_slice(data);
    }
    Ok((kept.into(), true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    /// A body of `n` chunks of 64 KiB, with no end when `n` is `None`.
    fn chunks(
        n: Option<usize>,
    ) -> impl Body<Data = Bytes, Error = std::convert::Infallible> + Unpin {
        let chunk = Bytes::from(vec![b'x'; 64 << 10]);
        let frames = std::iter::repeat_n(chunk, n.unwrap_or(usize::MAX))
            .map(|c| Ok(http_body::Frame::data(c)));
        StreamBody::new(futures::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_body_past_its_cap_is_refused_and_read_no_further() {
        let whole = read(chunks(Some(16)), 1 << 20, "a listing").await.unwrap();
        assert_eq!(whole.len(), 1 << 20);
        let err = read(chunks(None), 1 << 20, "a listing").await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "a listing is larger than 1 MiB, more than is read of it"
        );
        assert_eq!(error_text(chunks(None)).await.len(), MAX_ERROR);
        let short = Full::new(Bytes::from_static(b"not found"));
        assert_eq!(error_text(short).await, "not found");
    }
}
