//! Entries as envd describes them (Stat, ListDir, watchers' events), and the directories an
//! operation creates for its user.

use airlock_wire::envd::{EntryInfo, FileType};
use chrono::{DateTime, SecondsFormat};
use std::collections::HashMap;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

/// Describes `path` itself (symlinks are not followed), as Stat reports it.
pub(crate) fn entry_info(path: &Path, names: &IdNames) -> io::Result<EntryInfo> {
    let md = fs::symlink_metadata(path)?;
    Ok(build_entry(path, &md, names))
}

/// Creates `dir` and any missing parents (mode 0755), each new one owned by `uid:gid`.
/// Existing directories are left alone; an existing non-directory on the way is an error.
pub(crate) fn ensure_dirs(dir: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut current = Some(dir);
    while let Some(path) = current {
        match fs::metadata(path) {
            Ok(md) if md.is_dir() => break,
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(path),
            Err(e) => return Err(e),
        }
        current = path.parent();
    }
    for path in missing.into_iter().rev() {
        match fs::DirBuilder::new().mode(0o755).create(path) {
            Ok(()) => std::os::unix::fs::chown(path, Some(uid), Some(gid))?,
            // Someone else created it meanwhile; fine as long as it is a directory.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What envd 0.6 reports: for a symlink, its target's type and permission bits (unspecified
/// when it dangles) with `is_symlink` set; the link's own permission string, size and owner.
pub(super) fn build_entry(path: &Path, md: &Metadata, names: &IdNames) -> EntryInfo {
    let ft = md.file_type();
    let kind = |ft: fs::FileType| {
        if ft.is_dir() {
            FileType::Directory
        } else if ft.is_file() {
            FileType::File
        } else {
            FileType::Unspecified
        }
    };
    let (file_type, mode) = if ft.is_symlink() {
        match fs::metadata(path) {
            Ok(target) => (kind(target.file_type()), target.mode()),
            Err(_) => (FileType::Unspecified, md.mode()),
        }
    } else {
        (kind(ft), md.mode())
    };
    let symlink_target = ft.is_symlink().then(|| {
        // envd reports the fully resolved target; a dangling link falls back to its raw text.
        fs::canonicalize(path)
            .or_else(|_| fs::read_link(path))
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    EntryInfo {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        file_type,
        path: path.to_string_lossy().into_owned(),
        size: i64::try_from(md.len()).unwrap_or(i64::MAX),
        mode: mode & 0o777,
        permissions: go_mode_string(md.mode()),
        owner: names.user(md.uid()),
        group: names.group(md.gid()),
        modified_time: DateTime::from_timestamp(
            md.mtime(),
            md.mtime_nsec().try_into().unwrap_or(0),
        )
        .map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
        symlink_target,
        metadata: crate::envd::filesystem::metadata::read(path),
        is_symlink: ft.is_symlink(),
    }
}

/// Go's `os.FileMode.String()` for a Unix `st_mode`: the type and flag letters Go sets for it
/// (in Go's order `dalTLDpSugct?`; `a`, `l`, `T` and `?` never come from a Linux stat), or `-`
/// when there are none, then the nine `rwx` permission characters.
pub(crate) fn go_mode_string(st_mode: u32) -> String {
    let kind = st_mode & libc::S_IFMT;
    let letters = [
        (kind == libc::S_IFDIR, 'd'),
        (kind == libc::S_IFLNK, 'L'),
        (kind == libc::S_IFBLK || kind == libc::S_IFCHR, 'D'),
        (kind == libc::S_IFIFO, 'p'),
        (kind == libc::S_IFSOCK, 'S'),
        (st_mode & libc::S_ISUID != 0, 'u'),
        (st_mode & libc::S_ISGID != 0, 'g'),
        (kind == libc::S_IFCHR, 'c'),
        (st_mode & libc::S_ISVTX != 0, 't'),
    ];
    let mut out: String = letters
        .iter()
        .filter(|(set, _)| *set)
        .map(|(_, c)| *c)
        .collect();
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if st_mode & (1 << (8 - i)) != 0 {
            c
        } else {
            '-'
        });
    }
    out
}

/// uid and gid names from `/etc/passwd` and `/etc/group`, read once per request.
pub(crate) struct IdNames {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl IdNames {
    pub(crate) fn load() -> IdNames {
        let read = |path: &str| parse_id_names(&fs::read_to_string(path).unwrap_or_default());
        IdNames {
            users: read("/etc/passwd"),
            groups: read("/etc/group"),
        }
    }

    /// The user's name, or the number as text when it has none (as envd does).
    fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// Maps ids to names from passwd- or group-style lines (`name:x:id:...`); the first line wins.
fn parse_id_names(text: &str) -> HashMap<u32, String> {
    let mut names = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(id)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if let Ok(id) = id.parse() {
            names.entry(id).or_insert_with(|| name.to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_mode_strings() {
        assert_eq!(go_mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(go_mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            go_mode_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(go_mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(go_mode_string(libc::S_IFBLK | 0o660), "Drw-rw----");
        assert_eq!(go_mode_string(libc::S_IFIFO | 0o600), "prw-------");
        assert_eq!(go_mode_string(libc::S_IFSOCK | 0o755), "Srwxr-xr-x");
        assert_eq!(
            go_mode_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
        assert_eq!(
            go_mode_string(libc::S_IFREG | libc::S_ISGID | 0o755),
            "grwxr-xr-x"
        );
        assert_eq!(go_mode_string(libc::S_IFREG), "----------");
    }

    #[test]
    fn id_names_parse_and_fall_back_to_numbers() {
        let users = parse_id_names("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nbad\ndup:x:0:0::/:/bin/sh\n");
        assert_eq!(users.get(&0).map(String::as_str), Some("root"));
        assert_eq!(users.get(&1000).map(String::as_str), Some("user"));
        let names = IdNames {
            users,
            groups: parse_id_names("wheel:x:10:root\n"),
        };
        assert_eq!(names.group(10), "wheel");
        assert_eq!(names.user(4242), "4242");
    }

    #[test]
    fn ensure_dirs_creates_parents_and_rejects_files() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/c");
        ensure_dirs(&deep, 0, 0).unwrap();
        assert!(deep.is_dir());
        ensure_dirs(&deep, 0, 0).unwrap();
        fs::write(tmp.path().join("f"), b"x").unwrap();
        let err = ensure_dirs(&tmp.path().join("f/g"), 0, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory);
    }
}
