//! `airlock-agent unpack-layer ARCHIVE DEST`: applies one OCI image layer (a tar, plain, gzip
//! or zstd) to the filesystem at DEST, as a container runtime does.
//!
//! The build runs this inside a gVisor build sandbox whose root is an overlay of the image's
//! lower layers, so the bytes of an untrusted archive are never interpreted on the host. What
//! the layer removes (its whiteouts) becomes overlay whiteouts in the step's upper directory.
//!
//! Two passes, because a layer's whiteouts delete from the layers below it only, never its own
//! files, wherever they sit in the archive:
//! 1. whiteouts: `.wh.NAME` removes NAME; `.wh..wh..opq` empties its directory;
//! 2. everything else, replacing what is in the way unless both are directories.

use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
/// Where the sandbox's own mounts are (see the driver's OCI spec): an image's files there would
/// land on them. The sandbox gets its own at run time anyway.
const SKIPPED: &[&str] = &["proc", "sys", "dev", "opt/airlock", "etc/hosts"];

pub fn main(args: &[String]) -> Result<(), String> {
    let [archive, dest] = args else {
        return Err("usage: airlock-agent unpack-layer ARCHIVE DEST".into());
    };
    let (archive, dest) = (Path::new(archive), Path::new(dest));
    let whiteouts = for_each_entry(archive, |entry, path| apply_whiteout(entry, path, dest))?;
    let files = for_each_entry(archive, |entry, path| extract(entry, path, dest))?;
    println!("applied {files} entries and {whiteouts} whiteouts");
    Ok(())
}

/// Calls `f` on each entry whose path is safe and not skipped; counts the calls that did
/// something.
fn for_each_entry(
    archive: &Path,
    mut f: impl FnMut(&mut tar::Entry<'_, Box<dyn Read>>, &Path) -> Result<bool, String>,
) -> Result<usize, String> {
    let mut archive = tar::Archive::new(open(archive)?);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    let mut done = 0;
    let entries = archive
        .entries()
        .map_err(|e| format!("reading the layer: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("reading the layer: {e}"))?;
        let raw = entry
            .path()
            .map_err(|e| format!("a path in the layer: {e}"))?
            .into_owned();
        let Some(path) = clean(&raw) else {
            return Err(format!("the layer has an unsafe path: {}", raw.display()));
        };
        if path.as_os_str().is_empty() || SKIPPED.iter().any(|s| path.starts_with(s)) {
            continue;
        }
        if f(&mut entry, &path)? {
            done += 1;
        }
    }
    Ok(done)
}

/// The archive, decompressed if it is gzip or zstd (told by their magic numbers, not by the
/// media type the manifest claims).
fn open(path: &Path) -> Result<Box<dyn Read>, String> {
    let mut file =
        std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic).map_err(|e| e.to_string())?;
    let file = io::Cursor::new(magic[..n].to_vec()).chain(file);
    match magic {
        // Multi: parallel gzip writers (umoci's among them) write several members.
        [0x1f, 0x8b, ..] => Ok(Box::new(flate2::read::MultiGzDecoder::new(file))),
        // Several frames, and skippable ones (zstd:chunked), are read as one stream.
        [0x28, 0xb5, 0x2f, 0xfd] => zstd::stream::read::Decoder::new(file)
            .map(|d| Box::new(d) as Box<dyn Read>)
            .map_err(|e| format!("reading the zstd layer: {e}")),
        _ => Ok(Box::new(file)),
    }
}

/// The entry's path relative to the root: leading `/` and `.` dropped, `..` refused.
fn clean(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn apply_whiteout(
    _entry: &mut tar::Entry<'_, Box<dyn Read>>,
    path: &Path,
    dest: &Path,
) -> Result<bool, String> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(false);
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    if name == OPAQUE {
        let Ok(children) = std::fs::read_dir(dest.join(dir)) else {
            return Ok(false);
        };
        for child in children.flatten() {
            remove_below(dest, &dir.join(child.file_name()))?;
        }
        return Ok(true);
    }
    match name.strip_prefix(WHITEOUT) {
        Some(hidden) if !hidden.is_empty() && hidden != "." && hidden != ".." => {
            remove_below(dest, &dir.join(hidden))?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Removes `path` (relative to `dest`), except the sandbox's own mounts under it: a whiteout
/// of `/opt` leaves `/opt/airlock`.
fn remove_below(dest: &Path, path: &Path) -> Result<(), String> {
    if SKIPPED.iter().any(|s| Path::new(s).starts_with(path)) {
        if SKIPPED.iter().any(|s| Path::new(s) == path) {
            return Ok(());
        }
        let Ok(children) = std::fs::read_dir(dest.join(path)) else {
            return Ok(());
        };
        for child in children.flatten() {
            remove_below(dest, &path.join(child.file_name()))?;
        }
        return Ok(());
    }
    remove(&dest.join(path))
}

fn extract(
    entry: &mut tar::Entry<'_, Box<dyn Read>>,
    path: &Path,
    dest: &Path,
) -> Result<bool, String> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with(WHITEOUT) {
        return Ok(false);
    }
    let target = dest.join(path);
    let is_dir = entry.header().entry_type().is_dir();
    if let Ok(existing) = std::fs::symlink_metadata(&target) {
        // A directory stays (and merges); anything else in the way goes, as in Docker.
        if !(is_dir && existing.is_dir()) {
            remove(&target)?;
        }
    }
    entry
        .unpack_in(dest)
        .map_err(|e| match std::error::Error::source(&e) {
            // tar's own message only names the path; the cause is under it.
            Some(cause) => format!("unpacking {}: {cause}", path.display()),
            None => format!("unpacking {}: {e}", path.display()),
        })?;
    Ok(true)
}

fn remove(path: &Path) -> Result<(), String> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|e| format!("removing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(dir: &Path, name: &str, build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> PathBuf {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let bytes = b.into_inner().unwrap();
        let path = dir.join(name);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &bytes).unwrap();
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        path
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, body).unwrap();
    }

    fn dir(b: &mut tar::Builder<Vec<u8>>, path: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Directory);
        b.append_data(&mut h, path, io::empty()).unwrap();
    }

    fn run(archive: &Path, dest: &Path) -> Result<(), String> {
        main(&[
            archive.to_string_lossy().into_owned(),
            dest.to_string_lossy().into_owned(),
        ])
    }

    #[test]
    fn whiteouts_delete_from_below_only_and_files_replace_what_is_in_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let lower = layer(tmp.path(), "lower.tar.gz", |b| {
            dir(b, "etc");
            file(b, "etc/gone", b"old");
            file(b, "etc/kept", b"old");
            dir(b, "var/cache/x");
            file(b, "var/cache/x/old", b"old");
            dir(b, "thing");
            file(b, "proc/ignored", b"x");
            file(b, "opt/airlock/airlock-agent", b"skipped");
            file(b, "opt/other", b"x");
        });
        std::fs::create_dir_all(root.join("opt/airlock")).unwrap();
        std::fs::write(root.join("opt/airlock/airlock-agent"), b"the agent").unwrap();
        run(&lower, &root).unwrap();
        assert!(!root.join("proc/ignored").exists());

        let upper = layer(tmp.path(), "upper.tar.gz", |b| {
            // The layer's own file comes before its whiteout in the archive: it stays.
            file(b, "etc/kept", b"new");
            file(b, "etc/.wh.kept", b"");
            file(b, "etc/.wh.gone", b"");
            file(b, "var/cache/x/.wh..wh..opq", b"");
            file(b, "var/cache/x/fresh", b"new");
            file(b, "thing", b"now a file");
            file(b, ".wh.opt", b"");
        });
        run(&upper, &root).unwrap();
        assert!(!root.join("etc/gone").exists());
        assert_eq!(std::fs::read(root.join("etc/kept")).unwrap(), b"new");
        assert!(!root.join("var/cache/x/old").exists());
        assert_eq!(
            std::fs::read(root.join("var/cache/x/fresh")).unwrap(),
            b"new"
        );
        assert_eq!(std::fs::read(root.join("thing")).unwrap(), b"now a file");
        assert!(!root.join("etc/.wh.gone").exists());
        // The agent's mount point outlives a whiteout of its parent.
        assert!(!root.join("opt/other").exists());
        assert_eq!(
            std::fs::read(root.join("opt/airlock/airlock-agent")).unwrap(),
            b"the agent"
        );
    }

    #[test]
    fn zstd_layers_are_read_frame_after_frame() {
        let tmp = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        dir(&mut b, "app");
        file(&mut b, "app/hello", b"from zstd");
        let tar = b.into_inner().unwrap();
        // Two frames and a skippable one between them, as chunked writers make.
        let (first, second) = tar.split_at(tar.len() / 2);
        let mut zst = zstd::encode_all(first, 3).unwrap();
        zst.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4]);
        zst.extend(zstd::encode_all(second, 3).unwrap());
        let archive = tmp.path().join("layer.tar.zst");
        std::fs::write(&archive, zst).unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        run(&archive, &root).unwrap();
        assert_eq!(std::fs::read(root.join("app/hello")).unwrap(), b"from zstd");
    }

    #[test]
    fn refuses_paths_that_climb_out() {
        assert_eq!(clean(Path::new("/a/./b")), Some(PathBuf::from("a/b")));
        assert_eq!(clean(Path::new("a/../../b")), None);
    }
}
