//! The roles' command-line arguments and how each one starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tidemark_core::Filer;
use tidemark_filer::{DataDir, HttpFiler, LocalFiler, http};

use crate::shell;

#[derive(Args)]
pub struct FilerArgs {
    /// Directory for the store (meta.db) and file content (blobs/). Created if missing.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Address to listen on. A non-loopback address requires --token.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8888")]
    addr: SocketAddr,
    #[command(flatten)]
    common: StoreArgs,
}

#[derive(Args)]
pub struct ServerArgs {
    /// Directory for the store (meta.db) and file content (blobs/). Created if missing.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Address the filer's API listens on. A non-loopback address requires --token.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8888")]
    filer_addr: SocketAddr,
    #[command(flatten)]
    common: StoreArgs,
}

#[derive(Args)]
pub struct StoreArgs {
    /// The metadata store: `sqlite` (default: DIR/meta.db) or `sqlite:///path/to/file.db`.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Require `Authorization: Bearer TOKEN` on every request.
    #[arg(long, env = "TIDEMARK_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Args)]
pub struct ShellArgs {
    /// The filer to talk to.
    #[arg(long, env = "TIDEMARK_FILER", value_name = "HOST:PORT", default_value = "127.0.0.1:8888")]
    filer: String,
    /// The filer's token, if it has one.
    #[arg(long, env = "TIDEMARK_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Run these commands (separated by `;`) and exit; non-zero exit status on the first failure.
    #[arg(short = 'c', value_name = "COMMANDS")]
    command: Option<String>,
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn open_filer(data_dir: &PathBuf, store: Option<&str>) -> Result<LocalFiler, String> {
    let dir = DataDir::open(data_dir).map_err(|e| e.to_string())?;
    match store {
        None | Some("sqlite") => LocalFiler::open(dir).map_err(|e| e.to_string()),
        Some(url) if url.starts_with("sqlite://") => {
            let file = PathBuf::from(&url["sqlite://".len()..]);
            LocalFiler::open_sqlite(dir, &file).map_err(|e| e.to_string())
        }
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => Err(
            "the PostgreSQL store is not available in this version yet; omit --store to use the embedded SQLite store"
                .into(),
        ),
        Some(other) => Err(format!("unknown --store {other:?}: use `sqlite` or `sqlite:///path/to/file.db`")),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
}

async fn serve_filer(data_dir: PathBuf, addr: SocketAddr, args: StoreArgs) -> i32 {
    serve(data_dir, addr, args, false).await
}

/// The filer, and with `slices` the embedded slice runner beside it (`tidemark server`).
async fn serve(data_dir: PathBuf, addr: SocketAddr, args: StoreArgs, slices: bool) -> i32 {
    init_logging();
    if let Err(e) = http::check_bind(addr, args.token.as_deref()) {
        eprintln!("error: {e}");
        return 2;
    }
    let filer = match open_filer(&data_dir, args.store.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e} (is another filer running? choose another address)");
            return 1;
        }
    };
    let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
    // Scripts and tests read this line to find the port (with --addr 127.0.0.1:0).
    println!("tidemark filer listening on http://{bound} (data dir {})", data_dir.display());
    tracing::info!(addr = %bound, store = filer.store().backend(), "filer started");
    let filer = Arc::new(filer);
    // One shutdown for every part: the HTTP API and the outbound sync.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let outbound = filer.data_dir().map(|dd| {
        let sync = tidemark_filer::outbound::OutboundSync::new(filer.clone(), dd);
        tokio::spawn(sync.run(stopped(stop_rx.clone())))
    });
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let runner = slices.then(|| {
        let holder = format!("server-{}", std::process::id());
        tokio::spawn(crate::embedded::run(filer.clone(), holder, stop_rx.clone()))
    });
    let api: Arc<dyn Filer> = filer.clone();
    let served = http::serve(listener, api, args.token, stopped(stop_rx)).await;
    if let Some(task) = outbound {
        let _ = task.await;
    }
    if let Some(task) = runner {
        let _ = task.await;
    }
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: the filer stopped: {e}");
            1
        }
    }
}

pub async fn run_filer(a: FilerArgs) -> i32 {
    serve_filer(a.data_dir, a.addr, a.common).await
}

pub async fn run_server(a: ServerArgs) -> i32 {
    // The filer, with the embedded slice runner standing in for the admin and a worker.
    serve(a.data_dir, a.filer_addr, a.common, true).await
}

pub async fn run_shell(a: ShellArgs) -> i32 {
    let filer = match HttpFiler::new(&a.filer, a.token) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    shell::main(shell::Context { filer: Arc::new(filer) }, a.command).await
}
