//! `airlock install`: sets Airlock up as a systemd service: the data dir, an API key, and a
//! unit that runs `airlock serve` at boot and keeps sandboxes running through its restarts.

use crate::data_dir::DataDir;
use airlock_core::store::Store;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The service's name, and its unit file's.
pub const UNIT: &str = "airlock.service";

pub struct InstallOptions {
    pub data_dir: PathBuf,
    pub templates_dir: Option<PathBuf>,
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// Where the unit file goes.
    pub unit_dir: PathBuf,
    /// Enable and start the service (when systemd runs this host).
    pub start: bool,
}

pub async fn install(opts: InstallOptions) -> anyhow::Result<()> {
    let binary = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .context("locating the airlock binary")?;
    // The service runs the ones beside this binary: they must be there.
    for companion in ["airlock-agent", "airlock-netd"] {
        super::binaries::find_binary(companion, None)?;
    }
    let data = DataDir::open(&opts.data_dir, opts.templates_dir.as_deref())?;
    let store = Store::open(&data.db()).context("opening the state database")?;
    let key = super::keys::ensure_api_key(&store, &data).await?;

    let unit = unit_file(&binary, &data, opts.templates_dir.as_deref(), &opts);
    std::fs::create_dir_all(&opts.unit_dir)
        .with_context(|| format!("creating {}", opts.unit_dir.display()))?;
    let path = opts.unit_dir.join(UNIT);
    std::fs::write(&path, unit).with_context(|| format!("writing {}", path.display()))?;
    println!("Wrote {}", path.display());
    super::keys::print_key(&key, &data);

    let systemd_runs = Path::new("/run/systemd/system").is_dir();
    if opts.start && systemd_runs {
        for args in [&["daemon-reload"][..], &["enable", "--now", UNIT]] {
            let status = std::process::Command::new("systemctl")
                .args(args)
                .status()
                .context("running systemctl")?;
            anyhow::ensure!(status.success(), "systemctl {} failed", args.join(" "));
        }
        println!("Started {UNIT}. The first start builds the built-in templates (minutes).");
    } else {
        if opts.start {
            println!("systemd does not run this host: start the server with the unit's ExecStart.");
        }
        println!("Start it with:  systemctl daemon-reload && systemctl enable --now {UNIT}");
    }
    println!("Logs:           journalctl -u airlock -f");
    println!("Status:         systemctl status airlock");
    println!(
        "Stop/restart:   systemctl stop|restart airlock (running sandboxes run on and are adopted \
         at the next start)"
    );
    println!(
        "Clients:        export E2B_API_URL=http://{0} E2B_SANDBOX_URL=http://{0} E2B_API_KEY=<key>",
        opts.listen
    );
    Ok(())
}

/// The unit: `serve` on the data dir, restarted if it fails, and stopped by signalling the
/// server alone (`KillMode=process`), so that sandboxes outlive its restarts.
fn unit_file(
    binary: &Path,
    data: &DataDir,
    templates_dir: Option<&Path>,
    opts: &InstallOptions,
) -> String {
    let mut exec = format!(
        "{} --data-dir {}",
        unit_word(binary),
        unit_word(data.root())
    );
    if let Some(dir) = templates_dir {
        exec.push_str(&format!(" --templates-dir {}", unit_word(dir)));
    }
    exec.push_str(&format!(" serve --listen {}", opts.listen));
    if let Some(addr) = opts.metrics_listen {
        exec.push_str(&format!(" --metrics-listen {addr}"));
    }
    format!(
        "# Written by `airlock install`; run it again to change the settings.\n\
         [Unit]\n\
         Description=Airlock: sandboxes for AI-generated code (E2B-compatible)\n\
         After=network-online.target\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={exec}\n\
         # Only the server is signalled at a stop: running sandboxes run on, and the next start\n\
         # adopts them. (With --stop-sandboxes-on-exit the server kills them itself.)\n\
         KillMode=process\n\
         TimeoutStopSec=90\n\
         Restart=on-failure\n\
         RestartSec=2\n\
         LimitNOFILE=1048576\n\
         TasksMax=infinity\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

/// A path as one word of a unit's command line: double-quoted if it has anything but plain
/// characters, with systemd's `%` specifiers and `$` variables escaped.
fn unit_word(path: &Path) -> String {
    let escaped = path.to_string_lossy().replace('%', "%%").replace('$', "$$");
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@,%$".contains(c);
    if escaped.chars().all(plain) {
        return escaped;
    }
    format!("\"{}\"", escaped.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::unit_word;
    use std::path::Path;

    #[test]
    fn paths_become_one_word_of_a_units_command_line() {
        assert_eq!(unit_word(Path::new("/var/lib/airlock")), "/var/lib/airlock");
        assert_eq!(unit_word(Path::new("/srv/my data")), "\"/srv/my data\"");
        assert_eq!(unit_word(Path::new("/srv/a\"b")), "\"/srv/a\\\"b\"");
        assert_eq!(unit_word(Path::new("/srv/100%")), "/srv/100%%");
        assert_eq!(unit_word(Path::new("/srv/$HOME")), "/srv/$$HOME");
    }
}
