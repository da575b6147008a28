//! The built-in templates, `base` and `code-interpreter-v1`: Dockerfiles in the repository's
//! `templates/` directory, embedded in the binary and built when the server starts by the same
//! builder as users' templates (the same Dockerfile reading as `airlock template build -f`,
//! the same steps in build sandboxes, the same layer cache). After the first start every
//! step is cached, so a start finds them built in about a second.
//!
//! Two things only a built-in's Dockerfile may say: `FROM debian:SUITE` is Debian's minimal
//! root made with debootstrap from the host's apt mirror (no registry need be reachable), and
//! `FROM` naming another built-in builds on it.

use crate::dockerfile::context::wire_steps;
use crate::dockerfile::steps::step;
use crate::dockerfile::{self, Plan};
use airlock_core::build::{BuildBase, BuildDefinition, BuildJob, Builder};
use airlock_core::driver::Resources;
use airlock_core::ids::TemplateName;
use airlock_core::store::{BuildRecord, BuildStatus, Store};
use airlock_core::template::{BASE, CODE_INTERPRETER, KNOWN_TEMPLATES};
use anyhow::{anyhow, bail, Context};

/// One built-in: its name and its build context (the Dockerfile among the files), as
/// `(path in the context, contents)`.
struct Definition {
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
}

macro_rules! context_file {
    ($template:literal, $path:literal) => {
        (
            $path,
            include_str!(concat!("../../../../templates/", $template, "/", $path)),
        )
    };
}

/// In build order: each after the built-ins it is built on.
const BUILT_INS: &[Definition] = &[
    Definition {
        name: BASE,
        files: &[context_file!("base", "Dockerfile")],
    },
    Definition {
        name: CODE_INTERPRETER,
        files: &[
            context_file!("code-interpreter-v1", "Dockerfile"),
            context_file!("code-interpreter-v1", "requirements.txt"),
            context_file!("code-interpreter-v1", "ipython_startup.py"),
            context_file!("code-interpreter-v1", "kernels/python3/kernel.json"),
            context_file!("code-interpreter-v1", "kernels/bash/kernel.json"),
            context_file!("code-interpreter-v1", "kernels/deno/kernel.json"),
            context_file!("code-interpreter-v1", "kernels/ir/kernel.json"),
        ],
    },
];

/// Builds every built-in that is not built as its definition says (each step from the cache
/// where it can be), printing the build's log as it goes. Fails with the first build's error.
pub async fn ensure(builder: &Builder, store: &Store, resources: Resources) -> anyhow::Result<()> {
    for definition in BUILT_INS {
        build(builder, store, definition, resources)
            .await
            .with_context(|| format!("building the built-in template {}", definition.name))?;
    }
    Ok(())
}

async fn build(
    builder: &Builder,
    store: &Store,
    definition: &Definition,
    resources: Resources,
) -> anyhow::Result<()> {
    let name = TemplateName::parse(definition.name)?;
    let context = tempfile::tempdir()?;
    for (path, contents) in definition.files {
        let file = context.path().join(path);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&file, contents)?;
    }
    let dockerfile = definition
        .files
        .iter()
        .find(|(path, _)| *path == "Dockerfile")
        .map(|(_, text)| *text)
        .ok_or_else(|| anyhow!("no Dockerfile"))?;
    let plan = dockerfile::plan(dockerfile, &Default::default())
        .map_err(|e| anyhow!("its Dockerfile: {e}"))?;
    let base = base_of(&plan, store).await?;
    // The archives are the same bytes for the same files, so their COPY layers stay cached.
    let (wire, packed) = wire_steps(&plan, context.path(), false, tar::HeaderMode::Deterministic)
        .map_err(|e| anyhow!("{e}"))?;
    for files in &packed {
        let archive = tokio::fs::File::from_std(files.reader()?);
        builder.uploads.put(&name, &files.hash, archive).await?;
    }
    let steps = wire
        .iter()
        .enumerate()
        .map(|(i, s)| step(s).map_err(|e| anyhow!("step {}: {e}", i + 1)))
        .collect::<anyhow::Result<_>>()?;
    let build = BuildRecord {
        id: uuid::Uuid::new_v4().to_string(),
        template_id: name.clone(),
        status: BuildStatus::Waiting,
        failure: None,
        created_at: chrono::Utc::now().timestamp(),
        finished_at: None,
        tags: Vec::new(),
    };
    store.templates().insert_build(&build).await?;
    let job = BuildJob {
        build_id: build.id,
        owner: None,
        name: definition.name.to_owned(),
        published_as: name.clone(),
        template_id: name,
        definition: BuildDefinition {
            base,
            steps,
            force: false,
            start_cmd: plan.start_cmd,
            ready_cmd: None,
        },
        resources,
    };
    builder
        .build(&job, Some(definition.name))
        .await
        .map_err(|failure| anyhow!("{}", failure.message))
}

/// What a built-in's `FROM` names: `debian:SUITE`, or a built-in built before it.
async fn base_of(plan: &Plan, store: &Store) -> anyhow::Result<BuildBase> {
    let from = plan.from_image.as_str();
    if let Some(suite) = from.strip_prefix("debian:") {
        return Ok(BuildBase::Debian {
            suite: suite.to_owned(),
        });
    }
    if !KNOWN_TEMPLATES.contains(&from) {
        bail!("FROM {from}: a built-in starts from debian:SUITE or another built-in");
    }
    let record = store
        .templates()
        .get(&TemplateName::parse(from)?)
        .await?
        .ok_or_else(|| anyhow!("FROM {from}: that built-in is not built yet"))?;
    Ok(BuildBase::Template(record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(template: &str, path: &str) -> &'static str {
        BUILT_INS
            .iter()
            .find(|d| d.name == template)
            .and_then(|d| d.files.iter().find(|(p, _)| *p == path))
            .map(|(_, contents)| *contents)
            .unwrap()
    }

    #[test]
    fn every_built_in_is_defined_in_build_order() {
        let names: Vec<&str> = BUILT_INS.iter().map(|d| d.name).collect();
        assert_eq!(names, KNOWN_TEMPLATES);
        for (i, definition) in BUILT_INS.iter().enumerate() {
            let plan =
                dockerfile::plan(file(definition.name, "Dockerfile"), &Default::default()).unwrap();
            let from = plan.from_image.as_str();
            assert!(
                from.starts_with("debian:") || KNOWN_TEMPLATES[..i].contains(&from),
                "{}: FROM {from}",
                definition.name
            );
            // Their sandboxes run as E2B's do.
            let last: Vec<_> = plan.steps.iter().rev().take(2).collect();
            assert_eq!(
                last,
                [
                    &dockerfile::PlanStep::Workdir("/home/user".into()),
                    &dockerfile::PlanStep::User("user".into())
                ]
            );
        }
    }

    /// A file added to a built-in's directory but not to its context above would be missing from
    /// the built template, and nothing else would say so.
    #[test]
    fn every_file_of_a_built_in_is_in_its_context() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates");
        for definition in BUILT_INS {
            let dir = root.join(definition.name);
            let mut on_disk = Vec::new();
            let mut pending = vec![dir.clone()];
            while let Some(at) = pending.pop() {
                for entry in std::fs::read_dir(&at).unwrap().flatten() {
                    let path = entry.path();
                    if path.is_dir() {
                        pending.push(path);
                    } else {
                        let relative = path.strip_prefix(&dir).unwrap();
                        on_disk.push(relative.to_string_lossy().into_owned());
                    }
                }
            }
            on_disk.sort();
            let mut listed: Vec<String> = definition
                .files
                .iter()
                .map(|(p, _)| (*p).to_owned())
                .collect();
            listed.sort();
            assert_eq!(on_disk, listed, "{}", definition.name);
        }
    }

    #[test]
    fn base_has_what_e2bs_base_has() {
        let dockerfile = file(BASE, "Dockerfile");
        for package in ["ca-certificates", "curl", "git", "python3-pip", "sudo"] {
            assert!(dockerfile.contains(package), "{package}");
        }
    }

    #[test]
    fn kernelspecs() {
        let spec = |name: &str| -> serde_json::Value {
            serde_json::from_str(file(
                CODE_INTERPRETER,
                &format!("kernels/{name}/kernel.json"),
            ))
            .unwrap()
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
        // The script the kernel runs is where the Dockerfile puts it.
        assert!(file(CODE_INTERPRETER, "Dockerfile")
            .contains("COPY ipython_startup.py /usr/local/lib/airlock/ipython_startup.py"));
        let bash = spec("bash");
        assert_eq!(bash["language"], "bash");
        assert_eq!(
            argv(&bash)[1..],
            ["-m", "bash_kernel", "-f", "{connection_file}"]
        );
        let r = spec("ir");
        assert_eq!(r["language"], "R");
        assert_eq!(argv(&r).last().unwrap(), "{connection_file}");
        let deno = spec("deno");
        assert_eq!(deno["language"], "typescript");
        assert_eq!(
            argv(&deno),
            [
                "/usr/local/bin/deno",
                "jupyter",
                "--kernel",
                "--conn",
                "{connection_file}"
            ]
        );
    }

    #[test]
    fn python_packages_are_pinned_with_hashes() {
        let text = file(CODE_INTERPRETER, "requirements.txt");
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
}
