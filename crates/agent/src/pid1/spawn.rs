//! Starting a command without copying the agent's address space.
//!
//! Under gVisor a `fork` costs about 20 ms: the copy of the address space needs a host stub
//! process of its own, and every page either side touches afterwards faults. std's `Command`
//! forks whenever it changes the user or runs a `pre_exec` hook, and every command does both, so
//! that fork was a quarter of an SDK command's time. This starts the child as glibc's
//! `posix_spawn` does: with `CLONE_VM | CLONE_VFORK` the child runs on the agent's memory, on a
//! stack of its own, until its `execve` replaces it, while the calling thread waits.
//!
//! Until then the child makes plain system calls only: it allocates nothing and takes no lock,
//! and it changes its credentials with raw syscalls, because glibc's `setuid` would act on every
//! thread of the agent. All signals are blocked around the clone, so no agent signal handler can
//! run on the child's stack; the child sets every handled signal back to its default first.
//!
//! The child ends up as std's `Command` left it (tested against it below): stdio on 0-2, no
//! supplementary groups, the user's uid and gid, the cwd, its own process group (or session
//! with a controlling terminal), an empty signal mask with `SIGPIPE` at its default, the process
//! cap of [`crate::pid1::rlimits`], and the program found as `execvp` finds it in the child's `PATH`.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

/// What to start, and as whom.
pub struct Spec {
    pub program: String,
    pub args: Vec<String>,
    /// The whole environment, in the order the child sees it (std sorts it by name too).
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub stdio: Stdio,
}

/// The child's standard descriptors.
pub enum Stdio {
    /// Pipes for stdout and stderr, and for stdin unless `stdin` is false (then /dev/null); the
    /// child gets a process group of its own.
    Pipes { stdin: bool },
    /// A new terminal of this size on all three; the child leads a new session with it as the
    /// controlling terminal, and the agent keeps the master side.
    Terminal(libc::winsize),
}

/// A started child: its pid and the agent's ends of its pipes or terminal.
pub struct Child {
    pub pid: u32,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub terminal: Option<OwnedFd>,
}

/// Everything the child reads, prepared before the clone: it may not allocate.
struct ChildPlan {
    /// Paths to try in order, as `execvp` would.
    candidates: Vec<CString>,
    argv: Vec<*const c_char>,
    /// For each candidate, `/bin/sh CANDIDATE ARGS...`: how `execvp` runs a file that is not
    /// an executable format (`ENOEXEC`).
    sh_argvs: Vec<Vec<*const c_char>>,
    envp: Vec<*const c_char>,
    cwd: CString,
    uid: libc::uid_t,
    gid: libc::gid_t,
    stdio: [c_int; 3],
    /// Whether the child starts a session with its stdin as the controlling terminal.
    terminal: bool,
    /// The errno of the step that failed, for the parent.
    error: AtomicI32,
}

const SH: &std::ffi::CStr = c"/bin/sh";
const CHILD_STACK: usize = 256 * 1024;

/// Starts `spec`. The pid is the reaper's to leave alone and the caller's to wait for
/// ([`wait`]).
pub fn spawn(spec: &Spec) -> io::Result<Child> {
    let cstr = |s: &[u8]| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let args: Vec<CString> = std::iter::once(spec.program.as_bytes())
        .chain(spec.args.iter().map(|a| a.as_bytes()))
        .map(cstr)
        .collect::<io::Result<_>>()?;
    let env: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
        .collect::<io::Result<_>>()?;
    let candidates: Vec<CString> = candidates(&spec.program, spec.env.get("PATH"))
        .iter()
        .map(|p| cstr(p.as_os_str().as_bytes()))
        .collect::<io::Result<_>>()?;
    let argv = pointers(&args);
    let sh_argvs = candidates
        .iter()
        .map(|c| {
            [SH.as_ptr(), c.as_ptr()]
                .into_iter()
                .chain(argv[1..].iter().copied())
                .collect()
        })
        .collect();

    let mut child = Child {
        pid: 0,
        stdin: None,
        stdout: None,
        stderr: None,
        terminal: None,
    };
    // The child's ends, kept open until it has exec'd.
    let mut theirs: Vec<OwnedFd> = Vec::new();
    let (stdio, terminal) = match spec.stdio {
        Stdio::Pipes { stdin } => {
            let input: OwnedFd = if stdin {
                let (read, write) = std::io::pipe()?;
                child.stdin = Some(write.into());
                read.into()
            } else {
                std::fs::File::open("/dev/null")?.into()
            };
            let (out_read, out_write) = std::io::pipe()?;
            let (err_read, err_write) = std::io::pipe()?;
            child.stdout = Some(out_read.into());
            child.stderr = Some(err_read.into());
            theirs.extend([input, out_write.into(), err_write.into()]);
            let fds = [0, 1, 2].map(|i| theirs[i].as_raw_fd());
            (fds, false)
        }
        Stdio::Terminal(size) => {
            let (master, slave) = open_terminal(size)?;
            child.terminal = Some(master);
            theirs.push(slave);
            ([theirs[0].as_raw_fd(); 3], true)
        }
    };
    let plan = ChildPlan {
        candidates,
        argv,
        sh_argvs,
        envp: pointers(&env),
        cwd: cstr(spec.cwd.as_os_str().as_bytes())?,
        uid: spec.uid,
        gid: spec.gid,
        stdio,
        terminal,
        error: AtomicI32::new(0),
    };
    child.pid = clone_and_exec(&plan)?;
    drop(theirs);
    Ok(child)
}

/// A new terminal (master, slave), both closed on exec: a child gets the slave side as its stdio
/// only, and no child inherits another's terminal.
fn open_terminal(size: libc::winsize) -> io::Result<(OwnedFd, OwnedFd)> {
    let pty = nix::pty::openpty(Some(&size), None)?;
    for fd in [&pty.master, &pty.slave] {
        let cloexec = nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC);
        nix::fcntl::fcntl(fd.as_raw_fd(), cloexec)?;
    }
    Ok((pty.master, pty.slave))
}

/// The paths `execvp` would try for `program` with the child's `PATH`.
fn candidates(program: &str, path: Option<&String>) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    // glibc's default when the environment has no PATH.
    let path = path.map(String::as_str).unwrap_or("/bin:/usr/bin");
    path.split(':')
        .map(|dir| PathBuf::from(if dir.is_empty() { "." } else { dir }).join(program))
        .collect()
}

/// A NULL-terminated array of pointers into `strings`, which must outlive it.
fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn clone_and_exec(plan: &ChildPlan) -> io::Result<u32> {
    let stack = Stack::new()?;
    // SAFETY: the child runs `child_main` on its own stack and only reads `plan`, which outlives
    // it: CLONE_VFORK holds this thread until the child has exec'd or exited. All signals are
    // blocked across the clone so that no handler of the agent runs in the child.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            plan as *const ChildPlan as *mut c_void,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    match plan.error.load(Ordering::SeqCst) {
        0 => Ok(pid as u32),
        errno => {
            // The child exited with 127 after the failed step; collect it.
            // SAFETY: `pid` is our child and nobody else waits for it yet.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `ChildPlan`, alive until this child execs or exits.
    let plan = unsafe { &*(arg as *const ChildPlan) };
    // SAFETY: only plain system calls on memory `plan` owns; see the module docs.
    let errno = unsafe { prepare_and_exec(plan) };
    plan.error.store(errno, Ordering::SeqCst);
    // SAFETY: leaves the child without running any of the parent's exit handlers.
    unsafe { libc::_exit(127) }
}

/// The errno of the last failed call (read without allocating).
fn errno() -> c_int {
    // SAFETY: glibc's pointer to this thread's errno is always valid.
    unsafe { *libc::__errno_location() }
}

/// Returns only on failure, with the errno of the step that failed.
unsafe fn prepare_and_exec(plan: &ChildPlan) -> c_int {
    for sig in 1..=64 {
        let mut action: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut action) == 0
            && (action.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
            && action.sa_sigaction != libc::SIG_DFL
        {
            let default: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &default, std::ptr::null_mut());
        }
    }
    for (target, &fd) in plan.stdio.iter().enumerate() {
        let target = target as c_int;
        // dup2 onto itself would keep close-on-exec set.
        let moved = if fd == target {
            libc::fcntl(fd, libc::F_SETFD, 0)
        } else {
            libc::dup2(fd, target)
        };
        if moved < 0 {
            return errno();
        }
    }
    if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0
        || libc::syscall(libc::SYS_setgid, plan.gid) < 0
        || libc::syscall(libc::SYS_setuid, plan.uid) < 0
        || libc::chdir(plan.cwd.as_ptr()) < 0
    {
        return errno();
    }
    let session = if plan.terminal {
        libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0
    } else {
        libc::setpgid(0, 0) < 0
    };
    if session {
        return errno();
    }
    let mut empty: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut empty);
    if libc::setrlimit(libc::RLIMIT_NPROC, &crate::pid1::rlimits::PROCESS_CAP) < 0
        || libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0
    {
        return errno();
    }
    exec_first(plan)
}

/// Tries each candidate as `execvp` does: a missing one is skipped, a denied one is remembered,
/// and a file that is no executable format is run by `/bin/sh`.
unsafe fn exec_first(plan: &ChildPlan) -> c_int {
    let mut denied = false;
    let mut last = libc::ENOENT;
    for (candidate, sh_argv) in plan.candidates.iter().zip(&plan.sh_argvs) {
        libc::execve(candidate.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        last = errno();
        match last {
            libc::ENOEXEC => {
                libc::execve(SH.as_ptr(), sh_argv.as_ptr(), plan.envp.as_ptr());
                return errno();
            }
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            other => return other,
        }
    }
    if denied {
        libc::EACCES
    } else {
        last
    }
}

/// The child's stack: its own mapping, with a guard page below it.
struct Stack(*mut c_void);

impl Stack {
    fn new() -> io::Result<Stack> {
        // SAFETY: a fresh anonymous mapping, unmapped on drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHILD_STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the lowest page of our own mapping.
        if unsafe { libc::mprotect(base, 4096, libc::PROT_NONE) } < 0 {
            let err = io::Error::last_os_error();
            // SAFETY: our own mapping.
            unsafe { libc::munmap(base, CHILD_STACK) };
            return Err(err);
        }
        Ok(Stack(base))
    }

    /// Stacks grow down: the child starts at the top (which is 16-byte aligned).
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of our mapping.
        unsafe { self.0.add(CHILD_STACK) }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used: the child has exec'd or exited.
        unsafe { libc::munmap(self.0, CHILD_STACK) };
    }
}

/// Waits for `pid`, a child of [`spawn`], on a thread of its own, so that a long-running child
/// holds no worker of the async runtime.
pub async fn wait(pid: u32) -> io::Result<ExitStatus> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("wait-{pid}"))
        .spawn(move || {
            let mut status = 0;
            let result = loop {
                // SAFETY: waits for our own child, into a local.
                if unsafe { libc::waitpid(pid as i32, &mut status, 0) } >= 0 {
                    break Ok(ExitStatus::from_raw(status));
                }
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    break Err(err);
                }
            };
            let _ = tx.send(result);
        })?;
    rx.await
        .map_err(|_| io::Error::other("the waiting thread ended early"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::process::CommandExt;

    /// What a command can observe of how it was started (`$$` is the started process).
    const PROBE: &str = r#"
        set -e
        echo "ids $(id -u) $(id -g) [$(id -G)] cwd $(pwd) umask $(umask)"
        grep 'Max processes' /proc/$$/limits
        env | sort
        # Read by the shell itself: while it waits for a child, its mask is not its own.
        while read -r key value; do
            case $key in Uid*|Gid*|Groups*|Sig[BI]*|Cap*|NoNewPrivs*) echo "$key $value" ;; esac
        done < /proc/$$/status
        set -- $(sed 's/.*) //' /proc/$$/stat)
        [ "$3" = "$$" ] && echo "leads its process group"
        [ "$4" = "$$" ] && echo "leads its session"
        for fd in /proc/$$/fd/*; do echo "fd ${fd##*/}: $(readlink "$fd" | sed 's/\[.*//')"; done
        tty || true
    "#;

    /// The tests run one at a time: a descriptor another test holds open without close-on-exec
    /// (a terminal) would show in this one's child.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    fn probe_spec(stdio: Stdio) -> Spec {
        // As root (CI, and the agent), start the probe as `nobody`; otherwise as ourselves.
        // SAFETY: plain getters.
        let root = unsafe { libc::geteuid() } == 0;
        let (uid, gid) = if root {
            (65534, 65534)
        } else {
            unsafe { (libc::getuid(), libc::getgid()) }
        };
        Spec {
            program: "sh".into(),
            args: vec!["-c".into(), PROBE.into()],
            env: [("PATH", "/usr/bin:/bin"), ("B_VAR", "b"), ("A_VAR", "a")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            cwd: "/".into(),
            uid,
            gid,
            stdio,
        }
    }

    /// The same start through std's `Command`, which forks: what the agent did before.
    fn std_command(spec: &Spec) -> std::process::Command {
        let mut cmd = std::process::Command::new(&spec.program);
        cmd.args(&spec.args)
            .current_dir(&spec.cwd)
            .env_clear()
            .envs(&spec.env)
            .uid(spec.uid)
            .gid(spec.gid);
        crate::pid1::rlimits::cap_processes(&mut cmd);
        cmd
    }

    #[tokio::test]
    async fn a_piped_child_sees_what_a_std_command_saw() {
        let _serial = ONE_AT_A_TIME.lock().await;
        let spec = probe_spec(Stdio::Pipes { stdin: true });
        let expected = std_command(&spec)
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .output()
            .unwrap();
        assert!(expected.status.success(), "{expected:?}");

        let child = spawn(&spec).unwrap();
        let stdout = read_all(child.stdout);
        let status = wait(child.pid).await.unwrap();
        assert!(status.success());
        assert_eq!(stdout, String::from_utf8(expected.stdout).unwrap());
        // The positive control: the probe does see how a process was started.
        assert!(stdout.contains("leads its process group"), "{stdout}");
        assert!(stdout.contains("A_VAR=a\nB_VAR=b\n"), "{stdout}");
        assert!(stdout.contains("SigBlk: 0000000000000000\n"), "{stdout}");
    }

    /// Everything written to a terminal until its last slave side closes (then reads fail).
    fn read_terminal(master: &OwnedFd) -> String {
        let mut out = Vec::new();
        let _ = std::fs::File::from(master.try_clone().unwrap()).read_to_end(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn a_terminal_child_sees_what_a_std_command_saw() {
        let _serial = ONE_AT_A_TIME.lock().await;
        let size = libc::winsize {
            ws_row: 24,
            ws_col: 80,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let (master, slave) = open_terminal(size).unwrap();
        let spec = probe_spec(Stdio::Terminal(size));
        let mut cmd = std_command(&spec);
        let stdio = || std::process::Stdio::from(slave.try_clone().unwrap());
        cmd.stdin(stdio()).stdout(stdio()).stderr(stdio());
        // SAFETY: what the agent did: async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut std_child = cmd.spawn().unwrap();
        drop((cmd, slave));
        let expected = read_terminal(&master);
        assert!(std_child.wait().unwrap().success());
        drop(master);

        let child = spawn(&spec).unwrap();
        let seen = read_terminal(child.terminal.as_ref().unwrap());
        assert!(wait(child.pid).await.unwrap().success());
        // The terminals' numbers differ between the two runs; nothing else may.
        let normalize = |s: &str| s.replace(|c: char| c.is_ascii_digit(), "#");
        assert_eq!(normalize(&seen), normalize(&expected));
        assert!(seen.contains("leads its session"), "{seen}");
        assert!(seen.contains("/dev/pts/"), "{seen}");
    }

    /// The probe on pipes without input, started as the test's own user, so that it may use
    /// the test's temp dir.
    fn piped_as_ourselves() -> Spec {
        // SAFETY: plain getters.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Spec {
            uid,
            gid,
            ..probe_spec(Stdio::Pipes { stdin: false })
        }
    }

    fn read_all(fd: Option<OwnedFd>) -> String {
        let mut out = String::new();
        std::fs::File::from(fd.unwrap())
            .read_to_string(&mut out)
            .unwrap();
        out
    }

    #[tokio::test]
    async fn failures_are_reported_as_execvp_reports_them() {
        let _serial = ONE_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let not_executable = dir.path().join("data");
        std::fs::write(&not_executable, "data").unwrap();
        let mut spec = piped_as_ourselves();
        spec.program = "no-such-program".into();
        assert_eq!(spawn(&spec).err().unwrap().kind(), io::ErrorKind::NotFound);
        spec.program = not_executable.to_string_lossy().into_owned();
        assert_eq!(
            spawn(&spec).err().unwrap().kind(),
            io::ErrorKind::PermissionDenied
        );
        spec.program = "sh".into();
        spec.cwd = dir.path().join("no-such-dir");
        assert_eq!(spawn(&spec).err().unwrap().kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn a_script_without_an_interpreter_line_runs_with_sh() {
        let _serial = ONE_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        std::fs::write(&script, "echo \"ran with $# args: $*\"\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut spec = piped_as_ourselves();
        spec.program = script.to_string_lossy().into_owned();
        spec.args = vec!["one".into(), "two".into()];
        let child = spawn(&spec).unwrap();
        let stdout = read_all(child.stdout);
        assert!(wait(child.pid).await.unwrap().success());
        assert_eq!(stdout, "ran with 2 args: one two\n");
    }
}
