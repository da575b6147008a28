//! Builds one template (or finds it cached) without the server: needs root, debootstrap, and npm
//! for templates with npm binaries.
//!
//! `cargo run -p airlock-core --example build_template -- NAME [DATA_DIR]` (default
//! `/var/tmp/airlock-ci-dev`): the rootfs goes under `DATA_DIR/templates`, the record into
//! `DATA_DIR/airlock.db`. Prints the hash, the rootfs path, the size and the time taken.

use airlock_core::ids::TemplateName;
use airlock_core::store::Store;
use airlock_core::template;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(name) = args.next() else {
        eprintln!(
            "usage: build_template NAME [DATA_DIR]; known: {}",
            template::KNOWN_TEMPLATES.join(", ")
        );
        return ExitCode::from(2);
    };
    let data = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "/var/tmp/airlock-ci-dev".into()),
    );
    let name = match TemplateName::parse(&name) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(recipe) = template::recipe(&name) else {
        eprintln!(
            "no recipe for {name}; known: {}",
            template::KNOWN_TEMPLATES.join(", ")
        );
        return ExitCode::from(2);
    };
    let templates = data.join("templates");
    if let Err(e) = std::fs::create_dir_all(&templates) {
        eprintln!("creating {}: {e}", templates.display());
        return ExitCode::FAILURE;
    }
    let store = match Store::open(&data.join("airlock.db")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("opening the store: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{name}: hash {}", template::content_hash(&recipe));
    let started = Instant::now();
    let mut progress = |line: &str| println!("  {line}");
    match template::build(&recipe, &templates, &store, &mut progress).await {
        Ok(r) => {
            println!(
                "{name}: {} ({:.0} MiB) in {:.1}s",
                r.rootfs.display(),
                r.size_bytes as f64 / (1024.0 * 1024.0),
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("{name}: {msg}");
            ExitCode::FAILURE
        }
    }
}
