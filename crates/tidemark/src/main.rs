//! `tidemark`: one binary, several roles. See `tidemark --help`.

use clap::{Parser, Subcommand};
use tidemark::roles;

#[derive(Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Keeps a filesystem namespace mounted from a cloud bucket in sync with that bucket.",
    long_about = "Tidemark keeps a filesystem namespace mounted from a cloud bucket (a remote mount) in sync \
                  with that bucket by consuming the bucket's event notifications, with full reconciles as a backstop.\n\n\
                  Start with `tidemark server --data-dir ./data`, then talk to it with `tidemark shell`."
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
    /// Trust only the certificates in FILE (PEM: a private CA, or a self-signed server
    /// certificate) when connecting to a filer or admin over https://. Without it, the system's
    /// CAs.
    #[arg(long, global = true, env = "TIDEMARK_TLS_CA", value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Role {
    /// Run the filer: the namespace, its store, and the HTTP API (/api/v1/).
    Filer(roles::FilerArgs),
    /// Run everything in one process on the embedded store: the default way to run Tidemark.
    Server(roles::ServerArgs),
    /// Run the S3 gateway in front of a filer: the directories under /buckets as S3 buckets.
    S3(roles::S3Args),
    /// Mount the namespace (or --root DIR of it) as a directory, with FUSE: kept fresh by the
    /// filer's change log.
    Mount(roles::MountArgs),
    /// Run the admin: detection, scheduling slices onto workers, the Admin UI and /metrics.
    Admin(roles::AdminArgs),
    /// Run a worker: takes slices from the admin and runs them against the filer.
    Worker(roles::WorkerArgs),
    /// The operator's shell: `tidemark shell -c "fs.ls -l /"`, or interactive.
    Shell(roles::ShellArgs),
    /// The cluster's file content: move a data directory's onto a blob store, collect garbage.
    #[command(subcommand)]
    Blobs(tidemark::blobs_cmd::BlobsCmd),
    /// Tools for bucket event notifications.
    #[command(subcommand)]
    Events(tidemark::events_cmd::EventsCmd),
}

fn main() {
    let cli = Cli::parse();
    if let Some(ca) = &cli.tls_ca
        && let Err(e) = tidemark_http::tls::trust(ca)
    {
        eprintln!("error: --tls-ca: {e}");
        std::process::exit(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        match cli.role {
            Role::Filer(a) => roles::run_filer(a).await,
            Role::Server(a) => roles::run_server(a).await,
            Role::S3(a) => roles::run_s3(a).await,
            Role::Mount(a) => roles::run_mount(a).await,
            Role::Admin(a) => roles::run_admin(a).await,
            Role::Worker(a) => roles::run_worker(a).await,
            Role::Shell(a) => roles::run_shell(a).await,
            Role::Events(e) => tidemark::events_cmd::run(e),
            Role::Blobs(b) => tidemark::blobs_cmd::run(b).await,
        }
    });
    std::process::exit(code);
}
