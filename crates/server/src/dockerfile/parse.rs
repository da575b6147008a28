//! A Dockerfile, read into the plan of a template build (its base, steps and start command).
//! Parsed with the `parse-dockerfile` crate; this module decides what each instruction means
//! here. It follows Docker's rules where they apply, and E2B's SDK (`from_dockerfile`) where
//! Docker has none: `ARG`s become environment variables, and the template's sandboxes run as
//! `user` in `/home/user` unless the Dockerfile says otherwise.

use parse_dockerfile::{Command, Flag, Instruction, Source, UnescapedString};
use std::collections::BTreeMap;

/// What a Dockerfile builds.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub from_image: String,
    pub steps: Vec<PlanStep>,
    /// `CMD` and `ENTRYPOINT`, combined as Docker does, as one shell command line.
    pub start_cmd: Option<String>,
    /// Instructions that have no meaning here and were skipped, with their lines.
    pub ignored: Vec<String>,
}

#[derive(Debug, PartialEq)]
pub enum PlanStep {
    Run(String),
    /// A source relative to the build context, as written.
    Copy {
        src: String,
        dest: String,
        owner: String,
        mode: String,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
}

/// Instructions that only describe an image to Docker, with no effect on a template.
const METADATA: &[&str] = &["EXPOSE", "LABEL", "MAINTAINER", "VOLUME", "STOPSIGNAL"];

/// The Dockerfile's steps. `build_args` (`--build-arg NAME=VALUE`) replace the defaults of the
/// `ARG`s they name; one that names no `ARG` is noted in [`Plan::ignored`], as Docker warns.
pub fn plan(text: &str, build_args: &BTreeMap<String, String>) -> Result<Plan, String> {
    let parsed = parse_dockerfile::parse(text).map_err(|e| e.to_string())?;
    let mut declared = std::collections::BTreeSet::new();
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut from_image = None;
    let mut steps = vec![PlanStep::User("root".into()), PlanStep::Workdir("/".into())];
    let (mut user_set, mut workdir_set) = (false, false);
    let mut workdir = String::from("/");
    let (mut cmd, mut entrypoint) = (None, None);
    let mut ignored = Vec::new();

    for instruction in &parsed.instructions {
        // Only a variant newer than this code has no known start.
        let Some(start) = keyword_start(instruction) else {
            return Err("an instruction this version of Airlock does not know".into());
        };
        let line = line_of(start);
        let at = |message: String| format!("line {line}: {message}");
        match instruction {
            Instruction::From(from) => {
                if from_image.is_some() {
                    return Err(at(
                        "a second FROM: multi-stage builds are not supported".into()
                    ));
                }
                no_flags("FROM", &from.options).map_err(at)?;
                from_image = Some(expand(&from.image.value, &vars));
            }
            Instruction::Arg(arg) => {
                let before_from = from_image.is_none();
                let mut pairs = Vec::new();
                for word in words(&arg.arguments.value, &vars) {
                    let (name, value) = match word.split_once('=') {
                        Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                        None => (word, None),
                    };
                    if name.is_empty() {
                        return Err(at("ARG needs a name".into()));
                    }
                    let value = build_args
                        .get(&name)
                        .cloned()
                        .or(value)
                        .or_else(|| vars.get(&name).cloned());
                    declared.insert(name.clone());
                    vars.insert(name.clone(), value.clone().unwrap_or_default());
                    pairs.extend(value.map(|v| (name, v)));
                }
                if !before_from && !pairs.is_empty() {
                    steps.push(PlanStep::Env(pairs));
                }
            }
            Instruction::Env(env) => {
                let pairs = env_pairs(&env.arguments.value, &vars).map_err(at)?;
                vars.extend(pairs.iter().cloned());
                steps.push(PlanStep::Env(pairs));
            }
            Instruction::Run(run) => {
                no_flags("RUN", &run.options).map_err(at)?;
                if !run.here_docs.is_empty() {
                    return Err(at("RUN with a here-document is not supported".into()));
                }
                let command = command_line(&run.arguments)
                    .ok_or_else(|| at("this form of RUN is not supported".into()))?;
                steps.push(PlanStep::Run(command));
            }
            Instruction::Copy(copy) => {
                let sources = &copy.src;
                steps.extend(
                    copy_steps("COPY", &copy.options, sources, &copy.dest, &vars).map_err(at)?,
                );
            }
            Instruction::Add(add) => {
                steps.extend(
                    copy_steps("ADD", &add.options, &add.src, &add.dest, &vars).map_err(at)?,
                );
            }
            Instruction::Workdir(dir) => {
                let dir = expand(&dir.arguments.value, &vars);
                workdir = if dir.starts_with('/') {
                    dir
                } else {
                    format!("{}/{dir}", workdir.trim_end_matches('/'))
                };
                workdir_set = true;
                steps.push(PlanStep::Workdir(workdir.clone()));
            }
            Instruction::User(user) => {
                user_set = true;
                steps.push(PlanStep::User(expand(&user.arguments.value, &vars)));
            }
            Instruction::Cmd(c) => cmd = Some(&c.arguments),
            Instruction::Entrypoint(e) => entrypoint = Some(&e.arguments),
            _ => {
                let name = keyword(text, start);
                if METADATA.contains(&name.as_str()) {
                    ignored.push(format!("line {line}: {name} (no effect on a template)"));
                } else {
                    return Err(at(format!("{name} is not supported")));
                }
            }
        }
    }
    let from_image = from_image.ok_or("a Dockerfile needs a FROM")?;
    for name in build_args.keys().filter(|n| !declared.contains(*n)) {
        ignored.push(format!(
            "--build-arg {name} (no ARG {name} in the Dockerfile)"
        ));
    }
    if !user_set {
        steps.push(PlanStep::User("user".into()));
    }
    if !workdir_set {
        steps.push(PlanStep::Workdir("/home/user".into()));
    }
    Ok(Plan {
        from_image,
        steps,
        start_cmd: start_command(entrypoint, cmd),
        ignored,
    })
}

fn keyword_start(instruction: &Instruction<'_>) -> Option<usize> {
    Some(match instruction {
        Instruction::Add(i) => i.add.span.start,
        Instruction::Arg(i) => i.arg.span.start,
        Instruction::Cmd(i) => i.cmd.span.start,
        Instruction::Copy(i) => i.copy.span.start,
        Instruction::Entrypoint(i) => i.entrypoint.span.start,
        Instruction::Env(i) => i.env.span.start,
        Instruction::Expose(i) => i.expose.span.start,
        Instruction::From(i) => i.from.span.start,
        Instruction::Healthcheck(i) => i.healthcheck.span.start,
        Instruction::Label(i) => i.label.span.start,
        Instruction::Maintainer(i) => i.maintainer.span.start,
        Instruction::Onbuild(i) => i.onbuild.span.start,
        Instruction::Run(i) => i.run.span.start,
        Instruction::Shell(i) => i.shell.span.start,
        Instruction::Stopsignal(i) => i.stopsignal.span.start,
        Instruction::User(i) => i.user.span.start,
        Instruction::Volume(i) => i.volume.span.start,
        Instruction::Workdir(i) => i.workdir.span.start,
        _ => return None,
    })
}

/// The instruction's keyword as written, upper-cased.
fn keyword(text: &str, start: usize) -> String {
    text[start..]
        .split(|c: char| c.is_whitespace())
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase()
}

fn no_flags(instruction: &str, flags: &[Flag<'_>]) -> Result<(), String> {
    match flags.first() {
        None => Ok(()),
        Some(flag) => Err(format!(
            "{instruction} --{} is not supported",
            flag.name.value
        )),
    }
}

/// One COPY step per source (Docker copies each into the destination).
fn copy_steps(
    instruction: &str,
    flags: &[Flag<'_>],
    sources: &[Source<'_>],
    dest: &UnescapedString<'_>,
    vars: &BTreeMap<String, String>,
) -> Result<Vec<PlanStep>, String> {
    let (mut owner, mut mode) = ("root".to_owned(), String::new());
    for flag in flags {
        let value = flag.value.as_ref().map(|v| expand(&v.value, vars));
        match (&*flag.name.value, value) {
            ("chown", Some(v)) => owner = v,
            ("chmod", Some(v)) if v.len() <= 4 && v.bytes().all(|b| (b'0'..=b'7').contains(&b)) => {
                mode = v
            }
            ("chmod", v) => {
                return Err(format!(
                    "{instruction} --chmod needs an octal mode such as 0755, not {:?}",
                    v.unwrap_or_default()
                ))
            }
            ("from", _) => {
                return Err(format!(
                    "{instruction} --from: multi-stage builds are not supported"
                ))
            }
            (name, _) => return Err(format!("{instruction} --{name} is not supported")),
        }
    }
    let dest = expand(&dest.value, vars);
    if sources.len() > 1 && !dest.ends_with('/') {
        return Err(format!(
            "{instruction} of several sources needs a destination ending in /"
        ));
    }
    sources
        .iter()
        .map(|source| {
            let Source::Path(path) = source else {
                return Err(format!(
                    "{instruction} from a here-document is not supported"
                ));
            };
            let src = expand(&path.value, vars);
            if src.contains("://") {
                return Err(format!(
                    "{instruction} of a URL ({src}) is not supported: fetch it in a RUN step"
                ));
            }
            let archive = [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"];
            if instruction == "ADD" && archive.iter().any(|ext| src.ends_with(ext)) {
                return Err(format!(
                    "ADD of an archive ({src}) would unpack it, which is not supported: COPY it \
                     and unpack it in a RUN step"
                ));
            }
            let src = src.trim_start_matches("./").to_owned();
            let src = if src.is_empty() { ".".into() } else { src };
            Ok(PlanStep::Copy {
                src,
                dest: dest.clone(),
                owner: owner.clone(),
                mode: mode.clone(),
            })
        })
        .collect()
}

/// `ENV a=1 b="two words"`, or the old `ENV name the rest of the line`.
fn env_pairs(raw: &str, vars: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, String> {
    let all = words(raw, vars);
    let Some(first) = all.first() else {
        return Err("ENV needs a name and a value".into());
    };
    if !first.contains('=') {
        return Ok(vec![(first.clone(), all[1..].join(" "))]);
    }
    all.iter()
        .map(|word| match word.split_once('=') {
            Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
            _ => Err(format!("ENV expects name=value, not '{word}'")),
        })
        .collect()
}

fn command_line(command: &Command<'_>) -> Option<String> {
    match command {
        Command::Exec(words) => Some(shell_join(words.value.iter().map(|w| &*w.value))),
        Command::Shell(line) => Some(line.value.trim().to_owned()),
        _ => None,
    }
}

/// Docker's rules: an exec-form ENTRYPOINT takes CMD as its arguments (a shell-form CMD as
/// `/bin/sh -c CMD`); a shell-form ENTRYPOINT ignores CMD; without ENTRYPOINT, CMD runs alone.
fn start_command(entrypoint: Option<&Command<'_>>, cmd: Option<&Command<'_>>) -> Option<String> {
    let line = match (entrypoint, cmd) {
        (Some(Command::Exec(entry)), Some(Command::Exec(args))) => shell_join(
            entry
                .value
                .iter()
                .chain(args.value.iter())
                .map(|w| &*w.value),
        ),
        (Some(Command::Exec(entry)), Some(Command::Shell(line))) => {
            shell_join(entry.value.iter().map(|w| &*w.value).chain([
                "/bin/sh",
                "-c",
                line.value.trim(),
            ]))
        }
        (Some(entry), _) => command_line(entry)?,
        (None, Some(cmd)) => command_line(cmd)?,
        (None, None) => return None,
    };
    (!line.trim().is_empty()).then_some(line)
}

/// Words as one shell command line. A word with a NUL byte cannot be one; Docker would fail
/// on it too, so such a word joins as nothing and the step fails in the shell.
fn shell_join<'a>(words: impl Iterator<Item = &'a str>) -> String {
    shlex::try_join(words).unwrap_or_default()
}

/// Splits an ENV or ARG line into words as Docker does: whitespace separates, quotes group
/// (single quotes literally), a backslash escapes, and variables expand outside single quotes.
fn words(raw: &str, vars: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                // A line continuation is whitespace; anything else is itself.
                match chars.next() {
                    Some('\n') => {}
                    Some(next) => {
                        word.push(next);
                        in_word = true;
                    }
                    None => word.push('\\'),
                }
            }
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                let mut quoted = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\' | '$')) => {
                            // Kept escaped for `expand`, which turns `\$` into `$`.
                            if chars.peek() == Some(&'$') {
                                quoted.push('\\');
                            }
                            quoted.extend(chars.next());
                        }
                        c => quoted.push(c),
                    }
                }
                word.push_str(&expand(&quoted, vars));
            }
            '$' => {
                in_word = true;
                let mut reference = String::from('$');
                if chars.peek() == Some(&'{') {
                    for c in chars.by_ref() {
                        reference.push(c);
                        if c == '}' {
                            break;
                        }
                    }
                } else {
                    while let Some(&c) = chars.peek() {
                        if !(c.is_ascii_alphanumeric() || c == '_') {
                            break;
                        }
                        reference.push(c);
                        chars.next();
                    }
                }
                word.push_str(&expand(&reference, vars));
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// `$NAME`, `${NAME}`, `${NAME:-default}` and `${NAME:+alternative}`, as Docker expands them in
/// FROM, COPY, ENV, WORKDIR and USER; `\$` is a literal `$`. Unknown names expand to nothing.
fn expand(text: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(['$', '\\']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("\\$") {
            out.push('$');
            rest = after;
        } else if let Some(after) = tail.strip_prefix('\\') {
            out.push('\\');
            rest = after;
        } else if let Some(braced) = tail.strip_prefix("${") {
            let Some(end) = braced.find('}') else {
                out.push_str(tail);
                break;
            };
            let inner = &braced[..end];
            let value = |name: &str| vars.get(name).filter(|v| !v.is_empty()).cloned();
            out.push_str(&match inner.split_once(":-") {
                Some((name, default)) => value(name).unwrap_or_else(|| expand(default, vars)),
                None => match inner.split_once(":+") {
                    Some((name, alt)) => value(name).map(|_| expand(alt, vars)).unwrap_or_default(),
                    None => vars.get(inner).cloned().unwrap_or_default(),
                },
            });
            rest = &braced[end + 1..];
        } else {
            let after = &tail[1..];
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if len == 0 {
                out.push('$');
            } else {
                out.push_str(vars.get(&after[..len]).map_or("", String::as_str));
            }
            rest = &after[len..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(text: &str) -> Result<Plan, String> {
        plan(text, &BTreeMap::new())
    }

    #[test]
    fn build_args_replace_arg_defaults_and_unused_ones_are_noted() {
        let args: BTreeMap<String, String> = [("TAG", "12"), ("GREETING", "hi"), ("NOPE", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let plan = plan(
            "ARG TAG=3\nFROM python:${TAG}\nARG GREETING=hello\nARG OTHER=kept\n",
            &args,
        )
        .unwrap();
        assert_eq!(plan.from_image, "python:12");
        assert!(plan
            .steps
            .contains(&PlanStep::Env(vec![("GREETING".into(), "hi".into())])));
        assert!(plan
            .steps
            .contains(&PlanStep::Env(vec![("OTHER".into(), "kept".into())])));
        assert_eq!(
            plan.ignored,
            ["--build-arg NOPE (no ARG NOPE in the Dockerfile)"]
        );
    }

    fn steps(text: &str) -> Vec<PlanStep> {
        plan_of(text).unwrap().steps
    }

    #[test]
    fn a_dockerfile_becomes_steps_as_docker_runs_them() {
        let plan = plan_of(
            "# a comment\n\
             ARG VERSION=3\n\
             FROM registry.example.com/python:${VERSION}-slim AS app\n\
             ARG GREETING=hello\n\
             ENV MODE=prod PATH_EXTRA=\"/opt/my app\"\n\
             ENV LEGACY two words\n\
             WORKDIR /srv\n\
             WORKDIR sub\n\
             COPY --chown=user:user --chmod=0644 app/ ./$MODE/\n\
             COPY a.txt b.txt /data/\n\
             RUN apt-get update && \\\n    apt-get install -y jq\n\
             RUN [\"echo\", \"it's\"]\n\
             EXPOSE 8000\n\
             USER user\n\
             CMD [\"python3\", \"-m\", \"http.server\", \"8000\"]\n",
        )
        .unwrap();
        assert_eq!(plan.from_image, "registry.example.com/python:3-slim");
        let copy = |src: &str, dest: &str, owner: &str, mode: &str| PlanStep::Copy {
            src: src.into(),
            dest: dest.into(),
            owner: owner.into(),
            mode: mode.into(),
        };
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            plan.steps,
            vec![
                PlanStep::User("root".into()),
                PlanStep::Workdir("/".into()),
                PlanStep::Env(vec![pair("GREETING", "hello")]),
                PlanStep::Env(vec![
                    pair("MODE", "prod"),
                    pair("PATH_EXTRA", "/opt/my app")
                ]),
                PlanStep::Env(vec![pair("LEGACY", "two words")]),
                PlanStep::Workdir("/srv".into()),
                PlanStep::Workdir("/srv/sub".into()),
                copy("app/", "./prod/", "user:user", "0644"),
                copy("a.txt", "/data/", "root", ""),
                copy("b.txt", "/data/", "root", ""),
                PlanStep::Run("apt-get update && \\\n    apt-get install -y jq".into()),
                PlanStep::Run(r#"echo "it's""#.into()),
                PlanStep::User("user".into()),
            ]
        );
        assert_eq!(
            plan.start_cmd.as_deref(),
            Some("python3 -m http.server 8000")
        );
        assert_eq!(plan.ignored, ["line 14: EXPOSE (no effect on a template)"]);
    }

    #[test]
    fn without_user_or_workdir_sandboxes_get_e2bs_defaults() {
        let steps = steps("FROM debian:12\nRUN true\n");
        assert_eq!(
            steps[steps.len() - 2..],
            [
                PlanStep::User("user".into()),
                PlanStep::Workdir("/home/user".into())
            ]
        );
    }

    #[test]
    fn entrypoint_and_cmd_combine_as_under_docker() {
        let start = |text: &str| plan_of(&format!("FROM x\n{text}")).unwrap().start_cmd;
        assert_eq!(
            start("ENTRYPOINT [\"node\"]\nCMD [\"app.js\"]\n").as_deref(),
            Some("node app.js")
        );
        assert_eq!(
            start("ENTRYPOINT [\"tini\", \"--\"]\nCMD node app.js\n").as_deref(),
            Some("tini -- /bin/sh -c 'node app.js'")
        );
        assert_eq!(
            start("ENTRYPOINT node server.js\nCMD [\"ignored\"]\n").as_deref(),
            Some("node server.js")
        );
        assert_eq!(start("RUN true\n"), None);
    }

    #[test]
    fn what_cannot_be_built_names_its_line() {
        for (text, expected) in [
            ("FROM a\nFROM b\n", "line 2: a second FROM"),
            ("RUN true\n", "expected FROM at line 1"),
            (
                "FROM a\n\nHEALTHCHECK CMD true\n",
                "line 3: HEALTHCHECK is not supported",
            ),
            (
                "FROM a\nSHELL [\"/bin/bash\", \"-c\"]\n",
                "line 2: SHELL is not supported",
            ),
            ("FROM a\nCOPY --from=b /x /y\n", "line 2: COPY --from"),
            (
                "FROM a\nRUN --mount=type=cache,target=/c true\n",
                "line 2: RUN --mount",
            ),
            (
                "FROM a\nADD https://example.com/x /x\n",
                "line 2: ADD of a URL",
            ),
            (
                "FROM a\nADD app.tar.gz /app/\n",
                "line 2: ADD of an archive",
            ),
            (
                "FROM a\nCOPY a b /dest\n",
                "line 2: COPY of several sources",
            ),
            (
                "FROM a\nCOPY --chmod=rw x /x\n",
                "line 2: COPY --chmod needs an octal",
            ),
            (
                "FROM a\nRUN <<EOF\necho hi\nEOF\n",
                "line 2: RUN with a here-document",
            ),
            ("# nothing\n", "expected at least one FROM"),
        ] {
            let err = plan_of(text).unwrap_err();
            assert!(err.starts_with(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn words_and_expansion_follow_dockers_quoting() {
        let vars = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        assert_eq!(
            words(r#"x=$A y="$A two" z='$A' w=\$A v=${A}b u=${B:-def}"#, &vars),
            ["x=1", "y=1 two", "z=$A", "w=$A", "v=1b", "u=def"]
        );
        assert_eq!(expand("${A:+set}-${B:+set}-$-\\$A", &vars), "set--$-$A");
    }
}
