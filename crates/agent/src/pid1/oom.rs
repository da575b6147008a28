//! The sandbox's own out-of-memory killer.
//!
//! gVisor runs every process of a sandbox inside one host process group (the sentry), so when
//! the sandbox's memory runs out, all the host's OOM killer can kill is the whole sandbox. This
//! guard acts first: when less than [`RESERVE_PERCENT`] of the sandbox's memory is left, it kills
//! the process using the most, as Linux's OOM killer would, and the exit status says SIGKILL.
//! The host allows the sandbox a little more than its size (see the driver), so that in practice
//! it never has to step in.

use std::time::Duration;

/// Kill when less than this share of `MemTotal` is available.
const RESERVE_PERCENT: u64 = 5;
/// Look this often while less than half the memory is used ...
const RELAXED: Duration = Duration::from_millis(100);
/// ... and this often above that, since an allocation loop fills memory at GB/s.
const WATCHFUL: Duration = Duration::from_millis(10);

/// Watches the sandbox's memory for good; meant for a thread of its own, in the sandbox's first
/// process only (anywhere else it would be killing the host's processes).
pub fn guard() {
    loop {
        let Some((total, available)) = meminfo() else {
            std::thread::sleep(RELAXED);
            continue;
        };
        if available * 100 < total * RESERVE_PERCENT {
            if let Some((pid, rss_kb)) = biggest_process() {
                tracing::warn!(pid, rss_kb, "out of memory: killing the largest process");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        std::thread::sleep(if available * 2 < total {
            WATCHFUL
        } else {
            RELAXED
        });
    }
}

/// `MemTotal` and `MemAvailable`, in kB.
fn meminfo() -> Option<(u64, u64)> {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// The process with the largest resident set, but the agent itself.
fn biggest_process() -> Option<(i32, u64)> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != 1)
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            Some((pid, rss_kb(&status)?))
        })
        .max_by_key(|&(_, rss)| rss)
}

fn rss_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memory_figures() {
        let meminfo = "MemTotal:         524288 kB\nMemFree:          299404 kB\nMemAvailable:     299000 kB\n";
        assert_eq!(parse_meminfo(meminfo), Some((524288, 299000)));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        assert_eq!(rss_kb("Name:\tpython3\nVmRSS:\t219592 kB\n"), Some(219592));
        assert_eq!(rss_kb("Name:\tkthread\n"), None);
    }
}
