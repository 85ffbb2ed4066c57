//! `tidemark blobs`: the file content of a cluster — moving a data directory's blobs onto a
//! shared blob store, and collecting blobs no entry names.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum BlobsCmd {
    /// Copy the file content a data directory holds (blobs/) to a blob store and make it the
    /// cluster's: afterwards every filer starts with that --blob-store. Stop the filer of DIR
    /// first. Safe to run again if it fails part-way (what is already there is not copied again).
    Migrate(MigrateArgs),
    /// Remove blobs that no entry names and that are older than --min-age (what a crash between
    /// storing a file's bytes and committing it leaves). The collector of a running cluster does
    /// this every six hours by itself.
    Gc(GcArgs),
}

#[derive(Args)]
pub struct MigrateArgs {
    /// The data directory whose blobs/ to move (its filer must be stopped).
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// The metadata store, as the filer was started with it (default: DIR's SQLite).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Where to move them: s3://BUCKET/PREFIX?endpoint=URL&region=REGION.
    #[arg(long, env = "TIDEMARK_BLOB_STORE", value_name = "URL")]
    blob_store: String,
}

#[derive(Args)]
pub struct GcArgs {
    /// A data directory to open the store from (its filer must be stopped, or, with a shared
    /// PostgreSQL store, any directory).
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// The blob store, if the cluster keeps its content there.
    #[arg(long, env = "TIDEMARK_BLOB_STORE", value_name = "URL")]
    blob_store: Option<String>,
    /// Only blobs older than this are removed (`1h`, `30m`, `90s`): a write in progress stores
    /// its bytes before it names them, so keep it above the time a write can take (at most
    /// 10 minutes: a write held up longer gives up) and the clocks' skew.
    #[arg(long, value_name = "AGE", default_value = "1h", value_parser = parse_age)]
    min_age: Duration,
}

fn parse_age(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("{s:?}: a number with s, m, h or d (1h, 30m)"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(format!("{s:?}: a number with s, m, h or d (1h, 30m)")),
    };
    Ok(Duration::from_secs(secs))
}

pub async fn run(cmd: BlobsCmd) -> i32 {
    match cmd {
        BlobsCmd::Migrate(a) => match migrate(a).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        },
        BlobsCmd::Gc(a) => match gc(a).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        },
    }
}

async fn migrate(a: MigrateArgs) -> Result<(), String> {
    let to = crate::roles::connect_blob_store(&a.blob_store).await?;
    let filer = crate::roles::open_store(&a.data_dir, a.store.as_deref()).await?;
    let tidemark_filer::blobs::Blobs::Dir(from) = filer.blobs() else {
        return Err("the data directory's filer keeps no blobs of its own".into());
    };
    let started = std::time::Instant::now();
    let mut last = std::time::Instant::now();
    let mut progress = |r: &tidemark_filer::gc::MigrateReport| {
        if last.elapsed() >= Duration::from_secs(2) {
            eprintln!("... {} copied ({} bytes), {} already there", r.copied, r.bytes, r.already_there);
            last = std::time::Instant::now();
        }
    };
    let report = tidemark_filer::gc::migrate(filer.store().as_ref(), from, &to, filer.clock().as_ref(), &mut progress)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "moved the files of {} to {}: {} blobs copied ({} bytes), {} already there, in {:.1} s; start every filer with --blob-store {}",
        a.data_dir.display(),
        to.url().location(),
        report.copied,
        report.bytes,
        report.already_there,
        started.elapsed().as_secs_f64(),
        a.blob_store
    );
    println!("(the copies in {}/blobs are no longer read; remove them once the cluster runs)", a.data_dir.display());
    Ok(())
}

async fn gc(a: GcArgs) -> Result<(), String> {
    let mut filer = crate::roles::open_store(&a.data_dir, a.store.as_deref()).await?;
    if let Some(url) = &a.blob_store {
        filer = filer.with_blob_store(crate::roles::connect_blob_store(url).await?);
    }
    let now = filer.clock().now_ms();
    let report = tidemark_filer::gc::sweep(filer.store().as_ref(), filer.blobs(), now, a.min_age)
        .await
        .map_err(|e| e.to_string())?;
    println!("{}: {report}", filer.blobs().describe());
    Ok(())
}
