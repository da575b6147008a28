//! Volume paths as the content API and mounts take them, and the caps on them. The caps keep a
//! request's work bounded (a path of 8,000 parts once made 8,000 directories in one request)
//! and stay within what Linux itself accepts (`PATH_MAX`, `NAME_MAX`).

use super::VolumeError;

/// Longest path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest part of a path, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Most parts in a path, and the deepest listing: far deeper than real trees go
/// (`node_modules` nests some 20 levels), and a bound on a request's open directories.
pub const MAX_DEPTH: usize = 128;

/// Refuses `path` (a `what`, split into `parts`) if it is beyond a cap, naming the cap.
pub(super) fn check_caps(what: &str, path: &str, parts: &[&str]) -> Result<(), VolumeError> {
    let refuse = |cap: String| Err(VolumeError::BadPath(format!("a {what} may be {cap}")));
    if parts.len() > MAX_DEPTH {
        return refuse(format!(
            "at most {MAX_DEPTH} levels deep (this one has {})",
            parts.len()
        ));
    }
    if path.len() > MAX_PATH_BYTES {
        return refuse(format!(
            "at most {MAX_PATH_BYTES} bytes long (this one has {})",
            path.len()
        ));
    }
    if parts.iter().any(|p| p.len() > MAX_NAME_BYTES) {
        return refuse(format!(
            "made of parts at most {MAX_NAME_BYTES} bytes long each"
        ));
    }
    Ok(())
}

/// A volume path split into its components; `..` is refused rather than resolved.
pub(super) struct VolumePath<'a> {
    pub(super) parts: Vec<&'a str>,
}

impl<'a> VolumePath<'a> {
    pub(super) fn parse(path: &'a str) -> Result<Self, VolumeError> {
        if path.contains('\0') {
            return Err(VolumeError::BadPath("a volume path cannot hold NUL".into()));
        }
        let parts: Vec<&str> = path
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        check_caps("volume path", path, &parts)?;
        if parts.contains(&"..") {
            return Err(VolumeError::BadPath(format!(
                "'{path}': '..' is not allowed in volume paths"
            )));
        }
        Ok(VolumePath { parts })
    }

    pub(super) fn display(&self) -> String {
        format!("/{}", self.parts.join("/"))
    }

    /// The path from the volume's root, `.` for the root itself.
    pub(super) fn relative(&self) -> String {
        match self.parts.is_empty() {
            true => ".".to_owned(),
            false => self.parts.join("/"),
        }
    }

    /// The parent's components (relative, `.` for the root) and the last one; `None` for the
    /// root itself.
    pub(super) fn split_last(&self) -> Option<(String, &'a str)> {
        let (last, parent) = self.parts.split_last()?;
        let parent = VolumePath {
            parts: parent.to_vec(),
        };
        Some((parent.relative(), *last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_split_and_dot_dot_is_refused() {
        let parts = |p: &str| VolumePath::parse(p).map(|v| v.display());
        assert_eq!(parts("a/./b//c/").unwrap(), "/a/b/c");
        assert_eq!(parts("").unwrap(), "/");
        assert!(parts("a/../b").is_err());
        assert!(parts("a\0b").is_err());
        let parsed = VolumePath::parse("/x/y").unwrap();
        assert_eq!(parsed.split_last(), Some(("x".to_owned(), "y")));
        assert_eq!(
            VolumePath::parse("y").unwrap().split_last(),
            Some((".".to_owned(), "y"))
        );
    }

    #[test]
    fn paths_beyond_the_caps_are_refused_naming_the_cap() {
        let refused = |p: &str| match VolumePath::parse(p) {
            Err(VolumeError::BadPath(why)) => why,
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a path of {} bytes was taken", p.len()),
        };
        assert!(refused(&"a/".repeat(8000)).contains("128 levels"));
        assert!(refused(&"a/".repeat(MAX_DEPTH + 1)).contains("128 levels"));
        assert!(refused(&"n".repeat(MAX_NAME_BYTES + 1)).contains("255 bytes"));
        // Up to the caps is fine; empty parts and `.` do not count.
        assert!(VolumePath::parse(&"a/".repeat(MAX_DEPTH)).is_ok());
        assert!(VolumePath::parse(&"a/./".repeat(MAX_DEPTH)).is_ok());
        assert!(VolumePath::parse(&"n".repeat(MAX_NAME_BYTES)).is_ok());
        let longest = format!("/{}", vec!["n".repeat(MAX_NAME_BYTES); 16].join("/"));
        assert_eq!(longest.len(), MAX_PATH_BYTES);
        assert!(VolumePath::parse(&longest).is_ok());
        assert!(refused(&format!("{longest}/")).contains("4096 bytes"));
    }
}
