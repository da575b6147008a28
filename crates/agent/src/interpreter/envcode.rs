//! Environment variables inside a running kernel.
//!
//! A kernel is a long-lived process, so the sandbox's env vars (which `/init` may deliver after the
//! kernel started) and a run's own `env_vars` are applied by executing a small hidden snippet in
//! the kernel's language (`silent`, no history, so the execution counter does not move). Per-run
//! values are reverted after the run to the value the variable has at rest: the sandbox's value,
//! else the kernel's launch value, else unset.

use super::kernelspec::Dialect;
use std::collections::BTreeMap;

/// A variable change: `Some(value)` sets it, `None` removes it.
pub type Changes = BTreeMap<String, Option<String>>;

/// Why a variable cannot be set in a kernel.
pub fn check(dialect: Dialect, name: &str, value: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("environment variable names must not be empty".into());
    }
    if name.contains('=') || name.contains('\0') {
        return Err(format!(
            "invalid environment variable name {name:?}: it contains '=' or NUL"
        ));
    }
    if value.contains('\0') {
        return Err(format!(
            "invalid value for environment variable {name:?}: it contains NUL"
        ));
    }
    let shell_name = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if dialect == Dialect::Bash && !shell_name {
        return Err(format!(
            "invalid environment variable name {name:?} for bash: use letters, digits and '_'"
        ));
    }
    Ok(())
}

/// Code that applies `changes` in a kernel of the given dialect; `None` when there is nothing to
/// do or the dialect has no way to do it. Values are embedded as string literals, so any text is
/// safe; names must have passed [`check`].
pub fn snippet(dialect: Dialect, changes: &Changes) -> Option<String> {
    if changes.is_empty() {
        return None;
    }
    let sets: BTreeMap<&str, &str> = changes
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.as_deref()?)))
        .collect();
    let unsets: Vec<&str> = changes
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k.as_str())
        .collect();
    let lit = |s: &str| serde_json::Value::from(s).to_string();
    let code = match dialect {
        // JSON string literals are valid Python and JavaScript string literals.
        // The lambda keeps the snippet from leaving names behind in the user's namespace.
        Dialect::Python => format!(
            "(lambda e: (e.update({}), [e.pop(k, None) for k in {}]))(__import__('os').environ)",
            serde_json::to_string(&sets).ok()?,
            serde_json::to_string(&unsets).ok()?,
        ),
        Dialect::Bash => {
            let mut parts: Vec<String> = sets
                .iter()
                .map(|(k, v)| format!("export {k}={}", bash_quote(v)))
                .collect();
            parts.extend(unsets.iter().map(|k| format!("unset {k}")));
            parts.join("; ")
        }
        Dialect::Deno => {
            let mut parts: Vec<String> = sets
                .iter()
                .map(|(k, v)| format!("Deno.env.set({}, {});", lit(k), lit(v)))
                .collect();
            parts.extend(
                unsets
                    .iter()
                    .map(|k| format!("Deno.env.delete({});", lit(k))),
            );
            parts.join(" ")
        }
        Dialect::Node => {
            let mut parts: Vec<String> = sets
                .iter()
                .map(|(k, v)| format!("process.env[{}] = {};", lit(k), lit(v)))
                .collect();
            parts.extend(
                unsets
                    .iter()
                    .map(|k| format!("delete process.env[{}];", lit(k))),
            );
            parts.join(" ")
        }
        // JSON string literals are valid R ones too (R knows the same escapes, and NUL, which
        // R strings cannot hold, was refused by `check`). `invisible` keeps R from printing.
        Dialect::R => {
            let mut parts: Vec<String> = Vec::new();
            if !sets.is_empty() {
                let args: Vec<String> = sets
                    .iter()
                    .map(|(k, v)| format!("{} = {}", lit(k), lit(v)))
                    .collect();
                parts.push(format!("invisible(Sys.setenv({}))", args.join(", ")));
            }
            if !unsets.is_empty() {
                let names: Vec<String> = unsets.iter().map(|k| lit(k)).collect();
                parts.push(format!("invisible(Sys.unsetenv(c({})))", names.join(", ")));
            }
            parts.join("; ")
        }
        Dialect::Other => return None,
    };
    Some(code)
}

/// Bash ANSI-C quoting (`$'...'`): the whole value stays on one line, whatever it contains.
fn bash_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    out.push_str("$'");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            c if (c as u32) < 0x20 || c == '\x7f' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// What a kernel's environment holds, so the right changes can be computed for each run.
#[derive(Debug, Clone)]
pub struct EnvState {
    dialect: Dialect,
    /// The launch environment without the sandbox's variables (PATH, HOME, kernelspec env...).
    base: BTreeMap<String, String>,
    /// The sandbox variables the kernel currently has.
    applied: BTreeMap<String, String>,
}

impl EnvState {
    pub fn new(
        dialect: Dialect,
        base: BTreeMap<String, String>,
        globals: &BTreeMap<String, String>,
    ) -> Self {
        EnvState {
            dialect,
            base,
            applied: Self::usable(dialect, globals),
        }
    }

    fn usable(dialect: Dialect, vars: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        vars.iter()
            .filter(|(k, v)| check(dialect, k, v).is_ok())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The value `key` has outside of a run.
    fn resting(&self, key: &str) -> Option<String> {
        self.applied
            .get(key)
            .or_else(|| self.base.get(key))
            .cloned()
    }

    /// Changes to make before a run: bring the sandbox variables up to date, then apply the run's
    /// own (already checked) variables on top.
    pub fn before(
        &mut self,
        globals: &BTreeMap<String, String>,
        per_run: &BTreeMap<String, String>,
    ) -> Changes {
        let globals = Self::usable(self.dialect, globals);
        let mut changes = Changes::new();
        for (k, v) in &globals {
            if self.applied.get(k) != Some(v) {
                changes.insert(k.clone(), Some(v.clone()));
            }
        }
        for k in self.applied.keys() {
            if !globals.contains_key(k) {
                changes.insert(k.clone(), self.base.get(k).cloned());
            }
        }
        self.applied = globals;
        for (k, v) in per_run {
            changes.insert(k.clone(), Some(v.clone()));
        }
        changes
    }

    /// Changes that revert a run's own variables.
    pub fn after(&self, per_run: &BTreeMap<String, String>) -> Changes {
        per_run
            .keys()
            .map(|k| (k.clone(), self.resting(k)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn changes(pairs: &[(&str, Option<&str>)]) -> Changes {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    #[test]
    fn checks_names_and_values() {
        assert!(check(Dialect::Python, "A", "x").is_ok());
        assert!(check(Dialect::Python, "my-var", "x").is_ok());
        assert!(check(Dialect::Bash, "my-var", "x").is_err());
        assert!(check(Dialect::Bash, "1A", "x").is_err());
        assert!(check(Dialect::Bash, "_A1", "x").is_ok());
        assert!(check(Dialect::Python, "", "x").is_err());
        assert!(check(Dialect::Python, "A=B", "x").is_err());
        assert!(check(Dialect::Deno, "A", "x\0y").is_err());
    }

    #[test]
    fn python_snippet_quotes_values() {
        let c = changes(&[("A", Some("it's \"q\"\n\\ é")), ("B", None)]);
        let code = snippet(Dialect::Python, &c).unwrap();
        assert_eq!(
            code,
            r#"(lambda e: (e.update({"A":"it's \"q\"\n\\ é"}), [e.pop(k, None) for k in ["B"]]))(__import__('os').environ)"#
        );
        assert!(!code.contains('\n'));
    }

    #[test]
    fn bash_snippet_uses_ansi_c_quoting() {
        let c = changes(&[("A", Some("it's $HOME `x`\n\\\t")), ("B", None)]);
        assert_eq!(
            snippet(Dialect::Bash, &c).unwrap(),
            r"export A=$'it\'s $HOME `x`\x0a\\\x09'; unset B"
        );
        assert_eq!(bash_quote(""), "$''");
    }

    #[test]
    fn deno_and_node_snippets() {
        let c = changes(&[("A", Some("x\"y\n")), ("B", None)]);
        assert_eq!(
            snippet(Dialect::Deno, &c).unwrap(),
            r#"Deno.env.set("A", "x\"y\n"); Deno.env.delete("B");"#
        );
        assert_eq!(
            snippet(Dialect::Node, &c).unwrap(),
            r#"process.env["A"] = "x\"y\n"; delete process.env["B"];"#
        );
        assert_eq!(
            snippet(Dialect::R, &c).unwrap(),
            r#"invisible(Sys.setenv("A" = "x\"y\n")); invisible(Sys.unsetenv(c("B")))"#
        );
        assert!(snippet(Dialect::Other, &c).is_none());
        assert!(snippet(Dialect::Python, &Changes::new()).is_none());
    }

    #[test]
    fn syncs_globals_and_reverts_runs() {
        let base = map(&[("PATH", "/bin"), ("HOME", "/home/user")]);
        let mut env = EnvState::new(Dialect::Python, base, &map(&[("G", "1"), ("OLD", "x")]));

        // Nothing changed, no per-run vars: nothing to do.
        assert!(env
            .before(&map(&[("G", "1"), ("OLD", "x")]), &map(&[]))
            .is_empty());

        // /init changed G, dropped OLD, added NEW; the run overrides PATH and sets its own R.
        let globals = map(&[("G", "2"), ("NEW", "n")]);
        let per_run = map(&[("PATH", "/opt"), ("R", "r"), ("G", "run")]);
        assert_eq!(
            env.before(&globals, &per_run),
            changes(&[
                ("G", Some("run")),
                ("NEW", Some("n")),
                ("OLD", None),
                ("PATH", Some("/opt")),
                ("R", Some("r")),
            ])
        );
        assert_eq!(
            env.after(&per_run),
            changes(&[("G", Some("2")), ("PATH", Some("/bin")), ("R", None)])
        );
        // Next run with the same globals: nothing to sync.
        assert!(env.before(&globals, &map(&[])).is_empty());
    }

    #[test]
    fn unusable_globals_are_skipped() {
        let mut env = EnvState::new(Dialect::Bash, BTreeMap::new(), &BTreeMap::new());
        let globals = map(&[("OK", "1"), ("not-ok", "2")]);
        assert_eq!(
            env.before(&globals, &map(&[])),
            changes(&[("OK", Some("1"))])
        );
    }
}
