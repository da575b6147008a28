//! Whose host-wide names these are. Network namespaces, cgroups and files under `/run` are
//! shared by everything on the host; the driver's sweep removes every one of its names that no
//! kept sandbox holds. One server per host uses the plain names (`al-{id}`, `airlock/{id}`,
//! `/run/airlock`), as every release before did, so an upgraded server still finds and adopts
//! its sandboxes. Several servers on one host (each in a network namespace of its own, so links,
//! firewall and ports do not meet) each take an instance name, and every host-wide name of
//! theirs carries it: none of them finds, and so sweeps, another's sandboxes.

use std::path::PathBuf;

pub(crate) const RUN_DIR: &str = "/run/airlock";
const MAX_LEN: usize = 32;

/// The plain names (`Instance::default()`) or those of one named instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instance {
    name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error(
        "'{0}' is not an instance name: 1-{MAX_LEN} lowercase letters, digits and inner hyphens"
    )]
    Invalid(String),
}

impl Instance {
    /// A named instance: 1-32 lowercase letters, digits and inner hyphens. No dots, so that one
    /// instance's netns prefix (`al.{name}.`) never starts another's.
    pub fn named(name: &str) -> Result<Self, InstanceError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_LEN
            && !name.starts_with('-')
            && !name.ends_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return Err(InstanceError::Invalid(name.to_owned()));
        }
        Ok(Instance {
            name: Some(name.to_owned()),
        })
    }

    pub fn is_named(&self) -> bool {
        self.name.is_some()
    }

    /// The parent of the sandboxes' cgroups, under each controller.
    pub(crate) fn cgroup_parent(&self) -> String {
        match &self.name {
            None => "airlock".into(),
            Some(name) => format!("airlock-{name}"),
        }
    }

    /// What the names of the sandboxes' netns start with. The plain `al-` and a named `al.`
    /// never start one another.
    fn netns_prefix(&self) -> String {
        match &self.name {
            None => "al-".into(),
            Some(name) => format!("al.{name}."),
        }
    }

    /// The name of the sandbox's netns (in `/run/netns`).
    pub(crate) fn netns_name(&self, id: &str) -> String {
        format!("{}{id}", self.netns_prefix())
    }

    /// The sandbox id a netns of this instance is named after; `None` for anyone else's.
    pub(crate) fn netns_id<'a>(&self, netns: &'a str) -> Option<&'a str> {
        netns.strip_prefix(&self.netns_prefix())
    }

    /// Where this instance keeps files that must go at the host's next boot (`/run` is a tmpfs).
    pub(crate) fn run_dir(&self) -> PathBuf {
        match &self.name {
            None => PathBuf::from(RUN_DIR),
            Some(name) => PathBuf::from(RUN_DIR).join(name),
        }
    }

    /// The lock one server holds on these names for its life.
    pub(crate) fn lock_file(&self) -> PathBuf {
        match &self.name {
            None => PathBuf::from("/run/airlock-gvisor.lock"),
            Some(_) => self.run_dir().join("gvisor.lock"),
        }
    }
}

impl std::fmt::Display for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name.as_deref().unwrap_or("(default)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_keeps_the_names_of_one_server_per_host() {
        let plain = Instance::default();
        assert_eq!(plain.cgroup_parent(), "airlock");
        assert_eq!(plain.netns_name("abc"), "al-abc");
        assert_eq!(plain.netns_id("al-abc"), Some("abc"));
        assert_eq!(plain.run_dir(), PathBuf::from("/run/airlock"));
        assert_eq!(plain.lock_file(), PathBuf::from("/run/airlock-gvisor.lock"));
    }

    #[test]
    fn a_named_instance_carries_its_name_in_every_host_wide_name() {
        let node = Instance::named("node-1").unwrap();
        assert_eq!(node.cgroup_parent(), "airlock-node-1");
        assert_eq!(node.netns_name("abc"), "al.node-1.abc");
        assert_eq!(node.netns_id("al.node-1.abc"), Some("abc"));
        assert_eq!(node.run_dir(), PathBuf::from("/run/airlock/node-1"));
        assert_eq!(
            node.lock_file(),
            PathBuf::from("/run/airlock/node-1/gvisor.lock")
        );
    }

    #[test]
    fn no_instance_claims_another_ones_netns() {
        let plain = Instance::default();
        let node = Instance::named("node").unwrap();
        let node1 = Instance::named("node-1").unwrap();
        let names = [
            plain.netns_name("abc"),
            node.netns_name("abc"),
            node1.netns_name("abc"),
        ];
        for (i, owner) in [&plain, &node, &node1].into_iter().enumerate() {
            for (j, name) in names.iter().enumerate() {
                assert_eq!(owner.netns_id(name).is_some(), i == j, "{owner} vs {name}");
            }
        }
        assert_ne!(plain.cgroup_parent(), node.cgroup_parent());
        assert_ne!(plain.lock_file(), node.lock_file());
    }

    #[test]
    fn instance_names_are_short_lowercase_labels() {
        for good in ["a", "node-1", "n0", &"x".repeat(32)] {
            assert!(Instance::named(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Node",
            "a.b",
            "a/b",
            "a_b",
            "a b",
            "..",
            &"x".repeat(33),
        ] {
            assert!(Instance::named(bad).is_err(), "{bad:?}");
        }
    }
}
