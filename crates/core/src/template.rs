//! Template root filesystems: built with `debootstrap`, cached by content hash.
//!
//! A [`Recipe`] names everything that determines a template's bytes: the Debian suite, the mirror,
//! the package list, the setup script and the host CA bundle copied in. [`content_hash`] hashes
//! exactly that, and [`build`] keeps each result at `{templates_dir}/{name}-{hash}/rootfs`, so
//! an unchanged recipe is a cache hit and a changed one gets a fresh directory.
//!
//! A build runs `debootstrap` into `{name}-{hash}.partial`, runs the setup script in a `chroot`
//! there (build time, trusted input), writes the `complete` marker and only then renames the
//! directory into place. A crash at any point leaves either a `.partial` directory, which the next
//! build removes, or a finished template: never a half-built one under the final name.

use crate::ids::TemplateName;
use crate::store::{Store, StoreError, TemplateRecord};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Bump when the build procedure changes in a way the recipe fields do not capture.
const RECIPE_FORMAT: u32 = 1;

const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const COMPLETE_MARKER: &str = "complete";

/// What `base` contains beyond debootstrap's minbase. python3 and coreutils are what the agent
/// and the SDKs' examples need; the rest is what people expect to find in a shell. Recommends are
/// not installed, which keeps it small.
const BASE_PACKAGES: &[&str] = &[
    "ca-certificates",
    "curl",
    "iproute2",
    "less",
    "netbase",
    "procps",
    "python3",
    "sudo",
];

/// Runs inside the new rootfs (`chroot`, `/bin/sh`). Mirrors E2B's base template: a `user`
/// account (uid 1000) with passwordless sudo, and the host's CA bundle (copied in by [`build`])
/// named for the usual clients: on our hosts, registry TLS is signed by a CA only that bundle has.
const BASE_SETUP: &str = r#"set -eu
groupadd --gid 1000 user
useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user --shell /bin/bash user
chown user:user /home/user
chmod 0755 /home/user
printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' > /etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
printf 'airlock\n' > /etc/hostname
cat >> /etc/environment <<'EOF'
SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
PIP_CERT=/etc/ssl/certs/ca-certificates.crt
EOF
cat > /etc/profile.d/airlock.sh <<'EOF'
export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
export REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
EOF
# The agent is bind-mounted over this file at run time. It must exist: otherwise runsc creates
# it, writing into the shared template directory.
mkdir -p /opt/airlock
touch /opt/airlock/airlock-agent
chmod 0755 /opt/airlock/airlock-agent
chmod 1777 /tmp
# Documentation is dead weight without `man`: drop it now and keep later installs from adding it.
cat > /etc/dpkg/dpkg.cfg.d/airlock-slim <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
EOF
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
rm -rf /usr/share/man/* /usr/share/info/* /usr/share/locale/*
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
"#;

/// Everything that determines a template's root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub name: TemplateName,
    /// Debian suite, e.g. `bookworm`.
    pub suite: String,
    /// debootstrap variant, e.g. `minbase`.
    pub variant: String,
    pub mirror: String,
    /// Installed on top of the variant (`--include`).
    pub packages: Vec<String>,
    /// Shell script run inside the rootfs after debootstrap.
    pub setup_script: String,
    /// Copied over the rootfs's `/etc/ssl/certs/ca-certificates.crt`; `None` if the host has none.
    pub ca_bundle: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{what} failed ({status}); last output: {tail}")]
    Command {
        what: String,
        status: std::process::ExitStatus,
        tail: String,
    },
    #[error("could not record template in the store")]
    Store(#[source] StoreError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TemplateError {
    let what = what.into();
    move |source| TemplateError::Io { what, source }
}

/// The recipe for a known template, reading the host's apt mirror and CA bundle.
/// `None` for names no recipe exists for.
pub fn recipe(name: &TemplateName) -> Option<Recipe> {
    match name.as_str() {
        "base" => Some(Recipe {
            name: name.clone(),
            suite: "bookworm".into(),
            variant: "minbase".into(),
            mirror: host_mirror("bookworm"),
            packages: BASE_PACKAGES.iter().map(|p| (*p).to_owned()).collect(),
            setup_script: BASE_SETUP.into(),
            ca_bundle: std::fs::read(HOST_CA_BUNDLE).ok(),
        }),
        _ => None,
    }
}

/// SHA-256 (hex) over every recipe field that shapes the output, plus [`RECIPE_FORMAT`].
/// The name is left out: two names with one recipe would build the same bytes.
pub fn content_hash(recipe: &Recipe) -> String {
    let mut h = Sha256::new();
    // Length-prefix every field so that no two different recipes hash the same byte stream.
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(&RECIPE_FORMAT.to_le_bytes());
    field(recipe.suite.as_bytes());
    field(recipe.variant.as_bytes());
    field(recipe.mirror.as_bytes());
    field(&(recipe.packages.len() as u64).to_le_bytes());
    for p in &recipe.packages {
        field(p.as_bytes());
    }
    field(recipe.setup_script.as_bytes());
    match &recipe.ca_bundle {
        Some(ca) => field(ca),
        None => field(b"\0no-ca"),
    }
    hex::encode(h.finalize())
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

/// Records a finished rootfs in the store, measuring its size.
async fn record_built(
    store: &Store,
    name: &TemplateName,
    hash: String,
    rootfs: PathBuf,
) -> Result<TemplateRecord, TemplateError> {
    let record = TemplateRecord {
        name: name.clone(),
        content_hash: hash,
        size_bytes: disk_usage(&rootfs).await?,
        rootfs,
        built_at: now(),
    };
    store.put_template(&record).map_err(TemplateError::Store)?;
    Ok(record)
}

/// Builds the template (or finds it cached), records it in `store` and returns the record.
/// `progress` receives one line at a time: debootstrap's own output and our steps.
pub async fn build(
    recipe: &Recipe,
    templates_dir: &Path,
    store: &Store,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<TemplateRecord, TemplateError> {
    let hash = content_hash(recipe);
    let name = &recipe.name;
    let final_dir = templates_dir.join(format!("{name}-{hash}"));
    let rootfs = final_dir.join("rootfs");

    if final_dir.join(COMPLETE_MARKER).is_file() && rootfs.is_dir() {
        progress(&format!("template {name}: cached at {}", rootfs.display()));
        let known = store.template(name).map_err(TemplateError::Store)?;
        return match known {
            Some(r) if r.content_hash == hash && r.rootfs == rootfs => {
                store.put_template(&r).map_err(TemplateError::Store)?;
                Ok(r)
            }
            _ => record_built(store, name, hash, rootfs).await,
        };
    }

    let partial = templates_dir.join(format!("{name}-{hash}.partial"));
    for stale in [&partial, &final_dir] {
        // A final dir without its marker can only be a hand-made leftover; rebuild over it.
        if stale.exists() {
            progress(&format!("removing stale {}", stale.display()));
            tokio::fs::remove_dir_all(stale)
                .await
                .map_err(io_err(format!("removing {}", stale.display())))?;
        }
    }
    tokio::fs::create_dir_all(&partial)
        .await
        .map_err(io_err(format!("creating {}", partial.display())))?;
    let partial_rootfs = partial.join("rootfs");

    progress(&format!(
        "template {name}: debootstrap {} from {}",
        recipe.suite, recipe.mirror
    ));
    let mut debootstrap = Command::new("debootstrap");
    debootstrap
        .arg(format!("--variant={}", recipe.variant))
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg(&recipe.suite)
        .arg(&partial_rootfs)
        .arg(&recipe.mirror);
    run_streaming("debootstrap", &mut debootstrap, progress).await?;

    if let Some(ca) = &recipe.ca_bundle {
        let dest = partial_rootfs.join(HOST_CA_BUNDLE.trim_start_matches('/'));
        // ca-certificates made this a regular file; a symlink here would point into the host.
        let _ = tokio::fs::remove_file(&dest).await;
        tokio::fs::write(&dest, ca)
            .await
            .map_err(io_err(format!("writing {}", dest.display())))?;
    }

    progress(&format!("template {name}: running setup"));
    let mut setup = Command::new("chroot");
    setup
        .arg(&partial_rootfs)
        .args(["/bin/sh", "-c", &recipe.setup_script])
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("LC_ALL", "C");
    run_streaming("template setup", &mut setup, progress).await?;

    let marker = partial.join(COMPLETE_MARKER);
    tokio::fs::write(&marker, format!("{hash}\n"))
        .await
        .map_err(io_err(format!("writing {}", marker.display())))?;
    tokio::fs::rename(&partial, &final_dir)
        .await
        .map_err(io_err(format!("renaming {} into place", partial.display())))?;

    let record = record_built(store, name, hash, rootfs).await?;
    progress(&format!(
        "template {name}: built at {} ({} MB)",
        record.rootfs.display(),
        record.size_bytes / 1_000_000
    ));
    Ok(record)
}

/// Runs `cmd`, passing each line of its stdout and stderr to `progress` as it comes.
async fn run_streaming(
    what: &str,
    cmd: &mut Command,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), TemplateError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io_err(format!("starting {what}")))?;
    let mut out = child.stdout.take().map(|s| BufReader::new(s).lines());
    let mut err = child.stderr.take().map(|s| BufReader::new(s).lines());
    // The last lines go into the error, so a failure explains itself without the full log.
    let mut tail: Vec<String> = Vec::new();
    let mut emit = |line: String, progress: &mut (dyn FnMut(&str) + Send)| {
        progress(&line);
        if tail.len() == 8 {
            tail.remove(0);
        }
        tail.push(line);
    };
    while out.is_some() || err.is_some() {
        tokio::select! {
            line = next_line(&mut out) => match line {
                Some(l) => emit(l, progress),
                None => out = None,
            },
            line = next_line(&mut err) => match line {
                Some(l) => emit(l, progress),
                None => err = None,
            },
        }
    }
    let status = child
        .wait()
        .await
        .map_err(io_err(format!("waiting for {what}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(TemplateError::Command {
            what: what.to_owned(),
            status,
            tail: tail.join(" | "),
        })
    }
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

/// Bytes the tree occupies on disk, counting hard-linked files once (like `du -s`).
async fn disk_usage(root: &Path) -> Result<u64, TemplateError> {
    let root = root.to_owned();
    let what = format!("measuring {}", root.display());
    tokio::task::spawn_blocking(move || {
        let mut seen = HashSet::new();
        let mut total = 0u64;
        let mut stack: Vec<PathBuf> = vec![root];
        while let Some(path) = stack.pop() {
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            total += meta.blocks() * 512;
            if meta.is_dir() {
                for entry in std::fs::read_dir(&path)? {
                    stack.push(entry?.path());
                }
            }
        }
        Ok(total)
    })
    .await
    .map_err(|e| io::Error::other(e.to_string()))
    .and_then(|r| r)
    .map_err(io_err(what))
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Recipe {
        recipe(&TemplateName::parse("base").unwrap()).unwrap()
    }

    #[test]
    fn hash_is_stable_and_tracks_the_recipe() {
        let r = base();
        assert_eq!(content_hash(&r), content_hash(&r.clone()));
        assert_eq!(content_hash(&r).len(), 64);

        let mut more = r.clone();
        more.packages.push("git".into());
        assert_ne!(content_hash(&r), content_hash(&more));

        let mut mirror = r.clone();
        mirror.mirror = "http://example.invalid/debian".into();
        assert_ne!(content_hash(&r), content_hash(&mirror));

        // Moving a boundary between fields must change the hash too.
        let mut a = r.clone();
        a.packages = vec!["ab".into(), "c".into()];
        let mut b = r.clone();
        b.packages = vec!["a".into(), "bc".into()];
        assert_ne!(content_hash(&a), content_hash(&b));

        let mut renamed = r.clone();
        renamed.name = TemplateName::parse("other").unwrap();
        assert_eq!(content_hash(&r), content_hash(&renamed));
    }

    #[test]
    fn unknown_templates_have_no_recipe() {
        assert!(recipe(&TemplateName::parse("nope").unwrap()).is_none());
    }

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
