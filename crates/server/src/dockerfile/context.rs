//! A build context, packed for a Dockerfile's COPYs: each COPY's files as a tar archive named
//! by its hash (the SDK's `filesHash`), with the plan's steps as the SDK sends them. Nothing
//! is followed out of the context, and `.dockerignore` is heeded.

use super::{Plan, PlanStep};
use airlock_core::build::copy::{check_source, source_base};
use airlock_wire::templates::TemplateStep;
use sha2::{Digest, Sha256};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Why the context could not be packed (a COPY's source, or `.dockerignore`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ContextError(String);

/// The plan's steps as the SDK sends them, with every COPY's files packed from `context`
/// (`headers`: whether the archive keeps the files' times and owners, or is the same bytes for
/// the same contents).
pub fn wire_steps(
    plan: &Plan,
    context: &Path,
    force: bool,
    headers: tar::HeaderMode,
) -> Result<(Vec<TemplateStep>, Vec<Packed>), ContextError> {
    let mut packed = Vec::new();
    let mut steps = Vec::new();
    for step in &plan.steps {
        let (kind, args, files_hash) = match step {
            PlanStep::Run(command) => ("RUN", vec![command.clone()], None),
            PlanStep::Env(pairs) => {
                let args = pairs.iter().flat_map(|(k, v)| [k.clone(), v.clone()]);
                ("ENV", args.collect(), None)
            }
            PlanStep::Workdir(dir) => ("WORKDIR", vec![dir.clone()], None),
            PlanStep::User(user) => ("USER", vec![user.clone()], None),
            PlanStep::Copy {
                src,
                dest,
                owner,
                mode,
            } => {
                let files = pack(context, src, dest, headers)?;
                let hash = files.hash.clone();
                packed.push(files);
                let args = vec![src.clone(), dest.clone(), owner.clone(), mode.clone()];
                ("COPY", args, Some(hash))
            }
        };
        steps.push(TemplateStep {
            kind: kind.into(),
            args,
            force,
            files_hash,
        });
    }

    Ok((steps, packed))
}

/// What one COPY takes from the context, packed as a tar, and the hash that names it.
pub struct Packed {
    pub src: String,
    pub hash: String,
    pub archive: std::fs::File,
}

impl Packed {
    /// The archive, read from its start.
    pub fn reader(&self) -> std::io::Result<std::fs::File> {
        let mut file = self.archive.try_clone()?;
        file.seek(SeekFrom::Start(0))?;
        Ok(file)
    }
}

fn pack(
    context: &Path,
    src: &str,
    dest: &str,
    mode: tar::HeaderMode,
) -> Result<Packed, ContextError> {
    let failed = |e: std::io::Error| ContextError(format!("COPY {src}: {e}"));
    let base = copy_base(src)?;
    through_no_link(context, &base).map_err(|link| {
        ContextError(format!(
            "COPY {src}: {} is a symbolic link, which a COPY source may not pass through \
             (links are packed as links, never followed out of the context)",
            link.display()
        ))
    })?;
    let on_disk = context.join(&base);
    if std::fs::symlink_metadata(&on_disk).is_err() {
        return Err(ContextError(format!(
            "COPY {src}: {} is not in the build context {}",
            base.display(),
            context.display()
        )));
    }
    let ignore = DockerIgnore::read(context)?;
    let mut hasher = Sha256::new();
    for part in [src, "\0", dest, "\0"] {
        hasher.update(part.as_bytes());
    }
    let mut archive = tempfile::tempfile().map_err(failed)?;
    let mut tar = tar::Builder::new(Hashing {
        out: &mut archive,
        hasher: &mut hasher,
    });
    tar.follow_symlinks(false);
    tar.mode(mode);
    let packing = Packing {
        context,
        ignore: &ignore,
    };
    if base == Path::new(".") {
        packing.children(&mut tar, Path::new("")).map_err(failed)?;
    } else {
        packing.append(&mut tar, &base).map_err(failed)?;
    }
    tar.into_inner().map_err(failed)?;
    Ok(Packed {
        src: src.to_owned(),
        hash: hex::encode(hasher.finalize()),
        archive,
    })
}

/// The directory on `base`'s way, relative to the context, that is a symbolic link, if any:
/// followed, it could lead out of the context (`app -> /etc`, then `COPY app/shadow`).
fn through_no_link(context: &Path, base: &Path) -> Result<(), PathBuf> {
    let mut rel = PathBuf::new();
    let parents = base.parent().into_iter().flat_map(Path::components);
    for part in parents {
        rel.push(part);
        let link = std::fs::symlink_metadata(context.join(&rel)).is_ok_and(|m| m.is_symlink());
        if link {
            return Err(rel);
        }
    }
    Ok(())
}

/// Puts context files into a COPY's archive: in name order (so the same files make the same
/// archive), symlinks as symlinks, and nothing `.dockerignore` excludes.
struct Packing<'a> {
    context: &'a Path,
    ignore: &'a DockerIgnore,
}

impl Packing<'_> {
    /// `rel` (relative to the context), and below it if it is a directory. An excluded
    /// directory is still walked, for the exceptions (`!dir/keep`) inside it.
    fn append(&self, tar: &mut tar::Builder<Hashing<'_>>, rel: &Path) -> std::io::Result<()> {
        let path = self.context.join(rel);
        let excluded = self.ignore.excludes(rel);
        if std::fs::symlink_metadata(&path)?.is_dir() {
            if !excluded {
                tar.append_dir(rel, &path)?;
            }
            self.children(tar, rel)
        } else if excluded {
            Ok(())
        } else {
            tar.append_path_with_name(&path, rel)
        }
    }

    fn children(&self, tar: &mut tar::Builder<Hashing<'_>>, rel: &Path) -> std::io::Result<()> {
        let mut names: Vec<_> = std::fs::read_dir(self.context.join(rel))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for name in names {
            self.append(tar, &rel.join(name))?;
        }
        Ok(())
    }
}

/// The context's `.dockerignore`, read by Docker's rules: a pattern a line (`#` comments),
/// relative to the context, `*` and `?` within a path component, `**` across them; a pattern
/// excludes what it matches and everything under it; `!` makes an exception; the last pattern
/// that matches a path decides.
#[derive(Default)]
struct DockerIgnore {
    rules: Vec<(globset::GlobMatcher, bool)>,
}

impl DockerIgnore {
    fn read(context: &Path) -> Result<Self, ContextError> {
        let file = context.join(".dockerignore");
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(ContextError(format!("reading {}: {e}", file.display()))),
        };
        Self::parse(&text).map_err(|e| ContextError(format!("{}: {e}", file.display())))
    }

    fn parse(text: &str) -> Result<Self, String> {
        let mut rules = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (pattern, exception) = match line.strip_prefix('!') {
                Some(rest) => (rest.trim(), true),
                None => (line, false),
            };
            let pattern = pattern
                .trim_start_matches("./")
                .trim_start_matches('/')
                .trim_end_matches('/');
            if pattern.is_empty() {
                continue;
            }
            let glob = globset::GlobBuilder::new(pattern)
                .literal_separator(true)
                .build()
                .map_err(|e| format!("the pattern '{line}': {e}"))?;
            rules.push((glob.compile_matcher(), exception));
        }
        Ok(DockerIgnore { rules })
    }

    /// Whether `rel` is left out: the last rule matching it, or a directory above it, decides.
    fn excludes(&self, rel: &Path) -> bool {
        let mut excluded = false;
        for (glob, exception) in &self.rules {
            if rel
                .ancestors()
                .any(|p| !p.as_os_str().is_empty() && glob.is_match(p))
            {
                excluded = !exception;
            }
        }
        excluded
    }
}

/// What a COPY packs: its source up to any glob (the build sandbox matches the glob itself).
/// Never outside the context.
fn copy_base(src: &str) -> Result<PathBuf, ContextError> {
    check_source(src).map_err(ContextError)?;
    Ok(PathBuf::from(source_base(src)))
}

/// Writes the archive and hashes it on the way, so its files are read once.
struct Hashing<'a> {
    out: &'a mut std::fs::File,
    hasher: &'a mut Sha256,
}

impl Write for Hashing<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(buf)?;
        self.hasher.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerignore_follows_dockers_rules() {
        let ignore = DockerIgnore::parse(
            "# build output\n/target\n*.log\nnode_modules/\n**/*.tmp\ndocs\n!docs/README.md\n",
        )
        .unwrap();
        let out = |p: &str| ignore.excludes(Path::new(p));
        assert!(out("target") && out("target/debug/x"));
        assert!(
            out("app.log") && !out("logs/app.log"),
            "* stays within a component"
        );
        assert!(out("node_modules/left-pad/index.js"));
        assert!(out("a/b/c.tmp") && out("c.tmp"));
        assert!(
            out("docs/guide.md") && !out("docs/README.md"),
            "the last match decides"
        );
        assert!(!out("src/main.rs") && !out("Dockerfile"));
        assert!(DockerIgnore::parse("[").is_err());
    }

    /// The entries of a packed archive: path, kind, link target, contents.
    fn entries(packed: &Packed) -> Vec<(String, tar::EntryType, String, String)> {
        let mut archive = tar::Archive::new(packed.reader().unwrap());
        let entries = archive.entries().unwrap().map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let link = e.link_name().unwrap().map(|l| l.display().to_string());
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text).unwrap();
            (
                path,
                e.header().entry_type(),
                link.unwrap_or_default(),
                text,
            )
        });
        entries.collect()
    }

    #[test]
    fn links_are_packed_as_links_and_never_followed_out_of_the_context() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "the host's secret").unwrap();
        let ctx = tmp.path().join("ctx");
        std::fs::create_dir_all(ctx.join("app")).unwrap();
        std::fs::write(ctx.join("app/main.py"), "print('hi')").unwrap();
        std::os::unix::fs::symlink(&outside, ctx.join("app/out")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", ctx.join("shadow")).unwrap();
        let pack = |src: &str| pack(&ctx, src, "/dst/", tar::HeaderMode::Deterministic);

        let Err(ContextError(err)) = pack("app/out/secret.txt") else {
            panic!("a path through a link to outside the context was packed");
        };
        assert!(err.contains("app/out is a symbolic link"), "{err}");

        let shadow = entries(&pack("shadow").unwrap());
        assert_eq!(
            shadow,
            [(
                "shadow".into(),
                tar::EntryType::Symlink,
                "/etc/shadow".into(),
                String::new()
            )]
        );
        // The whole context, and the directory holding the link: the link stays a link.
        for src in [".", "app/"] {
            let packed = entries(&pack(src).unwrap());
            let out = packed.iter().find(|e| e.0 == "app/out").expect(src);
            assert_eq!(
                (out.1, out.2.as_str()),
                (tar::EntryType::Symlink, outside.to_str().unwrap())
            );
            assert!(
                packed.iter().all(|e| !e.3.contains("secret")),
                "{src}: {packed:?}"
            );
            assert!(
                packed.iter().any(|e| e.3 == "print('hi')"),
                "{src}: the control"
            );
        }
    }

    #[test]
    fn a_copy_packs_what_its_source_names_and_never_climbs_out() {
        assert_eq!(copy_base("app/").unwrap(), Path::new("app"));
        assert_eq!(copy_base("./src/*.py").unwrap(), Path::new("src"));
        assert_eq!(copy_base("*.txt").unwrap(), Path::new("."));
        assert_eq!(copy_base(".").unwrap(), Path::new("."));
        for bad in ["../secret", "/etc/passwd", "a/../../b"] {
            assert!(copy_base(bad).is_err(), "{bad}");
        }
    }
}
