//! `FROM debian:SUITE` in a built-in template's definition: Debian's minimal root filesystem
//! (`debootstrap --variant=minbase`), fetched from the host's own apt mirror, since no image
//! registry need be reachable. It is the one part of a template made on the host: debootstrap
//! installs only Debian's signed packages, and no user's input reaches it (users' builds start
//! from images or templates). Everything after it runs in build sandboxes, as every step does.

use std::path::Path;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// Lines of its output a failed debootstrap's error ends with.
const TAIL_LINES: usize = 10;

/// Runs `debootstrap --variant=minbase SUITE TARGET MIRROR`, passing each line of its output to
/// `progress`. Fails with the last lines of its output.
pub async fn debootstrap(
    suite: &str,
    mirror: &str,
    target: &Path,
    progress: &(dyn Fn(String) + Sync),
) -> Result<(), String> {
    let mut child = Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(suite)
        .arg(target)
        .arg(mirror)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting debootstrap (scripts/install-deps.sh installs it): {e}"))?;
    let mut out = child.stdout.take().map(|s| BufReader::new(s).lines());
    let mut err = child.stderr.take().map(|s| BufReader::new(s).lines());
    let mut tail = std::collections::VecDeque::with_capacity(TAIL_LINES);
    let mut emit = |line: String| {
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        progress(line);
    };
    while out.is_some() || err.is_some() {
        tokio::select! {
            line = next_line(&mut out) => match line {
                Some(l) => emit(l),
                None => out = None,
            },
            line = next_line(&mut err) => match line {
                Some(l) => emit(l),
                None => err = None,
            },
        }
    }
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for debootstrap: {e}"))?;
    if status.success() {
        slim(target).map_err(|e| format!("slimming the new root: {e}"))
    } else {
        let tail: Vec<String> = tail.into_iter().collect();
        Err(format!(
            "debootstrap {suite} from {mirror} failed ({status}); last output:\n{}",
            tail.join("\n")
        ))
    }
}

/// Drops what a template never needs from a fresh Debian root, since a later step could only
/// hide it (a layer keeps what the layers above it delete): downloaded packages, package
/// lists, and documentation but its copyright files (as the `base` definition's dpkg settings
/// keep out of later installs).
fn slim(root: &Path) -> std::io::Result<()> {
    let remove = |path: &Path| -> std::io::Result<()> {
        // `symlink_metadata`: a link is removed itself, never followed.
        if std::fs::symlink_metadata(path)?.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        }
    };
    let empty = |dir: &str, keep: &dyn Fn(&str) -> bool| -> std::io::Result<()> {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            return Ok(());
        };
        for entry in entries {
            let entry = entry?;
            if !keep(&entry.file_name().to_string_lossy()) {
                remove(&entry.path())?;
            }
        }
        Ok(())
    };
    empty("var/cache/apt/archives", &|name| !name.ends_with(".deb"))?;
    empty("var/lib/apt/lists", &|name| {
        name == "lock" || name == "partial"
    })?;
    for dir in ["usr/share/man", "usr/share/info", "usr/share/locale"] {
        empty(dir, &|_| false)?;
    }
    for package in std::fs::read_dir(root.join("usr/share/doc"))? {
        let package = package?.path();
        if std::fs::symlink_metadata(&package)?.is_dir() {
            for entry in std::fs::read_dir(&package)? {
                let entry = entry?;
                if entry.file_name() != "copyright" {
                    remove(&entry.path())?;
                }
            }
        }
    }
    Ok(())
}

/// The next line of a stream, or `None` at its end (or on a read error: the exit status then
/// tells whether the command failed). Pends forever on an already-finished stream, so a
/// `select!` over two streams keeps reading the other.
async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut Option<tokio::io::Lines<R>>,
) -> Option<String> {
    match lines {
        Some(l) => l.next_line().await.ok().flatten(),
        None => std::future::pending().await,
    }
}

/// The Debian mirror this host's apt uses for `suite`: the deb822 `debian.sources` first, then
/// the one-line `sources.list`, then deb.debian.org.
pub fn host_mirror(suite: &str) -> String {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    read("/etc/apt/sources.list.d/debian.sources")
        .and_then(|t| mirror_from_deb822(&t, suite))
        .or_else(|| read("/etc/apt/sources.list").and_then(|t| mirror_from_one_line(&t, suite)))
        .unwrap_or_else(|| DEFAULT_MIRROR.to_owned())
}

/// The first `URIs:` entry of an enabled `deb` stanza whose `Suites:` include `suite` exactly and
/// whose `Components:` include `main`.
pub fn mirror_from_deb822(text: &str, suite: &str) -> Option<String> {
    // Stanzas are separated by blank lines; `#` lines are comments; an indented line continues
    // the previous field.
    let mut stanzas: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for line in text.lines() {
        if line.trim().is_empty() {
            stanzas.push(Vec::new());
        } else if line.starts_with('#') {
            continue;
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, v)) = stanzas.last_mut().and_then(|s| s.last_mut()) {
                v.push(' ');
                v.push_str(line.trim());
            }
        } else if let Some((k, v)) = line.split_once(':') {
            if let Some(s) = stanzas.last_mut() {
                s.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
    }
    stanzas.iter().find_map(|fields| {
        let get = |k: &str| {
            fields
                .iter()
                .find(|(fk, _)| fk == k)
                .map(|(_, v)| v.as_str())
        };
        let has =
            |k: &str, word: &str| get(k).is_some_and(|v| v.split_whitespace().any(|w| w == word));
        let enabled = get("enabled").is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        (enabled && has("types", "deb") && has("suites", suite) && has("components", "main"))
            .then(|| get("uris")?.split_whitespace().next().map(str::to_owned))
            .flatten()
    })
}

/// The URL of the first `deb [options] URL suite main...` line for `suite`.
pub fn mirror_from_one_line(text: &str, suite: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        if words.next()? != "deb" {
            return None;
        }
        let mut url = words.next()?;
        if url.starts_with('[') {
            // Options may span words: `[ arch=amd64 signed-by=... ]`.
            while !url.ends_with(']') {
                url = words.next()?;
            }
            url = words.next()?;
        }
        let line_suite = words.next()?;
        let mut components = words;
        (line_suite == suite && components.any(|c| c == "main")).then(|| url.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deb822_mirror() {
        let text = "\
Types: deb
URIs: http://mirror.example/debian
Suites: bookworm-backports
Components: main

Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.example/debian-security
Suites: bookworm-security
Components: main
";
        assert_eq!(
            mirror_from_deb822(text, "bookworm").as_deref(),
            Some("http://deb.example/debian")
        );
        assert_eq!(
            mirror_from_deb822(text, "bookworm-backports").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(mirror_from_deb822(text, "trixie"), None);

        let disabled_then_src = "\
Types: deb
Enabled: no
URIs: http://off.example/debian
Suites: bookworm
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Types: deb deb-src
URIs: http://a.example/debian
 http://b.example/debian
Suites:
 bookworm
Components: contrib main
";
        assert_eq!(
            mirror_from_deb822(disabled_then_src, "bookworm").as_deref(),
            Some("http://a.example/debian")
        );
    }

    #[test]
    fn one_line_mirror() {
        let text = "\
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb http://security.example/debian-security bookworm-security main
deb [ arch=amd64 signed-by=/k.gpg ] http://opt.example/debian bookworm contrib main
deb http://plain.example/debian bookworm main
";
        assert_eq!(
            mirror_from_one_line(text, "bookworm").as_deref(),
            Some("http://opt.example/debian")
        );
        assert_eq!(
            mirror_from_one_line(
                "deb [trusted=yes] http://x.example/d bookworm main",
                "bookworm"
            )
            .as_deref(),
            Some("http://x.example/d")
        );
        assert_eq!(
            mirror_from_one_line("deb http://x.example/d bookworm contrib", "bookworm"),
            None
        );
    }
}
