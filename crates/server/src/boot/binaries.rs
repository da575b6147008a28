//! The binaries `airlock serve` runs beside itself (`airlock-agent` in every sandbox,
//! `airlock-netd` for their network services): where they are, and whether the agent is
//! statically linked, as a template built from an image needs it to be.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

/// `name` (`airlock-agent`, `airlock-netd`) is shipped next to the `airlock` binary.
pub(crate) fn find_binary(name: &str, explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(p) => p,
        None => std::env::current_exe()
            .context("locating the airlock binary")?
            .with_file_name(name),
    };
    if !path.is_file() {
        bail!(
            "{} does not exist; build it with scripts/prepare.sh (it belongs next to the \
             airlock binary)",
            path.display()
        );
    }
    Ok(path)
}

/// Whether an x86_64 ELF executable needs no program interpreter (dynamic loader), so that
/// it runs in any root filesystem: its program headers have no `PT_INTERP` entry. Reads the
/// headers only, not the whole binary.
pub(crate) fn is_static_executable(path: &Path) -> anyhow::Result<bool> {
    use std::os::unix::fs::FileExt;
    const PT_INTERP: u32 = 3;
    let file = std::fs::File::open(path)?;
    let read = |at: usize, len: usize| -> anyhow::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, at as u64)
            .context("the ELF headers are cut short")?;
        Ok(buf)
    };
    let header = read(0, 64)?;
    // 64-bit, little-endian: the only target Airlock builds for.
    if header[..6] != *b"\x7fELF\x02\x01" {
        bail!("not a 64-bit little-endian ELF executable");
    }
    let le = |bytes: &[u8]| {
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        u64::from_le_bytes(word) as usize
    };
    let (table, entry_size, entries) = (
        le(&header[32..40]),
        le(&header[54..56]),
        le(&header[56..58]),
    );
    if entry_size != 56 {
        bail!("malformed ELF program headers (entries of {entry_size} bytes, not 56)");
    }
    let headers = read(table, entry_size * entries)?;
    Ok(!headers
        .chunks(entry_size)
        .any(|entry| le(&entry[..4]) == PT_INTERP as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header with one program header of type `kind`.
    fn elf_with_segment(kind: u32) -> tempfile::NamedTempFile {
        let mut bytes = vec![0u8; 64 + 56];
        bytes[..6].copy_from_slice(b"\x7fELF\x02\x01");
        bytes[32..40].copy_from_slice(&64u64.to_le_bytes());
        bytes[54..56].copy_from_slice(&56u16.to_le_bytes());
        bytes[56..58].copy_from_slice(&1u16.to_le_bytes());
        bytes[64..68].copy_from_slice(&kind.to_le_bytes());
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), bytes).unwrap();
        file
    }

    #[test]
    fn a_static_agent_is_told_from_a_dynamic_one() {
        const PT_LOAD: u32 = 1;
        assert!(is_static_executable(elf_with_segment(PT_LOAD).path()).unwrap());
        assert!(!is_static_executable(elf_with_segment(3).path()).unwrap());
        // Debian's shell is dynamically linked.
        assert!(!is_static_executable(Path::new("/bin/sh")).unwrap());
        let not_elf = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(not_elf.path(), b"#!/bin/sh\n").unwrap();
        assert!(is_static_executable(not_elf.path()).is_err());
    }
}
