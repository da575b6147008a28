//! `airlock-agent`: one static binary, run four ways. Linked as `sudo` it is the sandbox's sudo
//! client; `unpack-layer` and `provision` are tools a template build runs (see `tools`);
//! otherwise it is the daemon inside every Airlock sandbox (see `daemon`).

use airlock_agent::tools::{provision, unpack_layer};
use airlock_agent::{daemon, sudo};

fn main() {
    // Templates link /usr/bin/sudo to this binary (see `sudo`).
    let invoked_as = std::env::args().next().unwrap_or_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::path::Path::new(&invoked_as).file_name() == Some("sudo".as_ref()) {
        sudo::client::main(&args);
    }
    // Tools the build runs inside a build sandbox, with this same static binary: an image may
    // have nothing else to run them with.
    let tool = match args.first().map(String::as_str) {
        Some("unpack-layer") => Some(unpack_layer::main(&args[1..])),
        Some("provision") => Some(provision::main(&args[1..])),
        _ => None,
    };
    if let Some(result) = tool {
        if let Err(e) = result {
            eprintln!("airlock-agent {}: {e}", args[0]);
            std::process::exit(1);
        }
        return;
    }
    daemon::run();
}
