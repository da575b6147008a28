//! Calls to the `runsc` binary, all against one `--root` state directory.
//!
//! The one privileged trick lives here: [`Runsc::run_detached`] starts runsc in a private mount
//! namespace where `/proc/sys/net` is an empty tmpfs. This runsc (0.0~20240729.0) refuses
//! `--network=sandbox` when `/proc/sys/net/core/rmem_default` exists, taking that as proof of
//! running in the host's network namespace; kernels since 5.x show the file in every netns.
//! Hiding the directory from runsc alone (and from the sandbox and gofer processes it forks,
//! which inherit the namespace) gets past the check without touching anything else on the host.

use airlock_core::driver::DriverError;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use std::ffi::CStr;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;
use tokio::process::Command;

/// How long any runsc call may take before we give up on it (and kill it).
const TIMEOUT: Duration = Duration::from_secs(60);
/// How much of `launch.log` goes into an error.
const LOG_TAIL_BYTES: u64 = 2048;

/// Everything one `runsc run` needs, with paths inside the bundle directory.
pub(crate) struct RunArgs<'a> {
    pub id: &'a str,
    pub bundle: &'a Path,
    /// Holds the sandbox's writable layer (runsc's filestore file); `None` writes through to
    /// the rootfs (a template build's step).
    pub overlay_dir: Option<&'a Path>,
    /// runsc's stdout and stderr, and then the sandbox's first process's.
    pub log: &'a Path,
    /// Restore this checkpoint image instead of booting the sandbox.
    pub image: Option<&'a Path>,
}

pub(crate) struct Runsc {
    bin: PathBuf,
    root: PathBuf,
}

impl Runsc {
    pub fn new(bin: PathBuf, root: PathBuf) -> Self {
        Runsc { bin, root }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--root")
            .arg(&self.root)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// `runsc run --detach` (or `runsc restore --detach` from [`RunArgs::image`]): returns once
    /// the sandbox's first process runs.
    ///
    /// Flags, and why:
    /// - `--platform=systrap`: works on any x86_64 host; our `/dev/kvm` runs only PVM guests.
    /// - `--network=sandbox`: gVisor's own netstack inside the netns named in the spec, so the
    ///   sandbox never talks to the host kernel's network stack, and checkpoint stays possible
    ///   (`--network=host` refuses checkpoint).
    /// - `--overlay2=root:dir=…`: the rootfs is the shared, read-only template; each sandbox's
    ///   writes land in a filestore file under its own bundle, on disk rather than in host RAM.
    ///   A template build's step runs with `--overlay2=none` instead: its writes go through the
    ///   gofer into the rootfs, an overlay mount whose upper directory becomes the step's layer.
    /// - `--net-disconnect-ok`: a checkpoint resets the sandbox's TCP connections to the outside
    ///   instead of refusing to save them. The lifecycle drains connections first anyway (see
    ///   [`crate::net::wait_until_drained`]); this covers what it cannot close, such as a
    ///   sandbox's own outbound connections.
    pub async fn run_detached(&self, args: &RunArgs<'_>) -> Result<(), DriverError> {
        let log = std::fs::File::create(args.log)
            .map_err(DriverError::io(format!("creating {}", args.log.display())))?;
        // A file, not a pipe: the detached sandbox inherits these as its own stdio and outlives us.
        let log_err = log
            .try_clone()
            .map_err(DriverError::io("duplicating the launch log"))?;
        let overlay = match args.overlay_dir {
            Some(dir) => {
                let mut flag = std::ffi::OsString::from("--overlay2=root:dir=");
                flag.push(dir);
                flag
            }
            None => "--overlay2=none".into(),
        };

        let mut cmd = self.command();
        cmd.args([
            "--platform=systrap",
            "--network=sandbox",
            "--net-disconnect-ok",
        ])
        .arg(overlay);
        match args.image {
            None => cmd.arg("run"),
            Some(image) => cmd.arg("restore").arg("--image-path").arg(image),
        };
        cmd.args(["--detach", "--bundle"])
            .arg(args.bundle)
            .arg(args.id)
            .stdout(log)
            .stderr(log_err);
        hide_proc_sys_net(&mut cmd);

        let status = match tokio::time::timeout(TIMEOUT, cmd.status()).await {
            Ok(status) => status.map_err(DriverError::io("starting runsc"))?,
            Err(_) => {
                return Err(DriverError::Command {
                    what: "runsc run".into(),
                    detail: format!("no answer in {TIMEOUT:?}; {}", log_tail(args.log)),
                })
            }
        };
        if status.success() {
            Ok(())
        } else {
            Err(DriverError::Command {
                what: "runsc run".into(),
                detail: format!("{status}: {}", log_tail(args.log)),
            })
        }
    }

    /// `runsc checkpoint --leave-running`: writes the sandbox's memory and filesystem to
    /// `image` (a directory) while the sandbox keeps running. Without `--leave-running` a failed
    /// checkpoint (a full disk, say) stops the sandbox and everything in it is lost; with it, a
    /// failure leaves the sandbox as it was.
    pub async fn checkpoint(&self, id: &str, image: &Path) -> Result<(), DriverError> {
        let mut cmd = self.command();
        // Uncompressed: restores read the pages back faster, and disk is cheaper than latency.
        cmd.args([
            "checkpoint",
            "--leave-running",
            "--compression=none",
            "--image-path",
        ])
        .arg(image)
        .arg(id);
        let out = self.output("runsc checkpoint", cmd).await?;
        if out.status.success() {
            return Ok(());
        }
        // runsc prints a Go stack trace after the reason; the first line is the reason.
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reason = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        Err(DriverError::Command {
            what: "runsc checkpoint".into(),
            detail: format!("{}: {}", out.status, reason.trim()),
        })
    }

    /// `runsc delete --force`: kills the sandbox and removes its state and cgroups. Succeeds if
    /// the container does not exist.
    ///
    /// runsc then waits (up to 5 s) until the sandbox process is gone, and a zombie counts as
    /// there: with `run --detach` the sandbox is reparented to PID 1 (or the nearest subreaper),
    /// so this takes as long as that process takes to reap.
    pub async fn delete(&self, id: &str) -> Result<(), DriverError> {
        let mut cmd = self.command();
        cmd.args(["delete", "--force", id]);
        let out = self.output("runsc delete", cmd).await?;
        if out.status.success() || self.state(id).await.is_none() {
            return Ok(());
        }
        Err(command_error("runsc delete", &out))
    }

    /// The container's status (`running`, `created`, `stopped`, `paused`), or `None` if runsc
    /// does not know it.
    pub async fn state(&self, id: &str) -> Option<String> {
        let mut cmd = self.command();
        cmd.args(["state", id]);
        let out = self.output("runsc state", cmd).await.ok()?;
        if !out.status.success() {
            return None;
        }
        let state: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        state.get("status")?.as_str().map(str::to_owned)
    }

    /// Ids of every container under our `--root`.
    pub async fn list(&self) -> Result<Vec<String>, DriverError> {
        let mut cmd = self.command();
        cmd.args(["list", "--quiet"]);
        let out = self.output("runsc list", cmd).await?;
        if !out.status.success() {
            return Err(command_error("runsc list", &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    async fn output(&self, what: &str, mut cmd: Command) -> Result<Output, DriverError> {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        match tokio::time::timeout(TIMEOUT, cmd.output()).await {
            Ok(out) => out.map_err(DriverError::io(format!("starting {what}"))),
            Err(_) => Err(DriverError::Command {
                what: what.into(),
                detail: format!("no answer in {TIMEOUT:?}"),
            }),
        }
    }
}

/// Makes `cmd` run in its own mount namespace with an empty, read-only tmpfs over
/// `/proc/sys/net` (see the module doc for why).
fn hide_proc_sys_net(cmd: &mut Command) {
    const ROOT: &CStr = c"/";
    const TARGET: &CStr = c"/proc/sys/net";
    const NONE: &CStr = c"none";
    const TMPFS: &CStr = c"tmpfs";
    const OPTIONS: &CStr = c"mode=0555,size=4k";
    // SAFETY: the closure runs in the forked child between fork and exec, where only
    // async-signal-safe work is allowed. It makes three system calls and nothing else: every
    // string is a `'static` C string that nix passes through without copying, and nix's errors
    // are plain errno values that convert to `io::Error` without allocating.
    unsafe {
        cmd.pre_exec(|| {
            unshare(CloneFlags::CLONE_NEWNS)?;
            // Private first, so the tmpfs below cannot propagate back to the host's namespace.
            mount(
                None::<&CStr>,
                ROOT,
                None::<&CStr>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&CStr>,
            )?;
            mount(
                Some(NONE),
                TARGET,
                Some(TMPFS),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some(OPTIONS),
            )?;
            Ok(())
        });
    }
}

fn command_error(what: &str, out: &Output) -> DriverError {
    let stderr = String::from_utf8_lossy(&out.stderr);
    DriverError::Command {
        what: what.into(),
        detail: format!("{}: {}", out.status, stderr.trim()),
    }
}

/// The last [`LOG_TAIL_BYTES`] of the launch log, as text.
fn log_tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).trim().to_owned())
    };
    match read() {
        Ok(tail) if tail.is_empty() => "launch log is empty".into(),
        Ok(tail) => tail,
        Err(e) => format!("launch log unreadable: {e}"),
    }
}
