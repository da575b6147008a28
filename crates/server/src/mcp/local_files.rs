//! `local_path` in `upload` and `download` over stdio: files of the user's own machine. The
//! model names them (or a prompt injected into it, by a web page or a file it read), so they
//! are kept to one directory: `airlock mcp --files-dir DIR`, by default the directory it was
//! started in. A path outside it, through `..` or through a symlink that leads out, is refused.
//! The one default refused whole is `/` (where some clients start their servers), which would
//! confine nothing.

use std::io;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LocalPathError {
    #[error(
        "{given} is outside {root}, the one directory local_path may name (`airlock mcp \
         --files-dir`)"
    )]
    Outside { given: String, root: String },
    #[error("local_path {given}: {source}")]
    Io { given: String, source: io::Error },
    #[error("local_path {0} names no file in it")]
    NoFileName(String),
    #[error(
        "local_path is off: `airlock mcp` was started in /, which would give the model every \
         file of this machine; start it with --files-dir DIR"
    )]
    Off,
    #[error("--files-dir {dir}: {source}")]
    BadDir { dir: String, source: io::Error },
}

/// The directory local paths are kept to (its canonical path), or none.
pub struct FilesDir(Option<PathBuf>);

impl FilesDir {
    /// `dir` if given (it must exist), else the current directory, unless that is `/`.
    pub fn new(dir: Option<PathBuf>) -> Result<Self, LocalPathError> {
        let explicit = dir.is_some();
        let dir = match dir {
            Some(dir) => dir,
            None => std::env::current_dir().map_err(|source| LocalPathError::BadDir {
                dir: ".".into(),
                source,
            })?,
        };
        let root = dir
            .canonicalize()
            .and_then(|root| match root.is_dir() {
                true => Ok(root),
                false => Err(io::Error::other("not a directory")),
            })
            .map_err(|source| LocalPathError::BadDir {
                dir: dir.display().to_string(),
                source,
            })?;
        Ok(FilesDir(
            (explicit || root != Path::new("/")).then_some(root),
        ))
    }

    fn root(&self) -> Result<&Path, LocalPathError> {
        self.0.as_deref().ok_or(LocalPathError::Off)
    }

    /// An existing file to send, with every symlink on the way resolved.
    pub fn source(&self, given: &str) -> Result<PathBuf, LocalPathError> {
        let root = self.root()?;
        let path = root
            .join(given)
            .canonicalize()
            .map_err(|source| io_error(given, source))?;
        inside(root, path, given)
    }

    /// Where to save a file: its directory must exist, and a file already there that is a
    /// symlink must lead to a place inside too.
    pub fn target(&self, given: &str) -> Result<PathBuf, LocalPathError> {
        let root = self.root()?;
        let path = root.join(given);
        let (Some(parent), Some(Component::Normal(name))) =
            (path.parent(), path.components().next_back())
        else {
            return Err(LocalPathError::NoFileName(given.into()));
        };
        let parent = parent
            .canonicalize()
            .map_err(|source| io_error(given, source))?;
        let path = inside(root, parent, given)?.join(name);
        if path.symlink_metadata().is_ok() {
            let resolved = path
                .canonicalize()
                .map_err(|source| io_error(given, source))?;
            inside(root, resolved, given)?;
        }
        Ok(path)
    }
}

fn inside(root: &Path, path: PathBuf, given: &str) -> Result<PathBuf, LocalPathError> {
    if path.starts_with(root) {
        return Ok(path);
    }
    Err(LocalPathError::Outside {
        given: given.into(),
        root: root.display().to_string(),
    })
}

fn io_error(given: &str, source: io::Error) -> LocalPathError {
    LocalPathError::Io {
        given: given.into(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_in_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("files");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.csv"), "x").unwrap();
        std::fs::write(tmp.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("sub/up")).unwrap();
        let dir = FilesDir::new(Some(root.clone())).unwrap();
        let root = root.canonicalize().unwrap();

        assert_eq!(dir.source("a.csv").unwrap(), root.join("a.csv"));
        assert_eq!(dir.source("sub/../a.csv").unwrap(), root.join("a.csv"));
        let absolute = root.join("a.csv");
        assert_eq!(dir.source(absolute.to_str().unwrap()).unwrap(), absolute);
        for outside in ["../secret", "link", "sub/up/secret", "/etc/passwd"] {
            let e = dir.source(outside).unwrap_err();
            assert!(
                matches!(e, LocalPathError::Outside { .. }),
                "{outside}: {e}"
            );
        }

        assert_eq!(dir.target("sub/new.txt").unwrap(), root.join("sub/new.txt"));
        for outside in ["../planted", "link", "sub/up/planted", "/tmp/planted"] {
            let e = dir.target(outside).unwrap_err();
            assert!(
                matches!(e, LocalPathError::Outside { .. }),
                "{outside}: {e}"
            );
        }
        assert!(matches!(
            dir.target("sub/.."),
            Err(LocalPathError::NoFileName(_))
        ));
        assert!(matches!(
            dir.target("nosuchdir/x"),
            Err(LocalPathError::Io { .. })
        ));
    }

    #[test]
    fn the_root_as_default_is_off() {
        let off = FilesDir(None);
        assert!(matches!(off.source("a"), Err(LocalPathError::Off)));
        assert!(FilesDir::new(Some("/".into())).unwrap().0.is_some());
        assert!(FilesDir::new(Some("/no/such/dir".into())).is_err());
    }
}
