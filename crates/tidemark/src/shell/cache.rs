//! `remote.cache` and `remote.uncache`: fill or empty the filer's content cache for the
//! remote-backed files below a directory, with SeaweedFS's filters.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tidemark_core::cache::{FileFilter, human_bytes, parse_size};
use tidemark_core::model::{Content, Entry};
use tidemark_core::{Filer, path};

use super::flags::Args;
use super::{CmdError, Context, Out};

pub const DEFAULT_CONCURRENT: usize = 8;

fn usage(msg: impl Into<String>) -> CmdError {
    CmdError::Usage(msg.into())
}

fn size_flag(args: &Args, name: &str) -> Result<Option<u64>, CmdError> {
    args.get(name).map(|v| parse_size(v).map_err(|e| usage(format!("-{name}: {e}")))).transpose()
}

fn filter_of(args: &Args) -> Result<FileFilter, CmdError> {
    FileFilter::new(args.get("include"), args.get("exclude"), size_flag(args, "minSize")?, size_flag(args, "maxSize")?)
        .map_err(|e| usage(e.to_string()))
}

fn dir_of(args: &Args) -> Result<String, CmdError> {
    let d = args.get("dir").ok_or_else(|| usage("-dir is required"))?;
    path::normalize_user_path(d).map_err(|e| usage(e.to_string()))
}

/// The files `-dir` names (itself, if it is a file) that pass the filter, with the count of
/// files that did not because their content is local (never cache).
async fn candidates(filer: &dyn Filer, dir: &str, filter: &FileFilter) -> Result<(Vec<Entry>, u64), CmdError> {
    let top = filer.stat(dir).await?.ok_or_else(|| CmdError::Failed(format!("{dir}: no such entry")))?;
    let mut out = Vec::new();
    let mut local = 0u64;
    let mut take = |e: Entry| {
        if e.is_dir() || !filter.matches(dir, &e.path, e.size) {
            return;
        }
        if e.content == Content::Remote {
            out.push(e);
        } else {
            local += 1;
        }
    };
    if !top.is_dir() {
        take(top);
        return Ok((out, local));
    }
    let mut after: Option<String> = None;
    loop {
        let page = filer.scan(dir, after.as_deref(), 1000).await?;
        for e in page.entries {
            take(e);
        }
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok((out, local)),
        }
    }
}

fn bytes_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta}) {pos} files {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
}

fn concurrency(args: &Args) -> Result<usize, CmdError> {
    match args.get("concurrent") {
        None => Ok(DEFAULT_CONCURRENT),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => Err(usage(format!("-concurrent={v:?}: give a number from 1 to 256"))),
        },
    }
}

pub async fn cache(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let dir = dir_of(&args)?;
    let filter = filter_of(&args)?;
    let concurrent = concurrency(&args)?;
    let filer = &*ctx.filer;
    let started = Instant::now();
    let (files, local) = candidates(filer, &dir, &filter).await?;
    // Archived objects cannot be read until restored: skipped and counted, not failures.
    let (archived_files, files): (Vec<Entry>, Vec<Entry>) =
        files.into_iter().partition(|e| tidemark_core::model::object_attrs::archived(&e.extended).is_some());
    let mut archived = archived_files.len() as u64;
    // What is cached already: only the rest counts toward the work to do.
    let paths: Vec<String> = files.iter().map(|e| e.path.clone()).collect();
    let status = filer.cache_status(&paths).await?;
    let todo: Vec<Entry> =
        files.iter().zip(&status).filter(|(e, s)| s.cached_bytes < e.size).map(|(e, _)| e.clone()).collect();
    let already = files.len() - todo.len();
    let total: u64 = todo.iter().map(|e| e.size).sum();
    let bar = bytes_bar(total);
    let mut fetched = 0u64;
    let mut done = 0u64;
    let mut failed = Vec::new();
    let fetch = |e: Entry| async move {
        let r = filer.cache_fetch(&e.path, true).await;
        (e, r)
    };
    let mut results = futures::stream::iter(todo).map(fetch).buffer_unordered(concurrent);
    while let Some((e, r)) = results.next().await {
        match r {
            Ok(o) if o.skipped.is_some() => {
                failed.push(format!("{}: not cached: {}", e.path, o.skipped.unwrap_or_default()));
            }
            Ok(o) => {
                fetched += o.bytes;
                done += 1;
                if let Some(b) = &bar {
                    b.inc(e.size);
                }
            }
            // Its storage class was not known before the read.
            Err(tidemark_core::Error::Archived { .. }) => archived += 1,
            Err(err) => failed.push(format!("{}: {err}", e.path)),
        }
        if let Some(b) = &bar {
            b.set_message(if failed.is_empty() { String::new() } else { format!("{} failed", failed.len()) });
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    for f in &failed {
        writeln!(out, "{f}")?;
    }
    writeln!(
        out,
        "remote.cache {dir}: cached {done} files ({} fetched), {already} already cached, {local} local (never cache), {archived} archived (restore them in the bucket first), {} failed, in {:.1}s",
        human_bytes(fetched),
        failed.len(),
        started.elapsed().as_secs_f64()
    )?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CmdError::Failed(format!("{} files could not be cached (listed above)", failed.len())))
    }
}

pub async fn uncache(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let dir = dir_of(&args)?;
    let filter = filter_of(&args)?;
    let filer = &*ctx.filer;
    let (files, local) = candidates(filer, &dir, &filter).await?;
    let paths: Vec<String> = files.iter().map(|e| e.path.clone()).collect();
    let status = filer.cache_status(&paths).await?;
    let mut freed = 0u64;
    let mut dropped = 0u64;
    for s in status.iter().filter(|s| s.cached_bytes > 0) {
        let o = filer.cache_drop(&s.path).await?;
        freed += o.bytes;
        dropped += 1;
    }
    writeln!(
        out,
        "remote.uncache {dir}: dropped the cached content of {dropped} files ({} freed), {local} local (never cache) left alone",
        human_bytes(freed)
    )?;
    Ok(())
}

/// The cache column of `fs.ls -l`: how much of a remote-backed file is cached here.
pub fn cache_column(e: &Entry, status: Option<&tidemark_core::cache::CacheStatus>) -> String {
    if e.is_dir() || e.content != Content::Remote {
        return "-".into();
    }
    match status {
        None => "?".into(),
        Some(s) if e.size == 0 || s.cached_bytes >= e.size => "100%".into(),
        Some(s) => format!("{}%", s.cached_bytes * 100 / e.size),
    }
}
