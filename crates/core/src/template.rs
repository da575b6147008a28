//! The built-in templates' names. Their definitions are Dockerfiles in the repository's
//! `templates/` directory, built by the same builder as users' templates (see the server's
//! `builtins` module) and visible to every key.

/// Debian 12 with what E2B's base template has.
pub const BASE: &str = "base";

/// The template `e2b_code_interpreter` asks for: `base` plus Jupyter kernels.
pub const CODE_INTERPRETER: &str = "code-interpreter-v1";

/// Every built-in, each after the ones it is built on.
pub const KNOWN_TEMPLATES: &[&str] = &[BASE, CODE_INTERPRETER];
