//! The first API key: the server makes sure one exists (from `AIRLOCK_API_KEY`, or generated
//! into the data dir for the CLI on this host), and says which one clients use.

use crate::data_dir::DataDir;
use airlock_core::keys::{hash_key, new_api_key};
use airlock_core::store::{KeyLimits, Store};
use anyhow::{bail, Context};
use std::path::Path;

/// Makes sure at least one API key exists. Returns a key to print if one was made or given.
pub(crate) async fn ensure_api_key(store: &Store, data: &DataDir) -> anyhow::Result<KeySource> {
    if let Ok(key) = std::env::var("AIRLOCK_API_KEY") {
        if key.trim().is_empty() {
            bail!("AIRLOCK_API_KEY is set but empty");
        }
        store
            .keys()
            .add(
                &hash_key(key.trim()),
                "from AIRLOCK_API_KEY",
                airlock_core::lifecycle::now_unix(),
                KeyLimits::default(),
                false,
            )
            .await?;
        return Ok(KeySource::Environment);
    }
    if store.keys().live_count().await? > 0 {
        return Ok(KeySource::Existing);
    }
    let key = new_api_key();
    store
        .keys()
        .add(
            &hash_key(&key),
            "generated at first start",
            airlock_core::lifecycle::now_unix(),
            KeyLimits::default(),
            false,
        )
        .await?;
    write_private(&data.api_key_file(), key.as_bytes())?;
    Ok(KeySource::Generated(key))
}

pub(crate) enum KeySource {
    Environment,
    Existing,
    Generated(String),
}

/// Says which API key clients use, printing it if it was just made.
pub(crate) fn print_key(key: &KeySource, data: &DataDir) {
    match key {
        KeySource::Generated(key) => {
            println!(
                "Generated API key (also saved to {}):",
                data.api_key_file().display()
            );
            println!("  {key}");
        }
        KeySource::Environment => println!("API key: from AIRLOCK_API_KEY"),
        KeySource::Existing => println!(
            "API key: as before (the generated one is in {})",
            data.api_key_file().display()
        ),
    }
}

fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(contents)?;
    Ok(())
}
