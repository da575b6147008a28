//! End-to-end check of the gVisor driver on a real host (needs root and runsc).
//!
//! `cargo run -p airlock-gvisor --example smoke [DATA_DIR]` (default `/var/lib/airlock-dev`,
//! which `scripts/prepare.sh DATA_DIR` prepares): takes the `base` template built there, starts two sandboxes whose "agent" is a small Python
//! HTTP server standing in for the real one, checks addresses, isolation and what the sandbox
//! sees, destroys both and checks that nothing is left on the host. Prints timings.

use airlock_core::driver::{Driver, LaunchSpec, Placement, Resources, RootfsWrites};
use airlock_core::egress::Egress;
use airlock_core::ids::{SandboxId, TemplateName};
use airlock_core::store::Store;
use airlock_core::template;
use airlock_gvisor::{GvisorConfig, GvisorDriver};
use anyhow::{bail, ensure, Context};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Stands in for the agent: answers on :49983 at once; `/info` reports what the sandbox sees.
/// Plain `socketserver`, because `http.server.HTTPServer` looks its own name up in DNS.
const FAKE_AGENT: &str = r#"#!/usr/bin/python3
import json, os, socket, socketserver, subprocess, http.server

def sh(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return (r.stdout + r.stderr).strip()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/probe/"):
            _, _, host, port = self.path.split("/")
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                body = b"reachable"
            except OSError as e:
                body = str(e).encode()
        elif self.path == "/info":
            if not os.path.exists("/root/owner"):
                with open("/root/owner", "w") as f:
                    f.write(socket.gethostname())
            body = json.dumps({
                "hostname": socket.gethostname(),
                "fqdn": socket.getfqdn(),
                "owner": open("/root/owner").read(),
                "df": sh("df -h /"),
                "sudo": sh("sudo -u user id"),
                "caps": sh("grep Cap /proc/self/status"),
                "agent_fds": sh("ls -l /proc/1/fd"),
                "mem": sh("head -1 /proc/meminfo"),
                "tmp": sh("findmnt -n -o FSTYPE /tmp || grep ' /tmp ' /proc/mounts"),
            }).encode()
        else:
            body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", 49983), Handler).serve_forever()
"#;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let data = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "/var/lib/airlock-dev".into()),
    );
    let store = Store::open(&data.join("airlock.db"))?;

    // `airlock serve` (or scripts/prepare.sh) builds it into the data dir.
    let record = store
        .templates()
        .get(&TemplateName::parse(template::BASE)?)
        .await?
        .context("no base template in this data dir: run scripts/prepare.sh DATA_DIR first")?;
    println!("template: {}", record.rootfs.display());

    let agent = data.join("fake-agent.py");
    std::fs::write(&agent, FAKE_AGENT)?;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))?;
    // `airlock-netd` is built next to this example's directory (`cargo build --release`).
    let netd = std::env::current_exe()?
        .parent()
        .and_then(Path::parent)
        .context("locating the build directory")?
        .join("airlock-netd");
    let driver = GvisorDriver::new(GvisorConfig::new(data.join("gvisor"), &agent, netd), &[])?;
    driver.sweep_orphans(&[]).await?;

    let mut sandboxes: Vec<(LaunchSpec, Placement)> = Vec::new();
    for _ in 0..2 {
        let spec = LaunchSpec {
            id: SandboxId::generate(),
            rootfs: record.rootfs.clone(),
            resources: Resources {
                cpu_count: 1,
                memory_mb: 512,
                disk_mb: 1024,
            },
            egress: Egress::default(),
            writes: RootfsWrites::Private,
            volumes: Vec::new(),
        };
        let t = Instant::now();
        let placement = driver.launch(&spec).await?;
        let launched = t.elapsed();
        let addr = placement.agent;
        wait_http(addr, "/", Duration::from_secs(20)).await?;
        println!(
            "sandbox {} at {addr}: launch() {launched:?}, first HTTP answer {:?} after launch() began",
            spec.id,
            t.elapsed(),
        );
        sandboxes.push((spec, placement));
    }

    for (spec, placement) in &sandboxes {
        let info = http_get(placement.agent, "/info")?;
        println!("--- {} sees:\n{info}", spec.id);
        let info: serde_json::Value = serde_json::from_str(&info)?;
        ensure!(
            info["owner"] == spec.id.as_str(),
            "owner file is not its own"
        );
        ensure!(info["hostname"] == spec.id.as_str(), "hostname");
    }
    ensure!(
        !record.rootfs.join("root/owner").exists(),
        "a sandbox wrote into the template"
    );

    // Not asserted: keeping sandboxes apart on the network is the egress layer's job.
    let (a, b) = (sandboxes[0].1.agent, sandboxes[1].1.agent);
    println!(
        "{a} -> {b}:49983: {}",
        http_get(a, &format!("/probe/{b}/49983"))?
    );

    // Orphan sweep must keep what it is told to keep.
    let keep: Vec<_> = sandboxes
        .iter()
        .map(|(s, p)| (s.id.clone(), p.slot))
        .collect();
    driver.sweep_orphans(&keep).await?;
    for (spec, placement) in &sandboxes {
        ensure!(
            driver.adopt(&spec.id, placement.slot).await.is_some(),
            "sweep removed a kept sandbox"
        );
    }

    // A launch that fails (an empty rootfs has nothing to run) reports runsc's words and
    // leaves nothing behind.
    let empty = tempfile_dir(&data)?;
    let bad = LaunchSpec {
        id: SandboxId::generate(),
        rootfs: empty.clone(),
        resources: Resources {
            cpu_count: 1,
            memory_mb: 256,
            disk_mb: 1024,
        },
        egress: Egress::default(),
        writes: RootfsWrites::Private,
        volumes: Vec::new(),
    };
    let t = Instant::now();
    match driver.launch(&bad).await {
        Ok(_) => bail!("launch from an empty rootfs succeeded"),
        Err(e) => println!("failed launch ({:?}), as expected: {e}", t.elapsed()),
    }
    // runsc creates missing mount points in the rootfs (hence the template's placeholders).
    std::fs::remove_dir_all(&empty)?;

    for (spec, placement) in &sandboxes {
        let t = Instant::now();
        driver.destroy(&spec.id, placement.slot).await?;
        println!("destroy {}: {:?}", spec.id, t.elapsed());
        ensure!(
            driver.adopt(&spec.id, placement.slot).await.is_none(),
            "still running after destroy"
        );
        let t = Instant::now();
        driver.destroy(&spec.id, placement.slot).await?;
        println!("destroy again (idempotent): {:?}", t.elapsed());
    }
    // The same spec starts again at once, in another slot.
    let again = LaunchSpec {
        id: SandboxId::generate(),
        ..sandboxes[0].0.clone()
    };
    let placement = driver.launch(&again).await?;
    wait_http(placement.agent, "/", Duration::from_secs(20)).await?;
    driver.destroy(&again.id, placement.slot).await?;
    println!(
        "relaunch in slot {} right after destroy: ok",
        placement.slot
    );

    check_nothing_left(&data.join("gvisor"))?;
    println!("nothing left behind");
    Ok(())
}

/// Polls until the server answers.
async fn wait_http(addr: Ipv4Addr, path: &str, limit: Duration) -> anyhow::Result<()> {
    let t = Instant::now();
    while http_get(addr, path).is_err() {
        if t.elapsed() > limit {
            bail!("{addr} did not answer within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

fn http_get(addr: Ipv4Addr, path: &str) -> anyhow::Result<String> {
    let sock = SocketAddr::from((addr, 49983));
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").context("no HTTP header end")?;
    ensure!(head.starts_with("HTTP/1.0 200"), "bad answer: {head}");
    Ok(body.to_owned())
}

fn tempfile_dir(data: &Path) -> anyhow::Result<PathBuf> {
    let dir = data.join("empty-rootfs");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn check_nothing_left(state_dir: &Path) -> anyhow::Result<()> {
    let sh = |cmd: &str| -> anyhow::Result<String> {
        let out = std::process::Command::new("sh")
            .args(["-c", cmd])
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let checks = [
        ("netns", "ls /run/netns | grep '^al-' || true".to_owned()),
        ("veth", "ls /sys/class/net | grep '^alv' || true".to_owned()),
        ("runsc processes", "pgrep -a runsc || true".to_owned()),
        (
            "mounts",
            "findmnt -rn -o TARGET | grep -E 'bundles|netns/al-' || true".to_owned(),
        ),
        ("bundles", format!("ls {}/bundles", state_dir.display())),
        (
            "cgroups",
            "ls -d /sys/fs/cgroup/*/airlock/*/ 2>/dev/null || true".to_owned(),
        ),
        (
            "zombies",
            "ps -eo stat,comm | awk '$1 ~ /^Z/' || true".to_owned(),
        ),
    ];
    let mut left = Vec::new();
    for (what, cmd) in checks {
        let out = sh(&cmd)?;
        if !out.is_empty() {
            left.push(format!("{what}: {out}"));
        }
    }
    ensure!(left.is_empty(), "left behind:\n{}", left.join("\n"));
    Ok(())
}
