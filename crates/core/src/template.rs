//! Template root filesystems: built with `debootstrap`, cached by content hash.
//!
//! A [`Recipe`] names everything that determines a template's bytes: the Debian suite, the mirror,
//! the package list, the setup script and the host CA bundle copied in. [`content_hash`] hashes
//! exactly that, and [`build`] keeps each result at `{templates_dir}/{name}-{hash}/rootfs`, so
//! an unchanged recipe is a cache hit and a changed one gets a fresh directory.
//!
//! A build runs `debootstrap` into `{name}-{hash}.partial`, writes the recipe's files, installs
//! its npm-packaged binaries (fetched on the host with `npm pack`), runs the setup script in a
//! `chroot` there (build time, trusted input), writes the `complete` marker and only then renames
//! the directory into place. A crash at any point leaves either a `.partial` directory, which the
//! next build removes, or a finished template: never a half-built one under the final name.

use crate::ids::TemplateName;
use crate::store::{Store, StoreError, TemplateDefaults, TemplateRecord};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// Bump when the build procedure changes in a way the recipe fields do not capture.
const RECIPE_FORMAT: u32 = 1;

const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const COMPLETE_MARKER: &str = "complete";

/// What `base` contains beyond debootstrap's minbase: what E2B's base has (git, curl, python3
/// with pip, sudo, ca-certificates), so that `apt_install`, `pip_install` and `git_clone` steps
/// work on it, and what people expect to find in a shell. Recommends are not installed, which
/// keeps it small.
const BASE_PACKAGES: &[&str] = &[
    "ca-certificates",
    "curl",
    "git",
    "iproute2",
    "less",
    "netbase",
    "procps",
    "python3",
    "python3-pip",
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
# A plain `pip install` works, as in E2B's image (as `user` it falls back to `~/.local`).
rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
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

/// `code-interpreter-v1` (the name `e2b_code_interpreter` asks for): `base` plus Jupyter kernels
/// for Python (ipykernel, with the scientific stack), Bash (bash_kernel) and TypeScript/JavaScript
/// (Deno), and the IPython start-up script that adds E2B's `e2b/chart` and `e2b/data` outputs.
pub const CODE_INTERPRETER: &str = "code-interpreter-v1";

/// `python-is-python3` gives generated code its `python` (pip is `base`'s). The rest of the
/// Python stack comes from PyPI, pinned in `requirements.txt`.
const CODE_INTERPRETER_PACKAGES: &[&str] = &["python-is-python3"];

/// The code interpreter's files, embedded: (path in the rootfs, mode, contents). The kernelspecs
/// are staged under `/usr/local/lib/airlock/kernels` and moved into place by the setup script
/// after pip has run, because ipykernel's wheel installs a `python3` kernelspec of its own there.
const CODE_INTERPRETER_FILES: &[(&str, u32, &str)] = &[
    (
        "/usr/local/lib/airlock/ipython_startup.py",
        0o644,
        include_str!("../templates/code-interpreter/ipython_startup.py"),
    ),
    (
        "/usr/local/lib/airlock/requirements.txt",
        0o644,
        include_str!("../templates/code-interpreter/requirements.txt"),
    ),
    (
        "/usr/local/lib/airlock/kernels/python3/kernel.json",
        0o644,
        include_str!("../templates/code-interpreter/kernels/python3/kernel.json"),
    ),
    (
        "/usr/local/lib/airlock/kernels/bash/kernel.json",
        0o644,
        include_str!("../templates/code-interpreter/kernels/bash/kernel.json"),
    ),
    (
        "/usr/local/lib/airlock/kernels/deno/kernel.json",
        0o644,
        include_str!("../templates/code-interpreter/kernels/deno/kernel.json"),
    ),
];

/// Deno, the JavaScript/TypeScript kernel: one binary that needs only glibc, shipped by npm as a
/// platform package, so the sandbox needs no Node. `sha512` is the tarball's: npm's
/// `dist.integrity`, in hex.
const DENO: NpmBinary = NpmBinary {
    package: Cow::Borrowed("@deno/linux-x64-glibc"),
    version: Cow::Borrowed("2.9.6"),
    sha512: Cow::Borrowed(
        "de67784ca2c2bb3b0b0e67cea02e4a37b34065ac525643209bae2f83a7e80f4d\
         090400c2a584b6ff942a5dfce09cfe59433de22cff6f05026d120735d7a380a1",
    ),
    path: Cow::Borrowed("deno"),
    dest: Cow::Borrowed("/usr/local/bin/deno"),
};

/// Runs after [`BASE_SETUP`] in the same shell. pip installs the locked closure (hashes checked,
/// wheels only, no resolver) as root into `/usr/local`. As `user`, a `pip install` falls back to
/// `~/.local`, which exists from the start so that a running kernel sees what it installs.
const CODE_INTERPRETER_SETUP: &str = r#"
export HOME=/root
export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
export REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
python3 -m pip install --no-deps --require-hashes --only-binary=:all: --progress-bar off \
    -r /usr/local/lib/airlock/requirements.txt
python3 -m pip check
python3 -c 'import bash_kernel, ipykernel, matplotlib, numpy, openpyxl, pandas, seaborn, sklearn'
/usr/local/bin/deno --version
# ipykernel's wheel brought a python3 kernelspec; ours replace it.
rm -rf /usr/local/share/jupyter/kernels
mkdir -p /usr/local/share/jupyter
mv /usr/local/lib/airlock/kernels /usr/local/share/jupyter/kernels
cat >> /etc/environment <<'EOF'
PIP_DISABLE_PIP_VERSION_CHECK=1
DENO_NO_UPDATE_CHECK=1
EOF
cat >> /etc/profile.d/airlock.sh <<'EOF'
export PIP_DISABLE_PIP_VERSION_CHECK=1
export DENO_NO_UPDATE_CHECK=1
EOF
# user's `pip install --user` target, there before any kernel starts; and matplotlib's font
# cache, built once here rather than on each sandbox's first plot.
user_site=$(HOME=/home/user python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$user_site"
HOME=/home/user MPLBACKEND=Agg python3 -c 'import matplotlib.pyplot'
chown -R user:user /home/user
rm -rf /root/.cache /root/.config /tmp/* /var/tmp/*
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
    /// Written into the rootfs after debootstrap, before the setup script runs.
    pub files: Vec<RecipeFile>,
    /// Executables taken from npm packages on the host, installed before the setup script runs.
    pub npm_binaries: Vec<NpmBinary>,
}

/// A file the recipe puts into the rootfs (owned by root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipeFile {
    /// Absolute path inside the rootfs. Missing parent directories are created with mode 0755.
    pub path: String,
    pub mode: u32,
    pub contents: Vec<u8>,
}

/// An executable shipped inside an npm package, fetched with `npm pack` on the host (so the
/// rootfs needs no Node) and checked against a pinned digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpmBinary {
    /// e.g. `@deno/linux-x64-glibc`.
    pub package: Cow<'static, str>,
    /// An exact version.
    pub version: Cow<'static, str>,
    /// SHA-512 of the package tarball, hex (npm's `dist.integrity`, decoded).
    pub sha512: Cow<'static, str>,
    /// Path of the executable inside the package (below the tarball's `package/`).
    pub path: Cow<'static, str>,
    /// Absolute path inside the rootfs; installed with mode 0755.
    pub dest: Cow<'static, str>,
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
    #[error("{0}")]
    Invalid(String),
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
            files: Vec::new(),
            npm_binaries: Vec::new(),
        }),
        CODE_INTERPRETER => Some(Recipe {
            name: name.clone(),
            suite: "bookworm".into(),
            variant: "minbase".into(),
            mirror: host_mirror("bookworm"),
            packages: BASE_PACKAGES
                .iter()
                .chain(CODE_INTERPRETER_PACKAGES)
                .map(|p| (*p).to_owned())
                .collect(),
            setup_script: format!("{BASE_SETUP}{CODE_INTERPRETER_SETUP}"),
            ca_bundle: std::fs::read(HOST_CA_BUNDLE).ok(),
            files: CODE_INTERPRETER_FILES
                .iter()
                .map(|(path, mode, contents)| RecipeFile {
                    path: (*path).to_owned(),
                    mode: *mode,
                    contents: contents.as_bytes().to_vec(),
                })
                .collect(),
            npm_binaries: vec![DENO],
        }),
        _ => None,
    }
}

/// The names [`recipe`] knows, for messages.
pub const KNOWN_TEMPLATES: &[&str] = &["base", CODE_INTERPRETER];

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
    // Fields added after format 1 are hashed only when used, so recipes without them (`base`)
    // keep the hashes, and the caches, they had.
    if !recipe.files.is_empty() || !recipe.npm_binaries.is_empty() {
        field(b"files");
        field(&(recipe.files.len() as u64).to_le_bytes());
        for f in &recipe.files {
            field(f.path.as_bytes());
            field(&f.mode.to_le_bytes());
            field(&f.contents);
        }
        field(b"npm_binaries");
        field(&(recipe.npm_binaries.len() as u64).to_le_bytes());
        for b in &recipe.npm_binaries {
            for part in [&b.package, &b.version, &b.sha512, &b.path, &b.dest] {
                field(part.as_bytes());
            }
        }
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
        layers: Vec::new(),
        defaults: TemplateDefaults::default(),
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

    for file in &recipe.files {
        progress(&format!("template {name}: writing {}", file.path));
        write_file(&partial_rootfs, file).await?;
    }

    // npm's downloads go next to the rootfs, never into it, and are gone before the rename.
    let work = partial.join("work");
    for bin in &recipe.npm_binaries {
        progress(&format!(
            "template {name}: {}@{} -> {}",
            bin.package, bin.version, bin.dest
        ));
        install_npm_binary(bin, &work, &partial_rootfs, progress).await?;
    }
    if work.exists() {
        tokio::fs::remove_dir_all(&work)
            .await
            .map_err(io_err(format!("removing {}", work.display())))?;
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

/// `path` (absolute, inside the rootfs) as a host path under `rootfs`. Refuses `.` and `..`
/// components and existing symlinks on the way: an absolute symlink in the rootfs would
/// otherwise resolve into the host.
fn rootfs_path(rootfs: &Path, path: &str) -> Result<PathBuf, TemplateError> {
    let invalid = || TemplateError::Invalid(format!("bad path for a template file: {path:?}"));
    let rel = path.strip_prefix('/').ok_or_else(invalid)?;
    let mut out = rootfs.to_path_buf();
    for part in rel.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(invalid());
        }
        out.push(part);
        if std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(invalid());
        }
    }
    Ok(out)
}

/// Creates the missing parents of `target` (a path below `rootfs`), each with mode 0755
/// whatever the umask.
async fn create_parents(rootfs: &Path, target: &Path) -> Result<(), TemplateError> {
    let mut missing = Vec::new();
    let mut dir = target.parent();
    while let Some(d) = dir {
        if d == rootfs || d.exists() {
            break;
        }
        missing.push(d.to_path_buf());
        dir = d.parent();
    }
    for d in missing.iter().rev() {
        tokio::fs::create_dir(d)
            .await
            .map_err(io_err(format!("creating {}", d.display())))?;
        set_mode(d, 0o755).await?;
    }
    Ok(())
}

async fn set_mode(path: &Path, mode: u32) -> Result<(), TemplateError> {
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .await
        .map_err(io_err(format!("chmod {}", path.display())))
}

async fn write_file(rootfs: &Path, file: &RecipeFile) -> Result<(), TemplateError> {
    let dest = rootfs_path(rootfs, &file.path)?;
    create_parents(rootfs, &dest).await?;
    tokio::fs::write(&dest, &file.contents)
        .await
        .map_err(io_err(format!("writing {}", dest.display())))?;
    set_mode(&dest, file.mode).await
}

/// `npm pack`s the package into a fresh directory under `work` (on the host, outside the
/// rootfs), checks the tarball's SHA-512, unpacks the one file and copies it into the rootfs.
async fn install_npm_binary(
    bin: &NpmBinary,
    work: &Path,
    rootfs: &Path,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), TemplateError> {
    let spec = format!("{}@{}", bin.package, bin.version);
    let dest = rootfs_path(rootfs, &bin.dest)?;
    if bin
        .path
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err(TemplateError::Invalid(format!(
            "{spec}: bad path in the package: {:?}",
            bin.path
        )));
    }
    let member = format!("package/{}", bin.path);

    let dir = work.join(hex::encode(Sha256::digest(spec.as_bytes())));
    if dir.exists() {
        tokio::fs::remove_dir_all(&dir)
            .await
            .map_err(io_err(format!("removing {}", dir.display())))?;
    }
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(io_err(format!("creating {}", dir.display())))?;

    let mut pack = Command::new("npm");
    pack.args(["pack", "--ignore-scripts", "--pack-destination"])
        .arg(&dir)
        .arg(&spec)
        .current_dir(&dir);
    run_streaming(&format!("npm pack {spec}"), &mut pack, progress).await?;

    let mut tarballs = Vec::new();
    let mut entries = tokio::fs::read_dir(&dir)
        .await
        .map_err(io_err(format!("listing {}", dir.display())))?;
    while let Some(e) = entries
        .next_entry()
        .await
        .map_err(io_err(format!("listing {}", dir.display())))?
    {
        if e.file_name().to_string_lossy().ends_with(".tgz") {
            tarballs.push(e.path());
        }
    }
    let [tarball] = tarballs.as_slice() else {
        return Err(TemplateError::Invalid(format!(
            "npm pack {spec} left {} tarballs in {}",
            tarballs.len(),
            dir.display()
        )));
    };
    let bytes = tokio::fs::read(tarball)
        .await
        .map_err(io_err(format!("reading {}", tarball.display())))?;
    let digest = hex::encode(sha2::Sha512::digest(&bytes));
    drop(bytes);
    if !digest.eq_ignore_ascii_case(&bin.sha512) {
        return Err(TemplateError::Invalid(format!(
            "{spec}: the tarball's SHA-512 is {digest}, the recipe pins {}",
            bin.sha512
        )));
    }

    let mut untar = Command::new("tar");
    untar
        .arg("-xzf")
        .arg(tarball)
        .arg("-C")
        .arg(&dir)
        .args(["--no-same-owner", "--no-same-permissions"])
        .arg(&member);
    run_streaming(&format!("unpacking {spec}"), &mut untar, progress).await?;

    create_parents(rootfs, &dest).await?;
    let from = dir.join(&member);
    tokio::fs::copy(&from, &dest).await.map_err(io_err(format!(
        "copying {} to {}",
        from.display(),
        dest.display()
    )))?;
    set_mode(&dest, 0o755).await?;
    tokio::fs::remove_dir_all(&dir)
        .await
        .map_err(io_err(format!("removing {}", dir.display())))
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
    tokio::task::spawn_blocking(move || crate::disk_usage::bytes_on_disk(&root))
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

    fn code_interpreter() -> Recipe {
        recipe(&TemplateName::parse(CODE_INTERPRETER).unwrap()).unwrap()
    }

    /// `base`'s hash, with the host-dependent fields fixed: files and npm binaries (which it
    /// has none of) leave it as it was. It changes only when `base` itself does (last: git and
    /// pip added), and every built `base` cache is then built again.
    #[test]
    fn base_hash_is_unchanged_by_the_newer_fields() {
        let mut r = base();
        assert!(r.files.is_empty() && r.npm_binaries.is_empty());
        r.mirror = DEFAULT_MIRROR.into();
        r.ca_bundle = None;
        assert_eq!(
            content_hash(&r),
            "ce8a0ce24f6dbfd3c85e58bb93b9415ecb0bbd952ba941d31e682aa0651772b3"
        );
        r.ca_bundle = Some(b"test-ca".to_vec());
        assert_eq!(
            content_hash(&r),
            "5626013068f798b78178050815e167035305d2672e77e27a5572f29ce4871f34"
        );
    }

    #[test]
    fn files_and_npm_binaries_are_hashed() {
        let ci = code_interpreter();
        let h = content_hash(&ci);
        assert_ne!(h, content_hash(&base()));

        let mut edited = ci.clone();
        edited.files[0].contents.push(b'\n');
        assert_ne!(h, content_hash(&edited));
        let mut mode = ci.clone();
        mode.files[0].mode = 0o600;
        assert_ne!(h, content_hash(&mode));
        let mut deno = ci.clone();
        deno.npm_binaries[0].version = "2.9.5".into();
        assert_ne!(h, content_hash(&deno));
        let mut no_files = ci.clone();
        no_files.files.clear();
        assert_ne!(h, content_hash(&no_files));
        // Moving bytes between a file's path and its contents changes the hash too.
        let mut a = ci.clone();
        a.files = vec![RecipeFile {
            path: "/ab".into(),
            mode: 0o644,
            contents: b"c".to_vec(),
        }];
        let mut b = a.clone();
        b.files[0].path = "/a".into();
        b.files[0].contents = b"bc".to_vec();
        assert_ne!(content_hash(&a), content_hash(&b));
    }

    #[test]
    fn code_interpreter_is_base_plus() {
        let (b, ci) = (base(), code_interpreter());
        assert!(KNOWN_TEMPLATES.contains(&CODE_INTERPRETER));
        assert!(ci.setup_script.starts_with(&b.setup_script));
        assert!(b.packages.iter().all(|p| ci.packages.contains(p)));
        assert!(b.packages.iter().any(|p| p == "python3-pip"));
        assert_eq!((&ci.suite, &ci.variant), (&b.suite, &b.variant));
        for f in &ci.files {
            rootfs_path(Path::new("/nonexistent-rootfs"), &f.path).unwrap();
        }
        let deno = &ci.npm_binaries[0];
        assert_eq!(deno.sha512.len(), 128);
        assert!(deno.sha512.chars().all(|c| c.is_ascii_hexdigit()));
    }

    fn file<'a>(r: &'a Recipe, path: &str) -> &'a [u8] {
        &r.files.iter().find(|f| f.path == path).unwrap().contents
    }

    #[test]
    fn kernelspecs() {
        let ci = code_interpreter();
        let spec = |name: &str| -> serde_json::Value {
            let path = format!("/usr/local/lib/airlock/kernels/{name}/kernel.json");
            serde_json::from_slice(file(&ci, &path)).unwrap()
        };
        let argv = |v: &serde_json::Value| -> Vec<String> {
            serde_json::from_value(v["argv"].clone()).unwrap()
        };

        let py = spec("python3");
        assert_eq!(py["language"], "python");
        assert_eq!(
            argv(&py),
            [
                "/usr/bin/python3",
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}",
                "--IPKernelApp.exec_files=/usr/local/lib/airlock/ipython_startup.py"
            ]
        );
        // The script the kernel runs is one the recipe installs.
        file(&ci, "/usr/local/lib/airlock/ipython_startup.py");

        let bash = spec("bash");
        assert_eq!(bash["language"], "bash");
        assert_eq!(
            argv(&bash)[1..],
            ["-m", "bash_kernel", "-f", "{connection_file}"]
        );

        let deno = spec("deno");
        assert_eq!(deno["language"], "typescript");
        assert_eq!(argv(&deno)[0], ci.npm_binaries[0].dest);
        assert_eq!(
            argv(&deno)[1..],
            ["jupyter", "--kernel", "--conn", "{connection_file}"]
        );
    }

    #[test]
    fn python_packages_are_pinned_with_hashes() {
        let ci = code_interpreter();
        let text = String::from_utf8(file(&ci, "/usr/local/lib/airlock/requirements.txt").to_vec())
            .unwrap();
        let mut pins = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some(hash) = line.trim().strip_prefix("--hash=sha256:") {
                assert_eq!(hash.len(), 64, "{line}");
            } else {
                let (name, version) = line.trim_end_matches(" \\").split_once("==").unwrap();
                assert!(
                    !version.is_empty() && !version.contains(['*', ' ']),
                    "{line}"
                );
                pins.push(name.to_owned());
            }
        }
        assert_eq!(text.matches("--hash=sha256:").count(), pins.len());
        for top in [
            "ipykernel",
            "numpy",
            "pandas",
            "matplotlib",
            "seaborn",
            "openpyxl",
            "scikit-learn",
            "bash-kernel",
            "jupyter-client",
        ] {
            assert!(pins.iter().any(|p| p == top), "{top} is not pinned");
        }
    }

    #[tokio::test]
    async fn files_stay_inside_the_rootfs() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for bad in ["relative", "/a/../b", "/a//b", "/a/./b", "/"] {
            assert!(rootfs_path(root, bad).is_err(), "{bad}");
        }
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        assert!(rootfs_path(root, "/link/passwd").is_err());

        let f = RecipeFile {
            path: "/usr/local/lib/x/y.txt".into(),
            mode: 0o640,
            contents: b"hi".to_vec(),
        };
        write_file(root, &f).await.unwrap();
        let p = root.join("usr/local/lib/x/y.txt");
        assert_eq!(std::fs::read(&p).unwrap(), b"hi");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        let d = std::fs::metadata(root.join("usr/local")).unwrap();
        assert_eq!(d.permissions().mode() & 0o7777, 0o755);
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
