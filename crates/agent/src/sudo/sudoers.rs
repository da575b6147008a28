//! Who may use `sudo`: the sandbox's own sudoers files decide, read fresh for every call.
//!
//! Airlock's sudo asks for no password (there is no one to type it), so only rules that need
//! none grant anything: `WHO ALL=(ALL) NOPASSWD: ALL` or `WHO ALL=(ALL:ALL) NOPASSWD: ALL`,
//! where WHO is a user, `%group` or a comma-separated list of them, as E2B's templates (and
//! Airlock's provisioning) write for `user`. Any other rule grants nothing here.

use std::path::Path;

/// The files sudo reads by default: `/etc/sudoers` and the drop-ins in `/etc/sudoers.d`
/// (whose names, as sudo's `@includedir` skips them, contain no `.` and do not end in `~`).
pub fn read(root: &Path) -> Vec<String> {
    let mut texts: Vec<String> = std::fs::read_to_string(root.join("etc/sudoers"))
        .into_iter()
        .collect();
    let mut drop_ins: Vec<_> = std::fs::read_dir(root.join("etc/sudoers.d"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            !name.contains('.') && !name.ends_with('~')
        })
        .collect();
    drop_ins.sort();
    texts.extend(
        drop_ins
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok()),
    );
    texts
}

/// Whether `user`, a member of `groups`, may run anything as anyone without a password.
pub fn grants(texts: &[String], user: &str, groups: &[String]) -> bool {
    texts
        .iter()
        .flat_map(|text| logical_lines(text))
        .any(|line| rule_grants(&line, user, groups))
}

/// Lines with comments dropped and backslash continuations joined.
fn logical_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for raw in text.lines() {
        let line = match raw.find('#') {
            Some(at) => &raw[..at],
            None => raw,
        };
        match line.trim_end().strip_suffix('\\') {
            Some(continued) => current.push_str(continued),
            None => {
                current.push_str(line);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    lines.push(current);
    lines
}

fn rule_grants(line: &str, user: &str, groups: &[String]) -> bool {
    let line = line.trim();
    let Some((who, rest)) = line.split_once(char::is_whitespace) else {
        return false;
    };
    let spec: String = rest.chars().filter(|c| !c.is_whitespace()).collect();
    if !matches!(
        spec.as_str(),
        "ALL=(ALL)NOPASSWD:ALL" | "ALL=(ALL:ALL)NOPASSWD:ALL"
    ) {
        return false;
    }
    who.split(',')
        .map(str::trim)
        .any(|w| match w.strip_prefix('%') {
            Some(group) => groups.iter().any(|g| g == group),
            None => w == user,
        })
}

/// The groups (name and gid) `user` belongs to, as `/etc/group` (under `root`) lists them,
/// with its primary group `gid`.
pub fn groups_of(root: &Path, user: &str, gid: u32) -> Vec<(String, u32)> {
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap_or_default();
    group
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            let [name, _, id, members] = fields[..] else {
                return None;
            };
            let id: u32 = id.parse().ok()?;
            let member = members.split(',').any(|m| m.trim() == user);
            (member || id == gid).then(|| (name.to_owned(), id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(s: &str) -> Vec<String> {
        vec![s.to_owned()]
    }

    #[test]
    fn only_passwordless_rules_for_everything_grant() {
        let sudoers = texts(
            "Defaults env_reset\n\
             # user ALL=(ALL:ALL) NOPASSWD: ALL\n\
             user   ALL = (ALL:ALL) NOPASSWD: ALL\n\
             pw ALL=(ALL:ALL) ALL\n\
             some ALL=(ALL) NOPASSWD: /usr/bin/apt-get\n\
             %admins,solo ALL=(ALL) \\\n  NOPASSWD: ALL\n",
        );
        let none: &[String] = &[];
        assert!(grants(&sudoers, "user", none));
        assert!(!grants(&sudoers, "pw", none), "a password would be asked");
        assert!(!grants(&sudoers, "some", none), "only some commands");
        assert!(!grants(&sudoers, "nobody", none));
        assert!(grants(&sudoers, "solo", none));
        assert!(grants(&sudoers, "member", &["admins".into()]));
        assert!(!grants(
            &texts("# user ALL=(ALL) NOPASSWD: ALL"),
            "user",
            none
        ));
    }

    #[test]
    fn drop_ins_are_read_as_sudo_reads_them_and_groups_are_found() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc/sudoers.d")).unwrap();
        let write = |name: &str, text: &str| {
            std::fs::write(root.path().join("etc").join(name), text).unwrap();
        };
        write("sudoers.d/user", "user ALL=(ALL:ALL) NOPASSWD: ALL\n");
        write(
            "sudoers.d/off.disabled",
            "other ALL=(ALL:ALL) NOPASSWD: ALL\n",
        );
        write("group", "root:x:0:\nsudo:x:27:user,x\nuser:x:1000:\n");
        let read = read(root.path());
        assert!(grants(&read, "user", &[]));
        assert!(!grants(&read, "other", &[]), "files with a dot are skipped");
        assert_eq!(
            groups_of(root.path(), "user", 1000),
            [("sudo".to_string(), 27), ("user".to_string(), 1000)]
        );
    }
}
