//! The files `COPY` steps bring in. For each `COPY`, E2B's SDK asks for an upload link by the
//! hash it computed over the files, and uploads one archive (tar, usually gzipped) there,
//! unless the server says it has it. The link is a one-time URL that carries its own
//! authority (the SDK sends no API key with the upload), like a presigned bucket URL.
//!
//! The SDK's hash is the client's claim, which the server cannot check, so it only finds an
//! upload again: each archive is kept once under the SHA-256 of the bytes the server received
//! (`{templates_dir}/copy/blobs/{digest}`, never changed once written), and a template's record
//! (`copy/templates/{template}/{files hash}`) says which digest that template's upload had. A
//! `COPY` layer is keyed by that digest, so what a layer holds is what its key says, whoever
//! claimed which hash.

use crate::ids::{random_token, TemplateName};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// How long an upload link stays good (the SDK uploads right after asking).
const TICKET_LIFETIME: Duration = Duration::from_secs(3600);
/// Upload links one key may have handed out and not used; past it, its oldest is dropped
/// (never another key's).
const MAX_TICKETS_PER_KEY: usize = 256;
/// Upload links handed out and not yet used, for all keys together.
const MAX_TICKETS: usize = 10_000;
/// The largest archive one `COPY` may upload.
pub const MAX_UPLOAD_BYTES: u64 = 2 << 30;
/// How often (in bytes written) an upload checks the disk's free space.
const DISK_CHECK_EVERY: u64 = 16 << 20;

pub struct Uploads {
    blobs: PathBuf,
    records: PathBuf,
    /// An upload stops once the disk has less than this free.
    min_free_bytes: u64,
    tickets: Mutex<HashMap<String, Ticket>>,
}

struct Ticket {
    owner: String,
    template: TemplateName,
    hash: String,
    /// The most this upload may bring: the cap, or what is left of its key's storage.
    max_bytes: u64,
    expires: Instant,
}

/// An archive as a build uses it: its digest and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    pub digest: String,
    pub path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the upload link is unknown, used or expired: ask for a new one")]
    BadTicket,
    #[error("the archive is larger than the {} MiB a COPY may upload", MAX_UPLOAD_BYTES >> 20)]
    TooLarge,
    #[error(
        "the archive is larger than the {} MiB left of this API key's template storage \
         (`airlock serve --key-max-template-storage-mb`)",
        .0 >> 20
    )]
    OverQuota(u64),
    #[error("too many upload links are outstanding ({MAX_TICKETS}); try again later")]
    TooManyTickets,
    #[error(
        "the server's disk is nearly full (builds leave {} MiB free, see `airlock serve \
         --build-min-free-mb`): the upload was refused",
        .0 >> 20
    )]
    DiskFull(u64),
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
    pub fn new(templates_dir: &Path, min_free_bytes: u64) -> Self {
        let root = templates_dir.join("copy");
        Uploads {
            blobs: root.join("blobs"),
            records: root.join("templates"),
            min_free_bytes,
            tickets: Mutex::default(),
        }
    }

    /// Where each template's records are, in a directory named by the template's id.
    pub fn records_root(&self) -> &Path {
        &self.records
    }

    pub fn blobs_dir(&self) -> &Path {
        &self.blobs
    }

    fn record(&self, template: &TemplateName, hash: &str) -> PathBuf {
        self.records.join(template.as_str()).join(hash)
    }

    /// The archive `template` uploaded under the SDK's `hash`, if it has one.
    pub fn archive(&self, template: &TemplateName, hash: &str) -> Option<Archive> {
        let digest = std::fs::read_to_string(self.record(template, hash)).ok()?;
        let digest = digest.trim();
        let path = self.blobs.join(digest);
        (valid_hash(digest) && path.is_file()).then(|| Archive {
            digest: digest.to_owned(),
            path,
        })
    }

    pub fn has(&self, template: &TemplateName, hash: &str) -> bool {
        self.archive(template, hash).is_some()
    }

    /// The bytes the archives of `templates` take, each archive counted once.
    pub fn bytes_of(&self, templates: &[TemplateName]) -> u64 {
        let mut digests = HashSet::new();
        for template in templates {
            let Ok(entries) = std::fs::read_dir(self.records.join(template.as_str())) else {
                continue;
            };
            for entry in entries.flatten() {
                let hash = entry.file_name();
                if let Some(archive) = self.archive(template, &hash.to_string_lossy()) {
                    digests.insert(archive.digest);
                }
            }
        }
        let size = |d: &String| std::fs::metadata(self.blobs.join(d)).map_or(0, |m| m.len());
        digests.iter().map(size).sum()
    }

    /// A one-time token that lets its bearer upload the archive `hash` of `owner`'s
    /// `template`, of at most `max_bytes` (never more than [`MAX_UPLOAD_BYTES`]).
    pub fn ticket(
        &self,
        owner: &str,
        template: &TemplateName,
        hash: &str,
        max_bytes: u64,
    ) -> Result<String, UploadError> {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        tickets.retain(|_, t| t.expires > now);
        let own = || tickets.iter().filter(|(_, t)| t.owner == owner);
        if own().count() >= MAX_TICKETS_PER_KEY {
            // The key's own oldest goes: its flood of link requests touches no other key's.
            let oldest = own().min_by_key(|(_, t)| t.expires).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                tickets.remove(&oldest);
            }
        }
        if tickets.len() >= MAX_TICKETS {
            return Err(UploadError::TooManyTickets);
        }
        let token = random_token(32);
        tickets.insert(
            token.clone(),
            Ticket {
                owner: owner.to_owned(),
                template: template.clone(),
                hash: hash.to_owned(),
                max_bytes: max_bytes.min(MAX_UPLOAD_BYTES),
                expires: now + TICKET_LIFETIME,
            },
        );
        Ok(token)
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
        let cap = Cap {
            bytes: ticket.max_bytes,
            over: if ticket.max_bytes < MAX_UPLOAD_BYTES {
                UploadError::OverQuota
            } else {
                |_| UploadError::TooLarge
            },
        };
        self.put_capped(&ticket.template, &ticket.hash, body, cap)
            .await
    }

    /// Stores `body` as the archive `hash` of `template` (at most the upload cap); never
    /// half-written.
    pub async fn put(
        &self,
        template: &TemplateName,
        hash: &str,
        body: impl AsyncRead + Unpin,
    ) -> Result<u64, UploadError> {
        let cap = Cap {
            bytes: MAX_UPLOAD_BYTES,
            over: |_| UploadError::TooLarge,
        };
        self.put_capped(template, hash, body, cap).await
    }

    async fn put_capped(
        &self,
        template: &TemplateName,
        hash: &str,
        body: impl AsyncRead + Unpin,
        cap: Cap,
    ) -> Result<u64, UploadError> {
        tokio::fs::create_dir_all(&self.blobs)
            .await
            .map_err(UploadError::Store)?;
        let part = self.blobs.join(format!(".part-{}", random_token(12)));
        let written = self.write_capped(&part, body, &cap).await;
        let (size, digest) = match written {
            Ok(done) => done,
            Err(e) => {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(e);
            }
        };
        let blob = self.blobs.join(&digest);
        // The same bytes may be there already: they are the same archive.
        let kept = if blob.is_file() {
            tokio::fs::remove_file(&part).await
        } else {
            tokio::fs::rename(&part, &blob).await
        };
        kept.map_err(UploadError::Store)?;
        let record = self.record(template, hash);
        let dir = record.parent().expect("records are in a directory");
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(UploadError::Store)?;
        let fresh = dir.join(format!(".part-{}", random_token(12)));
        tokio::fs::write(&fresh, format!("{digest}\n"))
            .await
            .map_err(UploadError::Store)?;
        tokio::fs::rename(&fresh, &record)
            .await
            .map_err(UploadError::Store)?;
        Ok(size)
    }

    /// Writes `body` to `part`, at most `cap.bytes`, while the disk keeps its reserve; returns
    /// its size and SHA-256.
    async fn write_capped(
        &self,
        part: &Path,
        body: impl AsyncRead + Unpin,
        cap: &Cap,
    ) -> Result<(u64, String), UploadError> {
        self.check_disk()?;
        let mut file = tokio::fs::File::create(part)
            .await
            .map_err(UploadError::Store)?;
        let mut body = body.take(cap.bytes + 1);
        let mut buf = vec![0u8; 256 * 1024];
        let (mut size, mut checked) = (0u64, 0u64);
        let mut digest = Sha256::new();
        loop {
            let n = body.read(&mut buf).await.map_err(UploadError::Receive)?;
            if n == 0 {
                break;
            }
            size += n as u64;
            if size > cap.bytes {
                return Err((cap.over)(cap.bytes));
            }
            if size - checked > DISK_CHECK_EVERY {
                self.check_disk()?;
                checked = size;
            }
            digest.update(&buf[..n]);
            file.write_all(&buf[..n])
                .await
                .map_err(UploadError::Store)?;
        }
        file.sync_all().await.map_err(UploadError::Store)?;
        Ok((size, hex::encode(digest.finalize())))
    }

    /// Refuses once the disk the archives are on has less than the builds' reserve free.
    fn check_disk(&self) -> Result<(), UploadError> {
        let dir = self.blobs.parent().unwrap_or(&self.blobs);
        match crate::disk_usage::disk_space(dir) {
            Some(space) if space.available < self.min_free_bytes => {
                Err(UploadError::DiskFull(self.min_free_bytes))
            }
            _ => Ok(()),
        }
    }
}

/// How much an upload may bring, and the error past it.
struct Cap {
    bytes: u64,
    over: fn(u64) -> UploadError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ticket_uploads_once_and_the_archive_is_filed_by_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let uploads = Uploads::new(dir.path(), 0);
        let t = TemplateName::parse("tpl").unwrap();
        let hash = "ab".repeat(32);
        assert!(valid_hash(&hash) && !valid_hash("../x") && !valid_hash(&"AB".repeat(32)));
        let token = uploads.ticket("k1", &t, &hash, u64::MAX).unwrap();
        assert!(!uploads.has(&t, &hash));
        assert_eq!(uploads.receive(&token, &b"data"[..]).await.unwrap(), 4);
        let archive = uploads.archive(&t, &hash).unwrap();
        assert_eq!(archive.digest, hex::encode(Sha256::digest(b"data")));
        assert_eq!(std::fs::read(&archive.path).unwrap(), b"data");
        assert_eq!(uploads.bytes_of(std::slice::from_ref(&t)), 4);
        assert!(matches!(
            uploads.receive(&token, &b"again"[..]).await,
            Err(UploadError::BadTicket)
        ));
        assert!(matches!(
            uploads.receive("made-up", &b"x"[..]).await,
            Err(UploadError::BadTicket)
        ));
        // The same claimed hash with other bytes is another archive; the first is unchanged.
        let other = TemplateName::parse("other").unwrap();
        uploads.put(&other, &hash, &b"evil"[..]).await.unwrap();
        assert_ne!(
            uploads.archive(&other, &hash).unwrap().digest,
            archive.digest
        );
        assert_eq!(std::fs::read(&archive.path).unwrap(), b"data");
    }

    #[tokio::test]
    async fn a_ticket_brings_no_more_than_its_allowance() {
        let dir = tempfile::tempdir().unwrap();
        let uploads = Uploads::new(dir.path(), 0);
        let t = TemplateName::parse("tpl").unwrap();
        let token = uploads.ticket("k1", &t, &"ab".repeat(32), 3).unwrap();
        let refused = uploads.receive(&token, &b"four"[..]).await;
        assert!(
            matches!(refused, Err(UploadError::OverQuota(3))),
            "{refused:?}"
        );
        assert!(!uploads.has(&t, &"ab".repeat(32)));
    }

    #[test]
    fn one_keys_flood_of_links_drops_only_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let uploads = Uploads::new(dir.path(), 0);
        let t = TemplateName::parse("tpl").unwrap();
        let victims = uploads.ticket("victim", &t, &"ab".repeat(32), 1).unwrap();
        for _ in 0..MAX_TICKETS_PER_KEY * 2 {
            uploads.ticket("flood", &t, &"cd".repeat(32), 1).unwrap();
        }
        let tickets = uploads.tickets.lock().unwrap();
        assert!(tickets.contains_key(&victims));
        assert_eq!(tickets.len(), MAX_TICKETS_PER_KEY + 1);
    }
}
