//! The files `COPY` steps bring in. For each `COPY`, E2B's SDK asks for an upload link by the
//! hash it computed over the files, and uploads one archive (tar, usually gzipped) there,
//! unless the server says it has it. The link is a one-time URL that carries its own
//! authority (the SDK sends no API key with the upload), like a presigned bucket URL.
//!
//! Archives are kept per template at `{templates_dir}/uploads/{template}/{hash}`: the hash is
//! the SDK's, which the server cannot check, so one template's upload never stands in for
//! another's.

use crate::ids::{random_token, TemplateName};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// How long an upload link stays good (the SDK uploads right after asking).
const TICKET_LIFETIME: Duration = Duration::from_secs(3600);
/// Upload links handed out and not yet used, at most.
const MAX_TICKETS: usize = 10_000;
/// The largest archive one `COPY` may upload.
pub const MAX_UPLOAD_BYTES: u64 = 2 << 30;

pub struct Uploads {
    root: PathBuf,
    tickets: Mutex<HashMap<String, Ticket>>,
}

struct Ticket {
    template: TemplateName,
    hash: String,
    expires: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the upload link is unknown, used or expired: ask for a new one")]
    BadTicket,
    #[error("the archive is larger than the {} MiB a COPY may upload", MAX_UPLOAD_BYTES >> 20)]
    TooLarge,
    #[error("receiving the upload failed: {0}")]
    Receive(std::io::Error),
    #[error("storing the upload failed: {0}")]
    Store(std::io::Error),
}

/// Whether `hash` looks like the SDK's files hash (a SHA-256 in hex): it becomes a file name.
pub fn valid_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Uploads {
    pub fn new(templates_dir: &Path) -> Self {
        Uploads {
            root: templates_dir.join("uploads"),
            tickets: Mutex::default(),
        }
    }

    /// Where every template's archives are, in a directory named by the template's id.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn archive(&self, template: &TemplateName, hash: &str) -> PathBuf {
        self.root.join(template.as_str()).join(hash)
    }

    pub fn has(&self, template: &TemplateName, hash: &str) -> bool {
        self.archive(template, hash).is_file()
    }

    /// A one-time token that lets its bearer upload the archive `hash` of `template`.
    pub fn ticket(&self, template: &TemplateName, hash: &str) -> String {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        tickets.retain(|_, t| t.expires > now);
        if tickets.len() >= MAX_TICKETS {
            // The oldest goes: a flood of link requests cannot grow this without bound.
            if let Some(oldest) = tickets
                .iter()
                .min_by_key(|(_, t)| t.expires)
                .map(|(k, _)| k.clone())
            {
                tickets.remove(&oldest);
            }
        }
        let token = random_token(32);
        tickets.insert(
            token.clone(),
            Ticket {
                template: template.clone(),
                hash: hash.to_owned(),
                expires: now + TICKET_LIFETIME,
            },
        );
        token
    }

    /// Stores the archive the ticket `token` was handed out for, read from `body`. The token
    /// is used up whatever happens. A half-received archive is never kept.
    pub async fn receive(
        &self,
        token: &str,
        body: impl AsyncRead + Unpin,
    ) -> Result<u64, UploadError> {
        let ticket = self
            .tickets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token)
            .filter(|t| t.expires > Instant::now())
            .ok_or(UploadError::BadTicket)?;
        self.put(&ticket.template, &ticket.hash, body).await
    }

    /// Stores `body` as the archive `hash` of `template` (at most the upload cap); never
    /// half-written.
    pub async fn put(
        &self,
        template: &TemplateName,
        hash: &str,
        body: impl AsyncRead + Unpin,
    ) -> Result<u64, UploadError> {
        let target = self.archive(template, hash);
        let dir = target.parent().expect("archives are in a directory");
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(UploadError::Store)?;
        let part = dir.join(format!(".part-{}", random_token(12)));
        let result = write_capped(&part, body).await;
        match result {
            Ok(size) => {
                tokio::fs::rename(&part, &target)
                    .await
                    .map_err(UploadError::Store)?;
                Ok(size)
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(&part).await;
                Err(e)
            }
        }
    }
}

async fn write_capped(part: &Path, body: impl AsyncRead + Unpin) -> Result<u64, UploadError> {
    let mut file = tokio::fs::File::create(part)
        .await
        .map_err(UploadError::Store)?;
    let mut body = body.take(MAX_UPLOAD_BYTES + 1);
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let n = body.read(&mut buf).await.map_err(UploadError::Receive)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        if size > MAX_UPLOAD_BYTES {
            return Err(UploadError::TooLarge);
        }
        file.write_all(&buf[..n])
            .await
            .map_err(UploadError::Store)?;
    }
    file.sync_all().await.map_err(UploadError::Store)?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ticket_uploads_once_and_only_its_own_archive() {
        let dir = tempfile::tempdir().unwrap();
        let uploads = Uploads::new(dir.path());
        let t = TemplateName::parse("tpl").unwrap();
        let hash = "ab".repeat(32);
        assert!(valid_hash(&hash) && !valid_hash("../x") && !valid_hash(&"AB".repeat(32)));
        let token = uploads.ticket(&t, &hash);
        assert!(!uploads.has(&t, &hash));
        assert_eq!(uploads.receive(&token, &b"data"[..]).await.unwrap(), 4);
        assert!(uploads.has(&t, &hash));
        assert_eq!(std::fs::read(uploads.archive(&t, &hash)).unwrap(), b"data");
        assert!(matches!(
            uploads.receive(&token, &b"again"[..]).await,
            Err(UploadError::BadTicket)
        ));
        assert!(matches!(
            uploads.receive("made-up", &b"x"[..]).await,
            Err(UploadError::BadTicket)
        ));
    }
}
