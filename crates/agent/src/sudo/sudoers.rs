//! Who may use `sudo`: the sandbox's own sudoers files decide, read fresh for every call.
//!
//! Airlock's sudo asks for no password (there is no one to type it), so only rules that need
//! none grant anything: `WHO ALL=(ALL) NOPASSWD: ALL` or `WHO ALL=(ALL:ALL) NOPASSWD: ALL`, as
//! E2B's templates (and Airlock's provisioning) write for `user`. WHO is a list, as sudoers(5)
//! reads it: users, `#uid`, `%group`, `%#gid`, `ALL`, each perhaps negated with `!`, the last
//! item that matches deciding. As in sudo, the last rule that matches the caller decides, so a
//! later rule for it that is anything else (a password, some commands only) takes the grant
//! away. Files are read as sudo reads them: `/etc/sudoers`, with its `@include` and
//! `@includedir` (or `#include…`) where they stand; an image with no `/etc/sudoers` is read as
//! if it held `@includedir /etc/sudoers.d`, where provisioning puts its rule.
//!
//! What this cannot interpret never grants: an alias, a netgroup, an include it cannot read,
//! a line it cannot parse all count as a rule that may match the caller and grants nothing.
//! `Defaults` are not read.

use std::path::{Path, PathBuf};

/// sudo's own limit on nested includes.
const MAX_DEPTH: usize = 128;
/// The rules that grant, whitespace taken out.
const GRANTS: [&str; 2] = ["ALL=(ALL)NOPASSWD:ALL", "ALL=(ALL:ALL)NOPASSWD:ALL"];

/// A line of the sudoers files, in the order sudo reads them.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    /// A logical line: comments dropped, continuations joined, includes expanded.
    Line(String),
    /// What could not be read (an include, say), and why; it grants nothing.
    Unreadable(String),
}

/// Who asks: its name, uid and groups (name and gid).
pub struct Caller<'a> {
    pub name: &'a str,
    pub uid: u32,
    pub groups: &'a [(String, u32)],
}

/// The sudoers files under `root`, in the order sudo reads them.
pub fn read(root: &Path) -> Vec<Entry> {
    let mut entries = Vec::new();
    if root.join("etc/sudoers").exists() {
        include(root, Path::new("/etc/sudoers"), 0, &mut entries);
    } else {
        include_dir(root, Path::new("/etc/sudoers.d"), 0, &mut entries);
    }
    entries
}

/// Whether `caller` may run anything as anyone without a password: the last rule that may
/// match it must surely match it, and grant that.
pub fn grants(entries: &[Entry], caller: &Caller) -> bool {
    let mut granted = false;
    for entry in entries {
        let line = match entry {
            Entry::Line(line) => line.trim(),
            Entry::Unreadable(_) => {
                granted = false;
                continue;
            }
        };
        if line.is_empty() || is_not_a_rule(line) {
            continue;
        }
        let (users, spec) = split_users(line);
        if !spec.contains('=') {
            granted = false; // not a rule sudo would parse: it may say anything
            continue;
        }
        let grant = GRANTS.contains(&spec.as_str());
        match users_match(&users, caller) {
            Some(true) => granted = grant,
            Some(false) => {}
            None => granted &= grant,
        }
    }
    granted
}

/// Whether `/etc/sudoers` (its text) reads the drop-ins in `/etc/sudoers.d`.
pub fn includes_drop_ins(text: &str) -> bool {
    text.lines().any(|line| {
        matches!(directive(line), Some(Directive::IncludeDir(dir))
            if dir.trim_end_matches('/') == "/etc/sudoers.d")
    })
}

/// `Defaults`, aliases: lines that say nothing about who may run what.
fn is_not_a_rule(line: &str) -> bool {
    let mut words = line.split(|c: char| c.is_whitespace() || ":@!>".contains(c));
    matches!(
        words.next(),
        Some("Defaults" | "User_Alias" | "Runas_Alias" | "Host_Alias" | "Cmnd_Alias" | "Cmd_Alias")
    )
}

/// The user list (its items) and the rest of the rule, whitespace taken out. The list ends at
/// whitespace that no comma is next to.
fn split_users(line: &str) -> (Vec<String>, String) {
    let mut items = vec![String::new()];
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            let after = rest.trim_start();
            let in_item = items.last().is_some_and(|item| !item.is_empty());
            rest = after;
            if in_item && !after.starts_with(',') {
                break;
            }
            continue;
        }
        match c {
            ',' => items.push(String::new()),
            c => items.last_mut().expect("one item at least").push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    let spec = rest.chars().filter(|c| !c.is_whitespace()).collect();
    (items, spec)
}

/// Whether the list names `caller`: `Some` if surely so or surely not, `None` if an item that
/// may decide cannot be interpreted. The last item that matches decides, as in sudo.
fn users_match(items: &[String], caller: &Caller) -> Option<bool> {
    for item in items.iter().rev() {
        let name = item.trim_start_matches(|c: char| c == '!' || c.is_whitespace());
        let negated = item[..item.len() - name.len()].matches('!').count() % 2 == 1;
        match item_matches(name, caller) {
            Some(true) => return Some(!negated),
            Some(false) => {}
            None => return None,
        }
    }
    Some(false)
}

/// One item of a user list, its `!`s taken off.
fn item_matches(item: &str, caller: &Caller) -> Option<bool> {
    let id = |digits: &str| digits.parse::<u32>().ok();
    if item.is_empty() || item.contains(['"', '\\', '!']) {
        return None;
    }
    if item == "ALL" {
        return Some(true);
    }
    if let Some(uid) = item.strip_prefix('#') {
        return id(uid).map(|uid| uid == caller.uid);
    }
    if let Some(group) = item.strip_prefix('%') {
        if let Some(gid) = group.strip_prefix('#') {
            return id(gid).map(|gid| caller.groups.iter().any(|(_, g)| *g == gid));
        }
        if group.starts_with([':', '+']) {
            return None; // non-Unix groups and netgroups
        }
        return Some(caller.groups.iter().any(|(g, _)| g == group));
    }
    // A netgroup, or an alias (sudo reads an upper-case name as one).
    let alias = item.starts_with(|c: char| c.is_ascii_uppercase())
        && item
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if item.starts_with('+') || alias {
        return None;
    }
    Some(item == caller.name)
}

/// What an include line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Directive<'a> {
    Include(&'a str),
    IncludeDir(&'a str),
    /// A path this cannot read as sudo would (`%h`, quoting).
    Unsupported(&'a str),
}

/// `@include PATH`, `@includedir DIR`, and their older `#` forms.
fn directive(line: &str) -> Option<Directive<'_>> {
    let line = line.trim();
    let rest = line.strip_prefix('@').or_else(|| line.strip_prefix('#'))?;
    let (word, path) = rest.split_once(char::is_whitespace)?;
    let path = path.trim();
    if path.contains(['%', '"', '\\']) || path.is_empty() {
        return matches!(word, "include" | "includedir").then_some(Directive::Unsupported(path));
    }
    match word {
        "include" => Some(Directive::Include(path)),
        "includedir" => Some(Directive::IncludeDir(path)),
        _ => None,
    }
}

/// Reads `file` (a path in the sandbox) into `out`, its includes expanded where they stand.
fn include(root: &Path, file: &Path, depth: usize, out: &mut Vec<Entry>) {
    if depth > MAX_DEPTH {
        out.push(Entry::Unreadable(format!(
            "{}: includes nested too deep",
            file.display()
        )));
        return;
    }
    let text = match std::fs::read_to_string(under(root, file)) {
        Ok(text) => text,
        Err(e) => return out.push(Entry::Unreadable(format!("{}: {e}", file.display()))),
    };
    let dir = file.parent().unwrap_or(Path::new("/"));
    let mut current = String::new();
    for raw in text.lines() {
        match directive(raw) {
            Some(Directive::Include(path)) => include(root, &dir.join(path), depth + 1, out),
            Some(Directive::IncludeDir(path)) => include_dir(root, &dir.join(path), depth + 1, out),
            Some(Directive::Unsupported(path)) => {
                out.push(Entry::Unreadable(format!("an include of '{path}'")))
            }
            None => {
                let line = strip_comment(raw);
                match line.trim_end().strip_suffix('\\') {
                    Some(continued) => current.push_str(continued),
                    None => {
                        current.push_str(line);
                        out.push(Entry::Line(std::mem::take(&mut current)));
                    }
                }
            }
        }
    }
    if !current.is_empty() {
        out.push(Entry::Line(current));
    }
}

/// The files of `dir` sudo's `@includedir` reads: in name order, none whose name has a `.`
/// or ends in `~`. A missing directory holds none.
fn include_dir(root: &Path, dir: &Path, depth: usize, out: &mut Vec<Entry>) {
    let names = match std::fs::read_dir(under(root, dir)) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => return out.push(Entry::Unreadable(format!("{}: {e}", dir.display()))),
    };
    let mut names: Vec<String> = names
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.contains('.') && !name.ends_with('~'))
        .collect();
    names.sort();
    for name in names {
        include(root, &dir.join(name), depth, out);
    }
}

/// `path` (absolute in the sandbox) under `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The line up to its comment: a `#` not followed by a digit (`#1000` is a uid).
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    let comment = (0..bytes.len())
        .find(|&i| bytes[i] == b'#' && !bytes.get(i + 1).is_some_and(u8::is_ascii_digit));
    &line[..comment.unwrap_or(line.len())]
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

    /// Whether `text`, as the whole of the sudoers files, grants `name` (uid 1000) in `groups`.
    fn grants_to(text: &str, name: &str, groups: &[(&str, u32)]) -> bool {
        let groups: Vec<(String, u32)> =
            groups.iter().map(|(g, id)| (g.to_string(), *id)).collect();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("etc/sudoers"), text).unwrap();
        let caller = Caller {
            name,
            uid: 1000,
            groups: &groups,
        };
        grants(&read(root.path()), &caller)
    }

    const FULL: &str = "ALL=(ALL:ALL) NOPASSWD: ALL";

    #[test]
    fn only_passwordless_rules_for_everything_grant() {
        let sudoers = "Defaults env_reset\n\
             # user ALL=(ALL:ALL) NOPASSWD: ALL\n\
             user   ALL = (ALL : ALL) NOPASSWD: ALL\n\
             pw ALL=(ALL:ALL) ALL\n\
             some ALL=(ALL) NOPASSWD: /usr/bin/apt-get\n\
             root ALL=NOPASSWD: ALL\n\
             %admins, solo ALL=(ALL) \\\n  NOPASSWD: ALL\n";
        assert!(grants_to(sudoers, "user", &[]));
        assert!(!grants_to(sudoers, "pw", &[]), "a password would be asked");
        assert!(!grants_to(sudoers, "some", &[]), "only some commands");
        assert!(!grants_to(sudoers, "root", &[]), "as root only");
        assert!(!grants_to(sudoers, "nobody", &[]));
        assert!(grants_to(sudoers, "solo", &[]));
        assert!(grants_to(sudoers, "member", &[("admins", 50)]));
        assert!(!grants_to("# user ALL=(ALL) NOPASSWD: ALL", "user", &[]));
    }

    #[test]
    fn negated_users_are_left_out_and_the_last_item_that_matches_decides() {
        let group_but_bob = format!("%admins,!bob {FULL}\n");
        assert!(grants_to(&group_but_bob, "alice", &[("admins", 50)]));
        assert!(!grants_to(&group_but_bob, "bob", &[("admins", 50)]));
        let all_but_bob = format!("ALL, !bob {FULL}\n");
        assert!(grants_to(&all_but_bob, "alice", &[]));
        assert!(!grants_to(&all_but_bob, "bob", &[]));
        assert!(grants_to(&format!("!bob,ALL {FULL}\n"), "bob", &[]));
        assert!(grants_to(&format!("!!bob {FULL}\n"), "bob", &[]));
        assert!(!grants_to(&format!("!bob {FULL}\n"), "bob", &[]));
    }

    #[test]
    fn the_last_rule_that_matches_decides() {
        let then_password = format!("user {FULL}\nuser ALL=(ALL:ALL) ALL\n");
        assert!(!grants_to(&then_password, "user", &[]));
        let then_grant = format!("user ALL=(ALL:ALL) ALL\nuser {FULL}\n");
        assert!(grants_to(&then_grant, "user", &[]));
        let group_then_user = format!("%sudo ALL=(ALL:ALL) ALL\nuser {FULL}\n");
        assert!(grants_to(&group_then_user, "user", &[("sudo", 27)]));
        let user_then_group = format!("user {FULL}\n%sudo ALL=(ALL:ALL) ALL\n");
        assert!(!grants_to(&user_then_group, "user", &[("sudo", 27)]));
        let someone_else = format!("user {FULL}\nother ALL=(ALL:ALL) ALL\n");
        assert!(grants_to(&someone_else, "user", &[]));
    }

    #[test]
    fn uids_and_gids_are_names_not_comments() {
        assert!(grants_to(&format!("#1000 {FULL}\n"), "user", &[]));
        assert!(!grants_to(&format!("#1001 {FULL}\n"), "user", &[]));
        let then_password = format!("user {FULL}\n#1000 ALL=(ALL) ALL\n");
        assert!(!grants_to(&then_password, "user", &[]));
        assert!(grants_to(
            &format!("%#27 {FULL}\n"),
            "user",
            &[("sudo", 27)]
        ));
        assert!(grants_to(
            &format!("user {FULL} # a comment\n"),
            "user",
            &[]
        ));
        assert!(!grants_to(&format!("# 1000 {FULL}\n"), "user", &[]));
    }

    #[test]
    fn what_cannot_be_interpreted_never_grants() {
        // An alias, a netgroup and a non-Unix group may name the caller.
        for who in ["ADMINS", "+admins", "%:admins", "\"user\""] {
            let after = format!("user {FULL}\n{who} ALL=(ALL) ALL\n");
            assert!(!grants_to(&after, "user", &[]), "{who}");
            assert!(!grants_to(&format!("{who} {FULL}\n"), "user", &[]), "{who}");
            let before = format!("{who} ALL=(ALL) ALL\nuser {FULL}\n");
            assert!(
                grants_to(&before, "user", &[]),
                "{who}: a surer rule comes last"
            );
        }
        let aliased = format!("User_Alias ADMINS = user\nADMINS {FULL}\n");
        assert!(!grants_to(&aliased, "user", &[]));
        assert!(!grants_to(&format!("user {FULL}\ngarbage\n"), "user", &[]));
    }

    #[test]
    fn includes_are_read_where_they_stand() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc");
        std::fs::create_dir_all(etc.join("sudoers.d")).unwrap();
        let write = |name: &str, text: &str| std::fs::write(etc.join(name), text).unwrap();
        let user = |root: &Path| {
            let caller = Caller {
                name: "user",
                uid: 1000,
                groups: &[],
            };
            grants(&read(root), &caller)
        };
        write("sudoers.d/user", &format!("user {FULL}\n"));
        write("sudoers.d/off.disabled", "user ALL=(ALL) ALL\n");
        write("sudoers.d/old~", "user ALL=(ALL) ALL\n");
        assert!(user(root.path()), "no /etc/sudoers: the drop-ins");

        write("sudoers", "root ALL=(ALL) ALL\n");
        assert!(
            !user(root.path()),
            "drop-ins only where /etc/sudoers includes them"
        );
        for include in ["@includedir /etc/sudoers.d", "#includedir /etc/sudoers.d/"] {
            write("sudoers", &format!("{include}\n"));
            assert!(user(root.path()), "{include}");
            write("sudoers", &format!("{include}\nuser ALL=(ALL) ALL\n"));
            assert!(
                !user(root.path()),
                "{include}, then a rule that asks a password"
            );
        }

        write("local", &format!("user {FULL}\n"));
        write("sudoers", "@include local\n");
        assert!(user(root.path()), "relative to the including file");
        write("sudoers", "@include /etc/missing\n");
        assert!(!user(root.path()));
        write("sudoers", "@include /etc/missing\n#include /etc/local\n");
        assert!(user(root.path()), "a readable grant after it decides");
        write(
            "sudoers",
            "@include /etc/%h\n@include /etc/local\n@include /etc/%h\n",
        );
        assert!(!user(root.path()), "a host-named include may hold anything");
        write("sudoers", "@include /etc/sudoers\n");
        assert!(!user(root.path()), "a loop ends");

        assert!(includes_drop_ins("# x\n@includedir /etc/sudoers.d\n"));
        assert!(includes_drop_ins("#includedir /etc/sudoers.d/\n"));
        assert!(!includes_drop_ins("# @includedir /etc/sudoers.d\n"));
    }

    #[test]
    fn groups_are_found() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        let group = "root:x:0:\nsudo:x:27:user,x\nuser:x:1000:\n";
        std::fs::write(root.path().join("etc/group"), group).unwrap();
        assert_eq!(
            groups_of(root.path(), "user", 1000),
            [("sudo".to_string(), 27), ("user".to_string(), 1000)]
        );
    }
}
