//! The MCP tools: what each takes (a struct whose doc comments become the JSON schema a model
//! reads), and the list `tools/list` answers with.

use rmcp::handler::server::common::schema_for_type;
use rmcp::model::{JsonObject, Tool};
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::Arc;

/// The template a session's sandbox starts from: it has the code interpreter `run_code` needs.
pub const DEFAULT_TEMPLATE: &str = "code-interpreter-v1";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// The template to start from [default: code-interpreter-v1, Python with pandas and
    /// matplotlib, which `run_code` needs].
    pub template: Option<String>,
    /// Seconds the sandbox lives without a call [default: the MCP server's, 15 minutes].
    pub timeout: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// The code to run. Variables, imports and files persist between calls in the same
    /// sandbox, as in a Jupyter notebook. A chart (matplotlib's plt.show() or a figure as the
    /// last expression) comes back as an image.
    pub code: String,
    /// python (default), javascript, typescript, r or bash.
    pub language: Option<String>,
    /// The sandbox to run in [default: this session's own, started on first use].
    pub sandbox_id: Option<String>,
    /// Seconds before the run is interrupted [default: 60]. The sandbox's state is kept.
    pub timeout: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// A shell command, run by bash as the user `user` (with sudo), e.g. `pip install polars`
    /// or `ls -la`.
    pub command: String,
    /// The working directory [default: /home/user].
    pub cwd: Option<String>,
    /// The sandbox to run in [default: this session's own].
    pub sandbox_id: Option<String>,
    /// Seconds before the command is killed [default: 60].
    pub timeout: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// The file's path in the sandbox, absolute or relative to /home/user.
    pub path: String,
    /// The sandbox [default: this session's own].
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    /// The file's path in the sandbox; missing directories are made.
    pub path: String,
    /// The file's whole new content, as text.
    pub content: String,
    /// The sandbox [default: this session's own].
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    /// The directory [default: /home/user].
    pub path: Option<String>,
    /// How many levels down to list [default: 1].
    pub depth: Option<u32>,
    /// The sandbox [default: this session's own].
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Upload {
    /// Where the file goes in the sandbox.
    pub path: String,
    /// The file's bytes, base64-encoded. Give this or local_path.
    pub content_base64: Option<String>,
    /// A file on the machine that runs `airlock mcp` (stdio only), sent as it is: in its files
    /// directory (`--files-dir`, by default where it started), relative to it or absolute.
    pub local_path: Option<String>,
    /// The sandbox [default: this session's own].
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Download {
    /// The file's path in the sandbox.
    pub path: String,
    /// Save it here, on the machine that runs `airlock mcp` (stdio only): in its files
    /// directory (`--files-dir`, by default where it started), relative to it or absolute;
    /// the directory the file goes in must exist. Without it the file comes back in the
    /// result: an image as an image, anything else base64-encoded.
    pub local_path: Option<String>,
    /// The sandbox [default: this session's own].
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillSandbox {
    /// The sandbox to kill [default: this session's own; the next call starts a fresh one].
    pub sandbox_id: Option<String>,
}

/// Every tool, as `tools/list` shows it.
pub fn list() -> Vec<Tool> {
    vec![
        Tool::new(
            "run_code",
            "Run code in a sandbox's stateful code interpreter (Python by default) and get back \
             its stdout, stderr, the value of its last expression, charts as images, and on \
             failure the error with its traceback. Use it for data analysis, calculations and \
             plots; files you upload or write are in /home/user.",
            schema::<RunCode>(),
        ),
        Tool::new(
            "run_command",
            "Run a shell command in the sandbox (a Debian Linux machine of its own) and get its \
             exit code, stdout and stderr. Use it to install packages or inspect files.",
            schema::<RunCommand>(),
        ),
        Tool::new(
            "read_file",
            "Read a text file from the sandbox (at most 1 MiB; use download for others).",
            schema::<ReadFile>(),
        ),
        Tool::new(
            "write_file",
            "Write a text file in the sandbox, replacing any file at that path.",
            schema::<WriteFile>(),
        ),
        Tool::new(
            "list_files",
            "List a directory in the sandbox: each entry's type, size and path.",
            schema::<ListFiles>(),
        ),
        Tool::new(
            "upload",
            "Put a file (any bytes, e.g. a CSV or an image) into the sandbox.",
            schema::<Upload>(),
        ),
        Tool::new(
            "download",
            "Get a file out of the sandbox, e.g. a chart or a result the code saved.",
            schema::<Download>(),
        ),
        Tool::new(
            "create_sandbox",
            "Start a new sandbox and make it this session's own: later calls without a \
             sandbox_id go to it. Not needed before the first call, which starts one.",
            schema::<CreateSandbox>(),
        ),
        Tool::new(
            "kill_sandbox",
            "Kill a sandbox and lose its state. Without a sandbox_id, this session's own; the \
             next call then starts a fresh one.",
            schema::<KillSandbox>(),
        ),
    ]
}

/// `T`'s JSON schema as a model reads it: without the keys that only name the Rust type
/// (`title`, `format: uint64`) or the draft, and each argument (the structs are flat) with its
/// description on one line and, if optional, its type alone (not `[type, "null"]`, which some
/// model APIs refuse; it is optional by not being required).
fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    use serde_json::Value;
    let mut object = (*schema_for_type::<T>()).clone();
    object.remove("$schema");
    object.remove("title");
    let properties = object.get_mut("properties").and_then(Value::as_object_mut);
    for argument in properties
        .into_iter()
        .flat_map(|p| p.values_mut())
        .filter_map(Value::as_object_mut)
    {
        argument.remove("format");
        if let Some(Value::Array(types)) = argument.get("type") {
            if let [t, null] = types.as_slice() {
                if null == "null" {
                    let t = t.clone();
                    argument.insert("type".into(), t);
                }
            }
        }
        if let Some(Value::String(d)) = argument.get_mut("description") {
            *d = d.split_whitespace().collect::<Vec<_>>().join(" ");
        }
    }
    Arc::new(object)
}

/// `arguments` as the tool's struct, or an error a model can act on.
pub fn arguments<T: serde::de::DeserializeOwned>(
    tool: &str,
    arguments: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<T, String> {
    let value = serde_json::Value::Object(arguments.unwrap_or_default());
    serde_json::from_value(value)
        .map_err(|e| format!("invalid arguments for {tool}: {e}. See the tool's input schema."))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// python/airlock-tools ships these same schemas for function calling; regenerate it with
    /// `airlock mcp --print-tools > python/airlock-tools/airlock_tools/tools.json`.
    #[test]
    fn the_python_package_has_the_current_tools() {
        let shipped: serde_json::Value = serde_json::from_str(include_str!(
            "../../../../python/airlock-tools/airlock_tools/tools.json"
        ))
        .unwrap();
        assert_eq!(
            shipped,
            serde_json::to_value(list()).unwrap(),
            "python/airlock-tools/airlock_tools/tools.json is stale: run \
             `airlock mcp --print-tools > python/airlock-tools/airlock_tools/tools.json`"
        );
    }

    #[test]
    fn bad_arguments_are_explained() {
        let missing = arguments::<RunCode>("run_code", None).unwrap_err();
        assert!(missing.contains("missing field `code`"), "{missing}");
        let args = serde_json::json!({"code": 1}).as_object().cloned();
        let wrong = arguments::<RunCode>("run_code", args).unwrap_err();
        assert!(wrong.contains("invalid type"), "{wrong}");
        let args = serde_json::json!({"code": "1", "cod": 1})
            .as_object()
            .cloned();
        let unknown = arguments::<RunCode>("run_code", args).unwrap_err();
        assert!(unknown.contains("unknown field `cod`"), "{unknown}");
    }
}
