//! `airlock-agent provision ROOT [CA_BUNDLE]`: adds what a sandbox needs to an image's root
//! filesystem, and nothing else of the user's changes:
//! - a `root` entry, if the image has none (a scratch image may have no `/etc/passwd`);
//! - the `user` account (uid 1000 when free), its home, and passwordless sudo, as E2B's
//!   templates have: a sudoers rule (and `@includedir /etc/sudoers.d` in an image's
//!   `/etc/sudoers` that does not read it), and `/usr/bin/sudo` linked to the agent (see
//!   [`crate::sudo`]; a real sudo is moved aside);
//! - a world-writable `/tmp`;
//! - the host's CA bundle at [`CA_PATH`], which the template's environment points TLS clients at.
//!
//! Written in Rust rather than as a shell script because an image need not have a shell.

use crate::users::find_in_passwd;
use airlock_wire::AGENT_PATH;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;

/// Where the host's CA bundle goes.
pub const CA_PATH: &str = "etc/airlock/ca-certificates.crt";
const USER: &str = "user";

pub fn main(args: &[String]) -> Result<(), String> {
    let (root, ca) = match args {
        [root] => (Path::new(root), None),
        [root, ca] => (Path::new(root), Some(Path::new(ca))),
        _ => return Err("usage: airlock-agent provision ROOT [CA_BUNDLE]".into()),
    };
    provision(root, ca).map_err(|e| e.to_string())
}

fn provision(root: &Path, ca: Option<&Path>) -> std::io::Result<()> {
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc)?;
    let passwd = read(&etc.join("passwd"))?;
    let group = read(&etc.join("group"))?;
    if find_in_passwd(&passwd, "root").is_none() {
        let shell = shell(root);
        append(
            &etc.join("passwd"),
            &format!("root:x:0:0:root:/root:{shell}"),
        )?;
    }
    if group_id(&group, "root").is_none() {
        append(&etc.join("group"), "root:x:0:")?;
    }
    let (uid, gid) = match find_in_passwd(&passwd, USER) {
        Some(user) => (user.uid, user.gid),
        None => add_user(root, &passwd, &group)?,
    };
    let home = root.join("home").join(USER);
    if !home.exists() {
        std::fs::create_dir_all(&home)?;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))?;
        chown(&home, Some(uid), Some(gid))?;
    }
    let sudoers = etc.join("sudoers.d");
    if !sudoers.is_dir() {
        std::fs::create_dir_all(&sudoers)?;
        std::fs::set_permissions(&sudoers, std::fs::Permissions::from_mode(0o750))?;
    }
    let file = sudoers.join("airlock-user");
    std::fs::write(&file, format!("{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"))?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o440))?;
    // The rule counts only where the image's own /etc/sudoers reads the drop-ins, as in sudo.
    let main = etc.join("sudoers");
    if main.exists() && !crate::sudo::sudoers::includes_drop_ins(&read(&main)?) {
        append(&main, "@includedir /etc/sudoers.d")?;
    }
    link_sudo(root)?;
    let tmp = root.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))?;
    if let Some(ca) = ca {
        let target = root.join(CA_PATH);
        std::fs::create_dir_all(target.parent().unwrap_or(root))?;
        std::fs::copy(ca, &target)?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// Links `/usr/bin/sudo` to the agent, whose `sudo` works where a set-user-ID one cannot
/// (gVisor ignores the bit). A real sudo is moved aside to `/usr/bin/sudo.real`; where the
/// image has dpkg, as a local diversion, so that installing or upgrading sudo later puts it
/// there too and leaves the link alone.
fn link_sudo(root: &Path) -> std::io::Result<()> {
    let sudo = root.join("usr/bin/sudo");
    std::fs::create_dir_all(root.join("usr/bin"))?;
    let dpkg = root.join("var/lib/dpkg");
    if dpkg.is_dir() {
        let diversions = dpkg.join("diversions");
        if !read(&diversions)?.lines().any(|l| l == "/usr/bin/sudo") {
            // dpkg's record of a diversion: the path, where it goes, and `:` for "local".
            append(&diversions, "/usr/bin/sudo\n/usr/bin/sudo.real\n:")?;
        }
    }
    match std::fs::symlink_metadata(&sudo) {
        Ok(m) if m.is_symlink() && std::fs::read_link(&sudo)? == Path::new(AGENT_PATH) => {
            return Ok(())
        }
        Ok(_) => std::fs::rename(&sudo, root.join("usr/bin/sudo.real"))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::os::unix::fs::symlink(AGENT_PATH, &sudo)
}

/// Adds `user` with uid and gid 1000, or the lowest free number above it.
fn add_user(root: &Path, passwd: &str, group: &str) -> std::io::Result<(u32, u32)> {
    let taken = |file: &str, id: u32| {
        file.lines()
            .any(|l| l.split(':').nth(2) == Some(id.to_string().as_str()))
    };
    let uid = (1000..).find(|&id| !taken(passwd, id)).unwrap_or(1000);
    let gid = match group_id(group, USER) {
        Some(gid) => gid,
        None => {
            let gid = (uid..).find(|&id| !taken(group, id)).unwrap_or(uid);
            append(&root.join("etc/group"), &format!("{USER}:x:{gid}:"))?;
            gid
        }
    };
    let shell = shell(root);
    append(
        &root.join("etc/passwd"),
        &format!("{USER}:x:{uid}:{gid}::/home/{USER}:{shell}"),
    )?;
    if root.join("etc/shadow").exists() {
        append(&root.join("etc/shadow"), &format!("{USER}:!::0:99999:7:::"))?;
    }
    Ok((uid, gid))
}

/// bash where the image has it, else sh.
fn shell(root: &Path) -> &'static str {
    if root.join("bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

fn read(path: &Path) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        other => other,
    }
}

/// The gid of group `name` in an `/etc/group` file.
fn group_id(group: &str, name: &str) -> Option<u32> {
    group.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next() == Some(name))
            .then(|| fields.nth(1)?.parse().ok())
            .flatten()
    })
}

/// Appends a line, first ending the file's last line if it lacks its newline.
fn append(path: &Path, line: &str) -> std::io::Result<()> {
    let mut text = read(path)?;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
    text.push('\n');
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_root_and_user_to_an_image_without_them() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("etc/sudoers.d")).unwrap();
        provision(root, None).unwrap();
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.contains("root:x:0:0:root:/root:/bin/sh\n"));
        assert!(passwd.contains("user:x:1000:1000::/home/user:/bin/sh\n"));
        let sudo = std::fs::read_to_string(root.join("etc/sudoers.d/airlock-user")).unwrap();
        assert_eq!(sudo, "user ALL=(ALL:ALL) NOPASSWD: ALL\n");
        assert!(root.join("home/user").is_dir());
        assert_eq!(
            std::fs::read_link(root.join("usr/bin/sudo")).unwrap(),
            Path::new(AGENT_PATH)
        );
    }

    #[test]
    fn the_images_sudoers_is_made_to_read_the_rule() {
        use crate::sudo::sudoers::{grants, read, Caller};
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/sudoers"), "root ALL=(ALL) ALL\n").unwrap();
        provision(root, None).unwrap();
        provision(root, None).unwrap();
        let sudoers = std::fs::read_to_string(root.join("etc/sudoers")).unwrap();
        assert_eq!(sudoers, "root ALL=(ALL) ALL\n@includedir /etc/sudoers.d\n");
        let user = Caller {
            name: "user",
            uid: 1000,
            groups: &[],
        };
        assert!(grants(&read(root), &user));
    }

    #[test]
    fn a_real_sudo_is_diverted_aside_once() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::create_dir_all(root.join("var/lib/dpkg")).unwrap();
        std::fs::write(root.join("usr/bin/sudo"), b"setuid sudo").unwrap();
        std::fs::write(
            root.join("var/lib/dpkg/diversions"),
            "/bin/sh\n/bin/sh.distrib\ndash\n",
        )
        .unwrap();
        provision(root, None).unwrap();
        provision(root, None).unwrap();
        assert_eq!(
            std::fs::read(root.join("usr/bin/sudo.real")).unwrap(),
            b"setuid sudo"
        );
        assert_eq!(
            std::fs::read_link(root.join("usr/bin/sudo")).unwrap(),
            Path::new(AGENT_PATH)
        );
        assert_eq!(
            std::fs::read_to_string(root.join("var/lib/dpkg/diversions")).unwrap(),
            "/bin/sh\n/bin/sh.distrib\ndash\n/usr/bin/sudo\n/usr/bin/sudo.real\n:\n"
        );
    }

    #[test]
    fn keeps_the_image_users_and_takes_the_next_free_uid() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let passwd = "root:x:0:0:root:/root:/bin/ash\nnode:x:1000:1000::/home/node:/bin/sh";
        std::fs::write(root.join("etc/passwd"), passwd).unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\nnode:x:1000:\n").unwrap();
        provision(root, None).unwrap();
        let after = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(after.starts_with(passwd));
        assert!(after.ends_with("\nuser:x:1001:1001::/home/user:/bin/sh\n"));
        // Run twice, nothing is added twice.
        provision(root, None).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("etc/passwd")).unwrap(),
            after
        );
    }
}
