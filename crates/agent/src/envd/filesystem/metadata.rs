//! Users' metadata on files (envd 0.6.2): each `X-Metadata-<key>: <value>` header of an upload
//! becomes a `user.e2b.<key>` extended attribute of the written file, and every entry's info
//! shows the file's `user.e2b.*` attributes, set through the API or not. An upload replaces the
//! whole set (one without metadata clears it); other attributes are left alone.

use axum::http::HeaderMap;
use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use xattr::FileExt;

pub type Metadata = BTreeMap<String, String>;

const XATTR_PREFIX: &str = "user.e2b.";
/// Header names arrive lowercased.
const HEADER_PREFIX: &str = "x-metadata-";
/// Linux's longest attribute name is 255 bytes, its prefix included.
const MAX_KEY: usize = 255 - XATTR_PREFIX.len();
/// Linux's largest attribute value.
const MAX_VALUE: usize = 64 * 1024;

/// The metadata an upload's headers carry, keys lowercased; the first of repeated headers wins.
pub fn from_headers(headers: &HeaderMap) -> Result<Metadata, String> {
    let mut metadata = Metadata::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) else {
            continue;
        };
        if key.is_empty() || metadata.contains_key(key) {
            continue;
        }
        if key.len() > MAX_KEY {
            return Err(format!(
                "invalid metadata key {key:?}: longer than {MAX_KEY} bytes"
            ));
        }
        let value = value
            .to_str()
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..=0x7e).contains(&b)))
            .ok_or_else(|| {
                format!("invalid metadata value for key {key:?}: use printable US-ASCII only")
            })?;
        if value.len() > MAX_VALUE {
            return Err(format!(
                "invalid metadata value for key {key:?}: longer than {MAX_VALUE} bytes"
            ));
        }
        metadata.insert(key.to_owned(), value.to_owned());
    }
    Ok(metadata)
}

/// Makes `metadata` the file's whole set. A filesystem without extended attributes (`/proc`)
/// keeps none, as envd's does.
pub fn replace(file: &std::fs::File, metadata: &Metadata) -> io::Result<()> {
    let result = (|| -> io::Result<()> {
        for name in file.list_xattr()? {
            let stale = name
                .to_str()
                .and_then(|n| n.strip_prefix(XATTR_PREFIX))
                .is_some_and(|key| !metadata.contains_key(key));
            if stale {
                file.remove_xattr(&name)?;
            }
        }
        for (key, value) in metadata {
            file.set_xattr(format!("{XATTR_PREFIX}{key}"), value.as_bytes())?;
        }
        Ok(())
    })();
    match result {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
        other => other,
    }
}

/// The `user.e2b.*` attributes of `path` (of its target, for a symlink); none if they cannot be
/// read.
pub fn read(path: &Path) -> Metadata {
    let Ok(names) = xattr::list_deref(path) else {
        return Metadata::new();
    };
    names
        .filter_map(|name| {
            let key = name.to_str()?.strip_prefix(XATTR_PREFIX)?.to_owned();
            let value = xattr::get_deref(path, &name).ok()??;
            Some((key, String::from_utf8_lossy(&value).into_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn headers_become_metadata() {
        let mut headers = HeaderMap::new();
        headers.insert("X-Metadata-Author", HeaderValue::from_static("Ada L."));
        headers.insert("x-metadata-empty", HeaderValue::from_static(""));
        headers.insert("x-metadata-", HeaderValue::from_static("ignored"));
        headers.insert("x-other", HeaderValue::from_static("ignored"));
        let metadata = from_headers(&headers).unwrap();
        assert_eq!(
            metadata,
            Metadata::from([
                ("author".into(), "Ada L.".into()),
                ("empty".into(), "".into())
            ])
        );
        headers.insert(
            "x-metadata-bad",
            HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        assert!(from_headers(&headers).unwrap_err().contains("\"bad\""));
    }

    #[test]
    fn a_write_replaces_the_set_and_keeps_other_attributes() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        let first = Metadata::from([("a".into(), "1".into()), ("b".into(), "2".into())]);
        if let Err(e) = replace(&file, &first) {
            // The host's filesystem may not take user attributes (the sandbox's does).
            assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP));
            return;
        }
        file.set_xattr("user.other", b"kept").unwrap();
        assert_eq!(read(&path), first);
        let second = Metadata::from([("b".into(), "3".into())]);
        replace(&file, &second).unwrap();
        assert_eq!(read(&path), second);
        replace(&file, &Metadata::new()).unwrap();
        assert!(read(&path).is_empty());
        assert_eq!(file.get_xattr("user.other").unwrap().unwrap(), b"kept");
    }
}
