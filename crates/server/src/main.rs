//! `airlock`: the Airlock server and its command-line client.

use airlock_core::store::Database;
use airlock_server::client::Client;
use airlock_server::data_dir::DataDir;
use airlock_server::{boot, cli};
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "airlock",
    version,
    about = "Self-hosted sandboxes for AI-generated code, compatible with the E2B SDKs",
    long_about = "Airlock runs untrusted code in isolated gVisor sandboxes on one Linux host and \
speaks E2B's protocol, so the stock `e2b` SDKs work against it.\n\n\
Start the server with `airlock serve`, then point an SDK at it:\n  \
export E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 E2B_API_KEY=<key>\n\n\
Exit codes: 0 success; 1 the operation failed (e.g. unknown sandbox); 2 bad usage; \
3 the server could not be reached. `sandbox exec` exits with the command's own code."
)]
struct Cli {
    /// Where Airlock keeps its state (database, templates, sandboxes).
    #[arg(
        long,
        global = true,
        env = "AIRLOCK_DATA_DIR",
        default_value = "/var/lib/airlock"
    )]
    data_dir: PathBuf,
    /// Where template root filesystems are kept [default: templates/ in the data dir]. Built
    /// templates are keyed by their recipe's hash, so several data dirs can share one.
    #[arg(long, global = true, env = "AIRLOCK_TEMPLATES_DIR")]
    templates_dir: Option<PathBuf>,
    /// The PostgreSQL that keeps the state when several machines share it, as
    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (or `host=... user=...` pairs); used by
    /// `serve`, `key` and `template ls`. Its schema is brought up to date at once. Without
    /// it, the state is the data dir's own SQLite file.
    #[arg(
        long,
        global = true,
        env = "AIRLOCK_DATABASE_URL",
        hide_env_values = true
    )]
    database: Option<String>,
    /// With --database: a PEM file of the CA that signs the PostgreSQL server's certificate.
    /// With it, the connection is TLS, verified against this CA and the system's. Without it,
    /// TLS is used when --database says `sslmode=require` (verified against the system's CAs,
    /// as libpq's `verify-full`), and plain text otherwise.
    #[arg(long, global = true, env = "AIRLOCK_DATABASE_CA", value_name = "FILE")]
    database_ca: Option<PathBuf>,
    /// The server to talk to (client commands).
    #[arg(
        long,
        global = true,
        env = "AIRLOCK_URL",
        default_value = "http://127.0.0.1:3000"
    )]
    url: String,
    /// API key for client commands; defaults to the one the server generated in the data dir.
    #[arg(long, global = true, env = "AIRLOCK_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// How the server logs to stderr: `text` for people, `json` (one object a line) for a log
    /// collector. The level comes from AIRLOCK_LOG, or else RUST_LOG (`info` by default), e.g.
    /// `AIRLOCK_LOG=airlock_core=debug,info`.
    #[arg(long, global = true, env = "AIRLOCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// The PostgreSQL that --database (and --database-ca) name, if any.
    fn postgres(&self) -> Option<Database> {
        Some(Database {
            url: self.database.clone()?,
            ca: self.database_ca.clone(),
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: the E2B-compatible REST API and the sandbox proxy, on one port.
    Serve(Box<boot::ServeArgs>),
    /// Drive sandboxes on a running server: create, ls, info, exec, shell, cp, logs, pause,
    /// resume, snapshot, kill.
    #[command(subcommand)]
    Sandbox(cli::SandboxCommand),
    /// Build and list templates (the root filesystems sandboxes start from).
    #[command(subcommand)]
    Template(cli::TemplateCommand),
    /// Create, list and revoke API keys (works on the data dir; no server needed).
    #[command(subcommand)]
    Key(cli::KeyCommand),
    /// The machines that run sandboxes (an operator's key only): ls.
    #[command(subcommand)]
    Node(cli::NodeCommand),
    /// Run code in a fresh sandbox's code interpreter and print the results. Images (charts)
    /// are saved to files whose paths are printed. Exits 1 if the code raised an error.
    Run {
        /// Template with a code interpreter.
        #[arg(long, default_value = "code-interpreter-v1")]
        template: String,
        /// Language of the code.
        #[arg(long, default_value = "python", value_parser = ["python", "js", "javascript", "ts", "typescript", "bash", "r"])]
        lang: String,
        /// Seconds the code may run.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Where images are saved.
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
        /// File with the code, or `-` to read standard input.
        source: String,
    },
    /// Set Airlock up as a systemd service: the data dir, an API key, and a unit file
    /// (airlock.service) that runs `airlock serve` at boot. Stopping or restarting the service
    /// leaves running sandboxes running; the next start adopts them. Logs go to the journal.
    Install {
        /// The address the service listens on.
        #[arg(long, default_value = "127.0.0.1:3000")]
        listen: SocketAddr,
        /// Serve the operator's /metrics on this address too (see `serve --help`).
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<SocketAddr>,
        /// Where the unit file is written.
        #[arg(long, default_value = "/etc/systemd/system")]
        unit_dir: PathBuf,
        /// Only write the files; do not enable and start the service.
        #[arg(long)]
        no_start: bool,
    },
    /// Print a completion script for your shell, e.g.
    /// `airlock completions bash > /etc/bash_completion.d/airlock`.
    Completions { shell: clap_complete::Shell },
    /// Serve MCP (the Model Context Protocol) on stdin and stdout, so that Claude Desktop, an
    /// IDE agent or any MCP client can run code in sandboxes of the server at --url, with
    /// --api-key. Tools: run_code, run_command, read_file, write_file, list_files, upload,
    /// download, create_sandbox, kill_sandbox. Calls without a sandbox id share one sandbox
    /// per session, started on first use and killed when the client disconnects. For a client
    /// elsewhere on the network, `airlock serve` answers MCP over HTTP at /mcp.
    Mcp {
        /// The template the session's sandbox starts from.
        #[arg(long, default_value = "code-interpreter-v1")]
        template: String,
        /// Seconds the session's sandbox lives after its last call.
        #[arg(long, default_value_t = airlock_server::mcp::DEFAULT_SANDBOX_TIMEOUT.as_secs())]
        sandbox_timeout: u64,
        /// The one directory whose files `local_path` (in upload and download) may name
        /// [default: the current directory; none if that is /].
        #[arg(long)]
        files_dir: Option<PathBuf>,
        /// Print the tools' names, descriptions and JSON schemas, and exit.
        #[arg(long)]
        print_tools: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.log_format == LogFormat::Json {
        // Read by the logger, and by netd, which the server starts with it. Set before any
        // thread exists.
        std::env::set_var("AIRLOCK_LOG_FORMAT", "json");
    }
    let no_level = ["AIRLOCK_LOG", "RUST_LOG"]
        .iter()
        .all(|var| std::env::var_os(var).is_none());
    if no_level && matches!(cli.command, Command::Mcp { .. }) {
        // Its client shows stderr to people (Claude Desktop keeps it as the server's log):
        // only what goes wrong.
        std::env::set_var("AIRLOCK_LOG", "warn");
    }
    airlock_netd::init_logging();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("airlock: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

/// The data dir, made and checked (see `data_dir.rs`), for commands that use it directly.
fn data_dir(root: &Path, templates: Option<&Path>) -> Result<DataDir, cli::CliError> {
    DataDir::open(root, templates).map_err(cli::CliError::Other)
}

async fn run(cli: Cli) -> ExitCode {
    let client = || Client::new(&cli.url, cli.api_key.clone(), &cli.data_dir);
    let postgres = cli.postgres();
    let result = match cli.command {
        Command::Serve(args) => args
            .serve(boot::Globals {
                data_dir: cli.data_dir.clone(),
                templates_dir: cli.templates_dir.clone(),
                database: postgres.clone(),
            })
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(cli::CliError::Other),
        Command::Sandbox(cmd) => cli::sandbox(cmd, client()).await,
        Command::Node(cmd) => cli::node(cmd, client()).await,
        Command::Install { .. } if cli.database.is_some() => Err(cli::CliError::Failed(
            "airlock install sets up one box on its own SQLite file; a server on PostgreSQL \
             (--database) is started by your own service manager (see docs/design.md)"
                .into(),
        )),
        Command::Install {
            listen,
            metrics_listen,
            unit_dir,
            no_start,
        } => boot::install::install(boot::install::InstallOptions {
            data_dir: cli.data_dir.clone(),
            templates_dir: cli.templates_dir.clone(),
            listen,
            metrics_listen,
            unit_dir,
            start: !no_start,
        })
        .await
        .map(|()| ExitCode::SUCCESS)
        .map_err(cli::CliError::Other),
        Command::Mcp {
            print_tools: true, ..
        } => Ok(airlock_server::mcp::print_tools()),
        Command::Mcp {
            template,
            sandbox_timeout,
            files_dir,
            ..
        } => {
            let timeout = std::time::Duration::from_secs(sandbox_timeout);
            let served = airlock_server::mcp::stdio(client(), template, timeout, files_dir);
            served.await.map_err(cli::CliError::from)
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "airlock",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Template(cmd) => match cmd.into_job() {
            cli::TemplateJob::Build(build) => cli::template_build(client(), build).await,
            cli::TemplateJob::List { json } => {
                match data_dir(&cli.data_dir, cli.templates_dir.as_deref()) {
                    Ok(data) => cli::template_ls(&data, postgres.as_ref(), json).await,
                    Err(e) => Err(e),
                }
            }
            cli::TemplateJob::Cancel { template, build } => {
                cli::template_cancel(client(), &template, &build)
                    .await
                    .map(|()| ExitCode::SUCCESS)
            }
        },
        Command::Key(cmd) => match data_dir(&cli.data_dir, cli.templates_dir.as_deref()) {
            Ok(data) => cli::key(cmd, &data, postgres.as_ref()).await,
            Err(e) => Err(e),
        },
        Command::Run {
            template,
            lang,
            timeout,
            out_dir,
            source,
        } => {
            let opts = cli::RunOptions {
                template,
                language: lang,
                timeout_secs: timeout,
                out_dir,
                source,
            };
            cli::run(client(), opts).await
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("airlock: {}", e.describe());
            e.exit_code()
        }
    }
}
