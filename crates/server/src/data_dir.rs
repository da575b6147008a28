//! The data dir: its layout, and the rule that it is this process's own.
//!
//! Root reads the database (every sandbox's tokens), mounts template layers kept there, runs
//! debootstrap into it, and restores checkpoint images kept there. A dir that another user
//! could have written into (a fixed path under `/tmp` that someone made first, say) would hand
//! that user all of it, so the data dir, the templates dir and the files Airlock keeps in them
//! must belong to this process's uid and be writable by nobody else; anything else is refused
//! with what to fix.
//! New directories are made 0700 and the database and key files 0600.

use airlock_core::store::{Database, Store};
use anyhow::{bail, Context};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub struct DataDir {
    root: PathBuf,
    templates: PathBuf,
}

impl DataDir {
    /// The layout under `root`, with nothing checked or created (for reading the key file).
    /// `templates` overrides where template root filesystems are kept (default: `templates/`
    /// in the data dir). Built templates are keyed by content, so one templates dir can serve
    /// several data dirs, as the test suite's fresh data dirs do.
    pub fn layout(root: &Path, templates: Option<&Path>) -> Self {
        DataDir {
            root: root.to_owned(),
            templates: templates.map_or_else(|| root.join("templates"), Path::to_owned),
        }
    }

    /// Creates the data dir and the templates dir (0700) if missing, checks that they and the
    /// files kept in them are this process's own (see the module doc), and from then on refers
    /// to them by their resolved paths, so no symlink on the way can be swapped later.
    pub fn open(root: &Path, templates: Option<&Path>) -> anyhow::Result<Self> {
        let layout = Self::layout(root, templates);
        let mut resolved = Vec::new();
        for dir in [&layout.root, &layout.templates] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
            let real = std::fs::canonicalize(dir)
                .with_context(|| format!("resolving {}", dir.display()))?;
            check_private_path(&real)?;
            resolved.push(real);
        }
        let templates = resolved.pop().expect("two dirs");
        let root = resolved.pop().expect("two dirs");
        let data = DataDir { root, templates };
        data.check_files()?;
        Ok(data)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn db(&self) -> PathBuf {
        self.root.join("airlock.db")
    }

    /// The state: the data dir's own SQLite file (one box), or the PostgreSQL that `database`
    /// names (`--database`, for many machines).
    pub async fn store(&self, database: Option<&Database>) -> anyhow::Result<Store> {
        match database {
            None => Store::open(&self.db()).context("opening the state database"),
            Some(database) => Store::connect(database)
                .await
                .context("opening the state database in the PostgreSQL that --database names"),
        }
    }

    /// What a data dir whose state is in PostgreSQL names in the templates dir's list of
    /// databases: a file that is no database, so that no other data dir's collector can tell
    /// which template files it uses, and so collects none while it exists.
    fn postgres_marker(&self) -> PathBuf {
        self.root.join("state-in-postgres")
    }
    pub fn templates(&self) -> &Path {
        &self.templates
    }
    pub fn volumes(&self) -> PathBuf {
        self.root.join("volumes")
    }
    pub fn gvisor(&self) -> PathBuf {
        self.root.join("gvisor")
    }
    /// Where the generated API key is kept for the CLI (root-only).
    pub fn api_key_file(&self) -> PathBuf {
        self.root.join("api-key")
    }

    /// Every data dir's database that keeps its templates in this one's templates dir, this
    /// one's first. The templates dir records them (`databases`, a path a line): this one is
    /// added, and those that no longer exist are dropped. Collecting unused layers must heed
    /// what every one of them uses. One `on_postgres` is named by its marker file.
    pub fn databases_sharing_templates(&self, on_postgres: bool) -> anyhow::Result<Vec<PathBuf>> {
        let record = self.templates.join("databases");
        let known = std::fs::read_to_string(&record).unwrap_or_default();
        let own = if on_postgres {
            let marker = self.postgres_marker();
            std::fs::write(
                &marker,
                "This data dir keeps its state in PostgreSQL (airlock serve --database).\n",
            )
            .with_context(|| format!("writing {}", marker.display()))?;
            marker
        } else {
            // Back on its own file, it names that again (see `postgres_marker`).
            match std::fs::remove_file(self.postgres_marker()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).context("removing the PostgreSQL marker")
                }
                _ => {}
            }
            self.db()
        };
        let mut all = vec![own.clone()];
        all.extend(
            known
                .lines()
                .map(PathBuf::from)
                .filter(|db| *db != own && db.is_file()),
        );
        let text: String = all.iter().map(|db| format!("{}\n", db.display())).collect();
        let partial = record.with_extension("partial");
        std::fs::write(&partial, text)
            .and_then(|()| std::fs::rename(&partial, &record))
            .with_context(|| format!("writing {}", record.display()))?;
        Ok(all)
    }

    /// Refuses a database or key file that another uid owns or can write; makes one that
    /// others can read private.
    fn check_files(&self) -> anyhow::Result<()> {
        let db = self.db();
        let files = [
            db.with_extension("db-wal"),
            db.with_extension("db-shm"),
            db,
            self.api_key_file(),
        ];
        for file in files.iter().filter(|f| f.exists()) {
            let md = std::fs::symlink_metadata(file)?;
            if !md.is_file() {
                bail!("{} is not a regular file", file.display());
            }
            check_own(file, &md)?;
            if md.mode() & 0o077 != 0 {
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("making {} private", file.display()))?;
                tracing::warn!(file = %file.display(), "it was readable by others; it is 0600 now");
            }
        }
        Ok(())
    }
}

/// Fails unless the directory `path` (resolved) is this process's own and writable by no one
/// else, and no directory above it lets anyone else rename or replace it: each belongs to root
/// or to this uid, and is writable by nobody else or sticky (as `/tmp`, where only an entry's
/// owner may rename it).
fn check_private_path(path: &Path) -> anyhow::Result<()> {
    let md = std::fs::metadata(path).with_context(|| format!("checking {}", path.display()))?;
    check_own(path, &md)?;
    let me = nix::unistd::geteuid().as_raw();
    for dir in path.ancestors().skip(1) {
        let md = std::fs::metadata(dir).with_context(|| format!("checking {}", dir.display()))?;
        let sticky = md.mode() & 0o1000 != 0;
        if (md.uid() != 0 && md.uid() != me) || (md.mode() & 0o022 != 0 && !sticky) {
            bail!(
                "{} lies under {}, which another user can change (owner uid {}, mode {:o}); \
                 keep Airlock's state under directories only root can change",
                path.display(),
                dir.display(),
                md.uid(),
                md.mode() & 0o7777
            );
        }
    }
    Ok(())
}

/// Fails unless `path` belongs to this process's uid and neither its group nor others may
/// write it.
fn check_own(path: &Path, md: &std::fs::Metadata) -> anyhow::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    if md.uid() != me {
        bail!(
            "{} is owned by uid {}, not by this process (uid {me}); Airlock keeps its state only \
             where nobody else could have put anything",
            path.display(),
            md.uid()
        );
    }
    if md.mode() & 0o022 != 0 {
        bail!(
            "{} can be written by other users (mode {:o}); make it private first: chmod go-w {}",
            path.display(),
            md.mode() & 0o7777,
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn accepts_its_own_dir_and_refuses_one_others_can_change() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("data");
        let data = DataDir::open(&root, None).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(data.root()), 0o700);
        assert_eq!(mode(data.templates()), 0o700);

        std::fs::write(data.api_key_file(), "k").unwrap();
        chmod(&data.api_key_file(), 0o644);
        DataDir::open(&root, None).unwrap();
        assert_eq!(mode(&data.api_key_file()), 0o600, "made private");

        chmod(&data.api_key_file(), 0o666);
        let err = DataDir::open(&root, None).err().unwrap().to_string();
        assert!(err.contains("can be written by other users"), "{err}");
        chmod(&data.api_key_file(), 0o600);

        chmod(data.root(), 0o777);
        assert!(DataDir::open(&root, None).is_err());
        chmod(data.root(), 0o700);

        // A dir others may write sits above it: someone could swap the data dir.
        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        chmod(&shared, 0o777);
        let err = DataDir::open(&shared.join("data"), None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("which another user can change"), "{err}");
        chmod(&shared, 0o1777); // sticky, as /tmp: fine
        DataDir::open(&shared.join("data2"), None).unwrap();

        // A symlink is followed once, and the resolved path used from then on.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        assert_eq!(DataDir::open(&link, None).unwrap().root(), data.root());
    }
}
