//! `airlock template build -f Dockerfile -n NAME [CONTEXT]`: builds a Dockerfile on the running
//! server through the same API the SDK's template builder uses (`POST /v3/templates`, the COPY
//! uploads, `POST /v2/templates/{id}/builds/{build}`, then the build's status and logs).

use crate::cli::CliError;
use crate::client::Client;
use crate::term;
use crate::dockerfile::{self, PlanStep};
use airlock_core::build::copy::{check_source, source_base};
use airlock_core::template::KNOWN_TEMPLATES;
use airlock_wire::templates::{
    BuildStatusBody, TemplateBuildCreated, TemplateBuildRequest, TemplateBuildStart,
    TemplateFileUpload, TemplateStep,
};
use axum::body::Body;
use sha2::{Digest, Sha256};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub struct DockerfileBuild {
    pub dockerfile: PathBuf,
    pub name: String,
    /// Where COPY's sources are; the Dockerfile's directory by default.
    pub context: Option<PathBuf>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u32>,
    /// A command that must succeed before the start command counts as ready.
    pub ready_cmd: Option<String>,
    /// Run every step again, cached or not.
    pub no_cache: bool,
    /// `--build-arg NAME=VALUE`: values for the Dockerfile's `ARG`s.
    pub build_args: std::collections::BTreeMap<String, String>,
}

pub async fn run(client: Client, opts: DockerfileBuild) -> Result<ExitCode, CliError> {
    let started = Instant::now();
    let text = std::fs::read_to_string(&opts.dockerfile)
        .map_err(|e| CliError::Failed(format!("reading {}: {e}", opts.dockerfile.display())))?;
    let plan = dockerfile::plan(&text, &opts.build_args)
        .map_err(|e| CliError::Failed(format!("{}: {e}", opts.dockerfile.display())))?;
    for note in &plan.ignored {
        eprintln!("{}: ignored {note}", opts.dockerfile.display());
    }
    let context = match &opts.context {
        Some(dir) => dir.clone(),
        None => opts
            .dockerfile
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned(),
    };

    // Every COPY's files are packed (so a missing source fails) before anything is made.
    let (steps, packed) = wire_steps(&plan, &context, opts.no_cache, tar::HeaderMode::Complete)?;

    let request = TemplateBuildRequest {
        name: Some(opts.name.clone()),
        cpu_count: opts.cpu_count,
        memory_mb: opts.memory_mb,
        ..TemplateBuildRequest::default()
    };
    let created: TemplateBuildCreated =
        parse(&client.call_json("POST", "/v3/templates", &request).await?)?;
    let (template, build) = (&created.template_id, &created.build_id);
    for files in &packed {
        upload(&client, template, files).await?;
    }
    // `FROM base` builds on the built-in, as `from_template("base")` does.
    let built_in = KNOWN_TEMPLATES.contains(&plan.from_image.as_str());
    let (from_template, from_image) = match built_in {
        true => (Some(plan.from_image), None),
        false => (None, Some(plan.from_image)),
    };
    let definition = TemplateBuildStart {
        from_template,
        from_image,
        steps,
        force: opts.no_cache,
        start_cmd: plan.start_cmd,
        ready_cmd: opts.ready_cmd,
        ..TemplateBuildStart::default()
    };
    let path = format!("/v2/templates/{template}/builds/{build}");
    client.call_json("POST", &path, &definition).await?;
    println!(
        "building {} (template {template}, build {build})",
        opts.name
    );
    follow(&client, template, build, started).await
}

/// The plan's steps as the SDK sends them, with every COPY's files packed from `context`
/// (`headers`: whether the archive keeps the files' times and owners, or is the same bytes for
/// the same contents).
pub(crate) fn wire_steps(
    plan: &dockerfile::Plan,
    context: &Path,
    force: bool,
    headers: tar::HeaderMode,
) -> Result<(Vec<TemplateStep>, Vec<Packed>), CliError> {
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

/// Prints the build's log as it grows, each line with the seconds since the command began,
/// until the build is ready (exit 0) or failed (exit 1, with the server's reason). On a
/// terminal, a spinner below the log shows the step under way and how long it has taken.
async fn follow(
    client: &Client,
    template: &str,
    build: &str,
    started: Instant,
) -> Result<ExitCode, CliError> {
    let spinner = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        spinner.set_style(style);
    }
    spinner.enable_steady_tick(Duration::from_millis(120));
    let mut offset = 0;
    let mut current_step = None;
    let outcome = loop {
        let path = format!("/templates/{template}/builds/{build}/status?logsOffset={offset}");
        let answer = client.call("GET", &path).await.map_err(CliError::from);
        let status: BuildStatusBody = match answer.and_then(|b| parse(&b)) {
            Ok(status) => status,
            Err(e) => break Err(e),
        };
        offset += status.log_entries.len();
        for entry in &status.log_entries {
            let step = entry.step.as_deref().unwrap_or("");
            let line = format!(
                "{:>7.1}s {step:>8} | {}",
                started.elapsed().as_secs_f64(),
                entry.message
            );
            spinner.suspend(|| println!("{}", term::cell(&line)));
            if current_step.as_deref() != Some(step) {
                current_step = Some(step.to_owned());
                let what: String = entry
                    .message
                    .lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(70)
                    .collect();
                spinner.reset_elapsed();
                spinner.set_message(term::cell(&format!("step {step}: {what}")).into_owned());
            }
        }
        match status.status.as_str() {
            "ready" => break Ok(ExitCode::SUCCESS),
            "error" => {
                let reason = status.reason.map(|r| r.message).unwrap_or_default();
                break Err(CliError::Failed(format!("the build failed: {reason}")));
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    };
    spinner.finish_and_clear();
    outcome
}

/// What one COPY takes from the context, packed as a tar, and the hash that names it.
pub(crate) struct Packed {
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

fn pack(context: &Path, src: &str, dest: &str, mode: tar::HeaderMode) -> Result<Packed, CliError> {
    let failed = |e: std::io::Error| CliError::Failed(format!("COPY {src}: {e}"));
    let base = copy_base(src)?;
    through_no_link(context, &base).map_err(|link| {
        CliError::Failed(format!(
            "COPY {src}: {} is a symbolic link, which a COPY source may not pass through \
             (links are packed as links, never followed out of the context)",
            link.display()
        ))
    })?;
    let on_disk = context.join(&base);
    if std::fs::symlink_metadata(&on_disk).is_err() {
        return Err(CliError::Failed(format!(
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
    fn read(context: &Path) -> Result<Self, CliError> {
        let file = context.join(".dockerignore");
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(CliError::Failed(format!("reading {}: {e}", file.display()))),
        };
        Self::parse(&text).map_err(|e| CliError::Failed(format!("{}: {e}", file.display())))
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

/// Uploads packed files unless the server has them already (from an earlier build).
async fn upload(client: &Client, template: &str, files: &Packed) -> Result<(), CliError> {
    let src = &files.src;
    let path = format!("/templates/{template}/files/{}", files.hash);
    let link: TemplateFileUpload = parse(&client.call("GET", &path).await?)?;
    if link.present {
        println!("COPY {src}: the server has these files already");
        return Ok(());
    }
    let url = link
        .url
        .ok_or_else(|| CliError::Failed(format!("COPY {src}: the server gave no upload link")))?;
    let archive = files
        .reader()
        .map_err(|e| CliError::Failed(format!("COPY {src}: {e}")))?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(archive));
    let req = hyper::Request::put(&url)
        .body(Body::from_stream(stream))
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let resp = client.send(req).await?;
    if !resp.status().is_success() {
        return Err(CliError::Failed(format!(
            "COPY {src}: the upload was refused ({})",
            resp.status()
        )));
    }
    Ok(())
}

/// What a COPY packs: its source up to any glob (the build sandbox matches the glob itself).
/// Never outside the context.
fn copy_base(src: &str) -> Result<PathBuf, CliError> {
    check_source(src).map_err(CliError::Failed)?;
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

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, CliError> {
    serde_json::from_slice(body)
        .map_err(|e| CliError::Failed(format!("the server's answer was not understood: {e}")))
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

        let Err(CliError::Failed(err)) = pack("app/out/secret.txt") else {
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
