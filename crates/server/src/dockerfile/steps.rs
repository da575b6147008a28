//! A template build's step as the SDK sends it (`RUN`, `ENV`, `WORKDIR`, `USER` or `COPY`,
//! with its arguments), checked and turned into the step the builder runs: from the API's build
//! requests and from the built-ins' Dockerfiles alike.

use airlock_core::build::copy::CopyStep;
use airlock_core::build::uploads::valid_hash;
use airlock_core::build::{Step, StepKind};
use airlock_wire::templates::TemplateStep;

/// The builder's step for `s`, or what is wrong with it.
pub fn step(s: &TemplateStep) -> Result<Step, String> {
    let args = &s.args;
    let non_empty = |what: &str, v: &str| {
        if v.is_empty() || v.contains('\0') {
            Err(format!("{} needs a non-empty {what}", s.kind))
        } else {
            Ok(v.to_owned())
        }
    };
    let kind = match (s.kind.as_str(), args.as_slice()) {
        ("RUN", [command]) => StepKind::Run {
            command: non_empty("command", command)?,
            user: None,
        },
        ("RUN", [command, user]) => StepKind::Run {
            command: non_empty("command", command)?,
            user: Some(non_empty("user", user)?),
        },
        ("ENV", pairs) if !pairs.is_empty() && pairs.len() % 2 == 0 => StepKind::Env(
            pairs
                .chunks(2)
                .map(|kv| Ok((non_empty("name", &kv[0])?, kv[1].clone())))
                .collect::<Result<_, String>>()?,
        ),
        ("WORKDIR", [dir]) if dir.starts_with('/') => StepKind::Workdir(dir.clone()),
        ("WORKDIR", [dir]) => return Err(format!("WORKDIR must be absolute, not '{dir}'")),
        ("USER", [user]) => StepKind::User(non_empty("user", user)?),
        ("COPY", args) => {
            let hash = s.files_hash.as_deref().unwrap_or_default();
            if !valid_hash(hash) {
                return Err("COPY needs the filesHash its files were uploaded under".into());
            }
            StepKind::Copy(CopyStep::new(args, hash)?)
        }
        ("RUN" | "ENV" | "WORKDIR" | "USER", _) => {
            return Err(format!("{} got the wrong number of arguments", s.kind))
        }
        (other, _) => return Err(format!("unknown step type '{other}'")),
    };
    Ok(Step {
        kind,
        force: s.force,
    })
}
