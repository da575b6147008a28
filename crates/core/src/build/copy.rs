//! `COPY`: the uploaded archive is placed in the build sandbox (never unpacked on the host), and
//! a script run there as root unpacks it and puts the step's source where Docker would: a
//! directory's contents into the destination, a file into it (a destination ending in `/` or
//! an existing directory) or as it, with the step's owner and mode.
//!
//! The archive's entries are relative to the SDK's context directory, not to the source, so
//! the script takes what lies under the source's directory part (`app` for `app`, `src` for
//! `src/**/*.py`, the whole archive for `*.txt`), as E2B's own builder does.

use crate::store::TemplateDefaults;

/// Where the archive appears inside the build sandbox (put into the step's upper layer before
/// the sandbox boots; taken out of the layer after the step, see `Layers::keep`).
pub const INBOX: &str = ".airlock-copy";
pub const ARCHIVE: &str = "archive";

/// A `COPY` step, as the SDK sends it: `[src, dest, owner, mode]` and the files' hash.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CopyStep {
    pub src: String,
    pub dest: String,
    /// `user` or `user:group`; `None`: the current user.
    pub owner: Option<String>,
    /// Octal, as `0755`.
    pub mode: Option<String>,
    pub files_hash: String,
}

/// Refuses a COPY source that is not a path inside the build context.
pub fn check_source(src: &str) -> Result<(), String> {
    if src.is_empty() || src.starts_with('/') || src.split('/').any(|c| c == "..") {
        return Err(format!(
            "COPY's source must be a path inside the build context, not '{src}'"
        ));
    }
    Ok(())
}

/// The part of a COPY source before any glob: what its archive must hold, and what the script
/// takes from the unpacked archive (`.` for the whole of it).
pub fn source_base(src: &str) -> String {
    let parts: Vec<&str> = src
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .take_while(|c| !c.contains(['*', '?', '[', '{']))
        .collect();
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

impl CopyStep {
    /// Checks the SDK's arguments: a relative source inside the context, an octal mode.
    pub fn new(args: &[String], files_hash: &str) -> Result<CopyStep, String> {
        let [src, dest, owner, mode] = args else {
            return Err("COPY needs [src, dest, owner, mode]".into());
        };
        check_source(src)?;
        if dest.is_empty() {
            return Err("COPY needs a destination".into());
        }
        let octal = mode.len() <= 4 && mode.bytes().all(|b| (b'0'..=b'7').contains(&b));
        if !octal {
            return Err(format!("COPY's mode must be octal, as 0755, not '{mode}'"));
        }
        if [src, dest, owner].iter().any(|s| s.contains('\0')) {
            return Err("COPY's arguments cannot contain NUL".into());
        }
        Ok(CopyStep {
            src: src.clone(),
            dest: dest.clone(),
            owner: (!owner.is_empty()).then(|| owner.clone()),
            mode: (!mode.is_empty()).then(|| mode.clone()),
            files_hash: files_hash.to_owned(),
        })
    }

    fn base(&self) -> String {
        source_base(&self.src)
    }

    /// The shell script that applies the step, run as root. `context` says who owns the files
    /// when the step names no owner, and where a relative destination is.
    pub fn script(&self, context: &TemplateDefaults) -> String {
        let owner = match &self.owner {
            Some(o) if o.contains(':') => o.clone(),
            Some(o) => format!("{o}:{o}"),
            None => format!("{0}:{0}", context.user),
        };
        let q = |s: &str| {
            shlex::try_quote(s)
                .map(|c| c.into_owned())
                .unwrap_or_default()
        };
        format!(
            r#"set -eu
workdir={workdir}
inbox=/{INBOX}
src=$inbox/unpacked/{base}
dest={dest}
case "$dest" in
  /*) ;;
  *) home=$(awk -F: -v u={user} '$1 == u {{ print $6 }}' /etc/passwd)
     dest=${{workdir:-${{home:-/}}}}/$dest ;;
esac
mkdir -p "$inbox/unpacked"
if [ "$(od -An -N2 -tx1 "$inbox/{ARCHIVE}" | tr -d ' \n')" = 1f8b ]; then
  gzip -dc "$inbox/{ARCHIVE}" | tar -x -C "$inbox/unpacked" -f -
else
  tar -x -C "$inbox/unpacked" -f "$inbox/{ARCHIVE}"
fi
if [ ! -e "$src" ] && [ ! -L "$src" ]; then
  echo "COPY: the upload has nothing at {shown}" >&2
  exit 1
fi
chown -R -h {owner} "$src"
mode={mode}
if [ -n "$mode" ]; then chmod -R "$mode" "$src"; fi
# A directory the step creates for what it copies is the owner's, as Docker makes it; an
# existing one keeps its owner and mode.
into() {{
  if [ ! -e "$1" ]; then mkdir -p "$1" && chown -h {owner} "$1"; fi
}}
if [ -d "$src" ] && [ ! -L "$src" ]; then
  into "$dest"
  for entry in "$src"/* "$src"/.[!.]* "$src"/..?*; do
    if [ -e "$entry" ] || [ -L "$entry" ]; then cp -a "$entry" "$dest/"; fi
  done
elif [ "${{dest%/}}" != "$dest" ] || [ -d "$dest" ]; then
  into "$dest" && cp -a "$src" "$dest/"
else
  mkdir -p "$(dirname "$dest")" && cp -a "$src" "$dest"
fi
"#,
            base = q(&self.base()),
            dest = q(&self.dest),
            user = q(&context.user),
            shown = self.src.replace(['"', '$', '`', '\\'], "?"),
            owner = q(&owner),
            mode = q(self.mode.as_deref().unwrap_or("")),
            workdir = q(context.workdir.as_deref().unwrap_or("")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(src: &str, dest: &str) -> CopyStep {
        CopyStep::new(
            &[src.into(), dest.into(), String::new(), String::new()],
            "h",
        )
        .unwrap()
    }

    #[test]
    fn the_source_directory_is_what_comes_before_any_glob() {
        assert_eq!(step("app", "/app/").base(), "app");
        assert_eq!(step("./app/", "/app/").base(), "app");
        assert_eq!(step(".", "/app/").base(), ".");
        assert_eq!(step("*.txt", "/x/").base(), ".");
        assert_eq!(step("src/**/*.py", "/x/").base(), "src");
        assert_eq!(step("a/b.txt", "/x").base(), "a/b.txt");
    }

    #[test]
    fn bad_arguments_are_refused() {
        let args = |s: &str, m: &str| [s.into(), "/d".into(), String::new(), m.into()];
        assert!(CopyStep::new(&args("/etc", ""), "h").is_err());
        assert!(CopyStep::new(&args("../up", ""), "h").is_err());
        assert!(CopyStep::new(&args("a", "rwx"), "h").is_err());
        assert!(CopyStep::new(&args("a", "0755"), "h").is_ok());
        assert!(CopyStep::new(&["a".into()], "h").is_err());
    }
}
