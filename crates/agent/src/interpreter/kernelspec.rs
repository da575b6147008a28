//! Jupyter kernelspecs (`<dir>/<name>/kernel.json`) and how a request's language picks one.

use jupyter_protocol::JupyterKernelspec;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the templates install their kernelspecs.
pub const DEFAULT_KERNELS_DIR: &str = "/usr/local/share/jupyter/kernels";
/// Overrides [`DEFAULT_KERNELS_DIR`] (tests, host runs).
pub const KERNELS_DIR_ENV: &str = "AIRLOCK_KERNELS_DIR";

/// Lowercases and trims a request's language, applying E2B's aliases (`js`, `ts`); no language
/// means Python.
pub fn normalize_language(language: Option<&str>) -> String {
    let lang = language.unwrap_or_default().trim().to_lowercase();
    match lang.as_str() {
        "" => "python".into(),
        "js" => "javascript".into(),
        "ts" => "typescript".into(),
        _ => lang,
    }
}

/// The kernelspec `language` values that can serve a normalised request language, best first.
/// JavaScript and TypeScript both run on Deno's kernel (which reports "typescript"); E2B's SDK
/// tests also ask for "deno" by name.
fn kernel_languages(language: &str) -> Vec<&str> {
    match language {
        "javascript" | "typescript" | "deno" => vec!["typescript", "javascript"],
        other => vec![other],
    }
}

/// How a kernel's environment is changed from inside it (see `envcode.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Python,
    Bash,
    /// Deno's kernel: `Deno.env`.
    Deno,
    /// A Node-based kernel (IJavascript): `process.env`.
    Node,
    /// IRkernel: `Sys.setenv`.
    R,
    /// A kernel we cannot set variables in; per-run env vars are ignored.
    Other,
}

impl Dialect {
    /// Whether the kernel may publish a run's output after reporting it idle (Deno sends stream
    /// and result messages through a separate task, racing the status message).
    pub fn late_output(self) -> bool {
        matches!(self, Dialect::Deno | Dialect::Node)
    }

    /// Whether the kernel sends a cell's visible values as `display_data`, not as Jupyter's
    /// `execute_result` (IRkernel does): its last display, if no output follows, is the value
    /// of the cell's last expression, the main result E2B reports for it.
    pub fn values_as_display(self) -> bool {
        matches!(self, Dialect::R)
    }
}

/// One installed kernelspec.
#[derive(Debug, Clone)]
pub struct Kernelspec {
    /// The directory name, e.g. `python3`.
    pub name: String,
    pub dir: PathBuf,
    pub spec: JupyterKernelspec,
}

impl Kernelspec {
    /// Whether interrupts go as an `interrupt_request` on the control channel (else SIGINT).
    pub fn interrupt_by_message(&self) -> bool {
        match self.spec.interrupt_mode.as_deref() {
            Some(mode) => mode == "message",
            // Deno's kernel ignores SIGINT but honours interrupt_request, though the kernelspec
            // `deno jupyter --install` writes does not say so.
            None => self.dialect() == Dialect::Deno,
        }
    }

    pub fn dialect(&self) -> Dialect {
        let program = self
            .spec
            .argv
            .first()
            .map(|a| {
                Path::new(a)
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
            })
            .unwrap_or_default();
        match self.spec.language.to_lowercase().as_str() {
            "python" => Dialect::Python,
            "bash" => Dialect::Bash,
            "typescript" | "javascript" if program == "deno" => Dialect::Deno,
            "typescript" | "javascript" => Dialect::Node,
            "r" => Dialect::R,
            _ => Dialect::Other,
        }
    }

    /// The command line, with `{connection_file}` and `{resource_dir}` filled in.
    pub fn argv(&self, connection_file: &Path) -> Vec<OsString> {
        self.spec
            .argv
            .iter()
            .map(|arg| {
                if arg == "{connection_file}" {
                    connection_file.as_os_str().to_owned()
                } else {
                    let dir = self.dir.to_string_lossy();
                    OsString::from(
                        arg.replace("{resource_dir}", &dir)
                            .replace("{connection_file}", &connection_file.to_string_lossy()),
                    )
                }
            })
            .collect()
    }
}

/// The kernelspecs found at startup, sorted by name.
#[derive(Debug, Clone, Default)]
pub struct Kernelspecs(Vec<Kernelspec>);

impl Kernelspecs {
    /// Reads `$AIRLOCK_KERNELS_DIR`, else [`DEFAULT_KERNELS_DIR`].
    pub fn discover() -> Kernelspecs {
        let dir = std::env::var_os(KERNELS_DIR_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_KERNELS_DIR));
        Kernelspecs::load(&dir)
    }

    /// Reads every `<dir>/<name>/kernel.json`; unreadable or invalid specs are skipped.
    pub fn load(dir: &Path) -> Kernelspecs {
        let mut specs = Vec::new();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Kernelspecs(specs);
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let file = path.join("kernel.json");
            let Ok(text) = std::fs::read(&file) else {
                continue;
            };
            match serde_json::from_slice::<JupyterKernelspec>(&text) {
                Ok(spec) if !spec.argv.is_empty() => specs.push(Kernelspec {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    dir: path,
                    spec,
                }),
                Ok(_) => tracing::warn!("kernelspec {}: empty argv", file.display()),
                Err(e) => tracing::warn!("kernelspec {}: {e}", file.display()),
            }
        }
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        Kernelspecs(specs)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|k| k.name.as_str()).collect()
    }

    /// The kernelspec for a normalised language, if one is installed.
    pub fn for_language(&self, language: &str) -> Option<&Kernelspec> {
        kernel_languages(language).into_iter().find_map(|want| {
            self.0
                .iter()
                .find(|k| k.spec.language.eq_ignore_ascii_case(want))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_spec(root: &Path, name: &str, json: &str) {
        std::fs::create_dir_all(root.join(name)).unwrap();
        std::fs::write(root.join(name).join("kernel.json"), json).unwrap();
    }

    #[test]
    fn normalises_languages() {
        assert_eq!(normalize_language(None), "python");
        assert_eq!(normalize_language(Some("")), "python");
        assert_eq!(normalize_language(Some("  ")), "python");
        assert_eq!(normalize_language(Some(" Python ")), "python");
        assert_eq!(normalize_language(Some("JS")), "javascript");
        assert_eq!(normalize_language(Some("ts")), "typescript");
        assert_eq!(normalize_language(Some("TypeScript")), "typescript");
        assert_eq!(normalize_language(Some("bash")), "bash");
        assert_eq!(normalize_language(Some("r")), "r");
    }

    #[test]
    fn loads_and_maps_kernelspecs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write_spec(
            root,
            "python3",
            r#"{"argv":["python3","-m","ipykernel_launcher","-f","{connection_file}"],
                "display_name":"Python 3","language":"python"}"#,
        );
        write_spec(
            root,
            "deno",
            r#"{"argv":["/usr/bin/deno","jupyter","--kernel","--conn","{connection_file}"],
                "display_name":"Deno","language":"typescript"}"#,
        );
        write_spec(
            root,
            "bash",
            r#"{"argv":["python3","-m","bash_kernel","-f","{connection_file}"],
                "display_name":"Bash","language":"bash","interrupt_mode":"message"}"#,
        );
        write_spec(root, "broken", "{not json");
        write_spec(
            root,
            "empty",
            r#"{"argv":[],"display_name":"x","language":"x"}"#,
        );
        std::fs::create_dir_all(root.join("no-json")).unwrap();

        let specs = Kernelspecs::load(root);
        assert_eq!(specs.names(), vec!["bash", "deno", "python3"]);
        assert_eq!(specs.for_language("python").unwrap().name, "python3");
        assert_eq!(specs.for_language("javascript").unwrap().name, "deno");
        assert_eq!(specs.for_language("typescript").unwrap().name, "deno");
        assert_eq!(specs.for_language("deno").unwrap().name, "deno");
        assert_eq!(specs.for_language("bash").unwrap().name, "bash");
        assert!(specs.for_language("r").is_none());

        let deno = specs.for_language("javascript").unwrap();
        assert_eq!(deno.dialect(), Dialect::Deno);
        assert!(deno.interrupt_by_message());
        assert!(deno.dialect().late_output());
        let bash = specs.for_language("bash").unwrap();
        assert_eq!(bash.dialect(), Dialect::Bash);
        assert!(bash.interrupt_by_message());
        let python = specs.for_language("python").unwrap();
        assert_eq!(python.dialect(), Dialect::Python);
        assert!(!python.interrupt_by_message());
        assert!(!python.dialect().late_output());
        assert_eq!(
            python.argv(Path::new("/tmp/c.json")),
            ["python3", "-m", "ipykernel_launcher", "-f", "/tmp/c.json"]
                .map(OsString::from)
                .to_vec()
        );
    }

    #[test]
    fn missing_dir_means_no_kernels() {
        assert!(Kernelspecs::load(Path::new("/nonexistent/kernels")).is_empty());
    }
}
