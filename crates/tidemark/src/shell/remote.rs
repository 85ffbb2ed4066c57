//! `remote.configure`, `remote.mount`, `remote.unmount`, `remote.meta.sync`.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use tidemark_core::model::{NewEntry, Origin, Precondition, Txn};
use tidemark_core::remote::{Mount, MountMapping, RemoteConf, RemoteLocation, StorageKind, system_paths};
use tidemark_core::{Error, Filer, path};
use tidemark_engine::docs::{read_json, write_json};
use tidemark_engine::reconcile::{Item, ReconcileOptions, ReconcileReport, forget, reconcile};

use super::flags::Args;
use super::{CmdError, Context, Out};

fn usage(msg: impl Into<String>) -> CmdError {
    CmdError::Usage(msg.into())
}

fn dir_flag(args: &Args) -> Result<String, CmdError> {
    let d = args.get("dir").ok_or_else(|| usage("-dir is required"))?;
    path::normalize_user_path(d).map_err(|e| usage(e.to_string()))
}

async fn mapping(filer: &dyn Filer) -> Result<(MountMapping, Option<u64>), CmdError> {
    Ok(match read_json::<MountMapping>(filer, system_paths::MOUNT_MAPPING).await? {
        Some((m, v)) => (m, Some(v)),
        None => (MountMapping::default(), None),
    })
}

async fn conf_of(filer: &dyn Filer, name: &str) -> Result<Option<(RemoteConf, u64)>, CmdError> {
    Ok(read_json::<RemoteConf>(filer, &system_paths::remote_conf(name)).await?)
}

fn print_conf(out: Out<'_>, c: &RemoteConf) -> std::io::Result<()> {
    let m = c.masked();
    let settings: Vec<String> = m.settings.iter().map(|(k, v)| format!("{}.{k}={v}", c.kind.as_str())).collect();
    writeln!(out, "{}\t{}\t{}", m.name, m.kind.as_str(), settings.join(" "))
}

pub async fn configure(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let filer = &*ctx.filer;
    let Some(name) = args.get("name") else {
        if args.has_flags() {
            return Err(usage("-name is required to add, change or delete a remote"));
        }
        // List every remote.
        let mut after = None;
        loop {
            let page = match filer.list(system_paths::REMOTE_DIR, after.as_deref(), 1000).await {
                Ok(p) => p,
                Err(Error::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            for e in &page.entries {
                if let Some(n) = e.name().strip_suffix(".conf")
                    && let Some((c, _)) = conf_of(filer, n).await?
                {
                    print_conf(out, &c)?;
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => return Ok(()),
            }
        }
    };
    RemoteConf::validate_name(name).map_err(|e| usage(e.to_string()))?;
    let path = system_paths::remote_conf(name);
    let existing = conf_of(filer, name).await?;
    if args.is_set("delete") {
        let Some((_, version)) = existing else {
            return Err(CmdError::Failed(format!("no remote {name:?} to delete")));
        };
        let (mapping, _) = mapping(filer).await?;
        if let Some(m) = mapping.mounts.iter().find(|m| m.location.storage == name) {
            return Err(CmdError::Failed(format!(
                "remote {name:?} is mounted on {}; run remote.unmount -dir={} first",
                m.dir, m.dir
            )));
        }
        filer
            .delete(
                &path,
                tidemark_core::DeleteOptions {
                    recursive: false,
                    precondition: Precondition::Version(version),
                    ..Default::default()
                },
            )
            .await?;
        writeln!(out, "deleted remote {name}")?;
        return Ok(());
    }
    let kind = match (args.get("type"), &existing) {
        (Some(t), _) => {
            StorageKind::parse(t).ok_or_else(|| usage(format!("unknown -type={t:?}: use s3, gcs, azure or local")))?
        }
        (None, Some((c, _))) => c.kind,
        (None, None) => return Err(usage(format!("-type is required for the new remote {name:?}"))),
    };
    // Settings of another type than the remote's are a mistake worth stopping at.
    for other in
        [StorageKind::S3, StorageKind::Gcs, StorageKind::Azure, StorageKind::Local].into_iter().filter(|k| *k != kind)
    {
        if let Some((setting, _)) = args.with_prefix(&format!("{}.", other.as_str())).next() {
            return Err(usage(format!(
                "-{}.{setting} does not apply to a remote of type {}",
                other.as_str(),
                kind.as_str()
            )));
        }
    }
    let mut settings: BTreeMap<String, String> = match &existing {
        Some((c, _)) if c.kind == kind => c.settings.clone(),
        _ => BTreeMap::new(),
    };
    for (k, v) in args.with_prefix(&format!("{}.", kind.as_str())) {
        settings.insert(k.to_string(), v.to_string());
    }
    if kind == StorageKind::Local && !settings.contains_key("root") {
        return Err(usage("a local remote needs -local.root=DIR (the directory that holds the buckets)"));
    }
    if kind == StorageKind::Azure && !settings.contains_key("account") {
        return Err(usage(
            "an azure remote needs -azure.account=NAME, and a way to sign in: -azure.account_key=KEY, -azure.sas_token \
             or a Microsoft Entra ID identity (see -azure.identity in remote.configure -h)",
        ));
    }
    let conf = RemoteConf { name: name.to_string(), kind, settings };
    if kind == StorageKind::Azure {
        tidemark_cloud::azure::identity::check(&conf).map_err(|e| usage(e.to_string()))?;
    }
    write_json(filer, &path, &conf, existing.map(|(_, v)| v)).await.map_err(|e| match e {
        Error::PreconditionFailed { .. } => {
            CmdError::Failed(format!("remote {name:?} was changed concurrently; run the command again"))
        }
        e => e.into(),
    })?;
    write!(out, "saved ")?;
    print_conf(out, &conf)?;
    Ok(())
}

fn print_mounts(out: Out<'_>, m: &MountMapping) -> std::io::Result<()> {
    for mount in &m.mounts {
        writeln!(out, "{}\t{}{}", mount.dir, mount.location, if mount.sync { "\tsync" } else { "" })?;
    }
    Ok(())
}

/// A progress bar on a terminal. `expected` estimates the paths the run will visit (the entries
/// the mount holds now); with none known it is a spinner with a rate.
fn progress(quiet: bool, expected: u64) -> Option<indicatif::ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let (bar, template) = if expected > 0 {
        (indicatif::ProgressBar::new(expected), "{bar:30} {pos}/{len} paths ({per_sec}, ETA {eta}) {msg}")
    } else {
        (indicatif::ProgressBar::new_spinner(), "{spinner} {pos} paths ({per_sec}) {elapsed} {msg}")
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
}

/// Runs a reconcile, printing each line (changes and notable skips; everything with `all`).
async fn run_sync(
    ctx: &Context,
    mount: &Mount,
    opts: &ReconcileOptions,
    all: bool,
    quiet: bool,
    out: Out<'_>,
) -> Result<ReconcileReport, CmdError> {
    // Every request to the bucket counted, for the summary.
    let requests = tidemark_core::requests::Requests::default();
    let storage = tidemark_core::requests::Counted::new(open(ctx, &mount.location).await?, requests.clone());
    let expected = if quiet { 0 } else { ctx.filer.count(&mount.dir, None).await.unwrap_or(0) };
    let bar = progress(quiet, expected);
    let mut lines: Vec<String> = Vec::new();
    let mut sink = |item: &Item| {
        if let Some(b) = &bar {
            b.inc(1);
            if b.length().is_some_and(|len| b.position() > len) {
                b.set_length(b.position());
            }
        }
        let line = match item {
            Item::Path { path, outcome } if all || outcome.is_change() || outcome.label() != "skip: in sync" => {
                format!("{} ({})", tidemark_core::path::printable(path), outcome.label())
            }
            Item::RejectedKey { key, reason } => format!("key {key:?} (skip: refused, {reason})"),
            Item::Path { .. } => return,
        };
        if !quiet {
            match &bar {
                Some(b) => b.println(&line),
                None => lines.push(line),
            }
        }
    };
    let result = reconcile(&*ctx.filer, &storage, mount, opts, &mut sink).await;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    for l in lines {
        writeln!(out, "{l}")?;
    }
    let mut report = result?;
    report.requests = requests.snapshot();
    Ok(report)
}

async fn open(
    ctx: &Context,
    loc: &RemoteLocation,
) -> Result<std::sync::Arc<dyn tidemark_core::RemoteStorage>, CmdError> {
    let (conf, _) = ctx.remote_conf(&loc.storage).await?.ok_or_else(|| {
        CmdError::Failed(format!(
            "no remote {:?}; add it with remote.configure -name={} -type=...",
            loc.storage, loc.storage
        ))
    })?;
    // The shell reads a local directory with its own user's rights: nothing to guard.
    Ok(tidemark_cloud::open_storage(&conf, &loc.bucket, &tidemark_cloud::local::LocalRoots::any()).await?)
}

pub async fn mount(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let filer = &*ctx.filer;
    let (mapping, mapping_version) = mapping(filer).await?;
    if !args.has_flags() {
        print_mounts(out, &mapping)?;
        return Ok(());
    }
    let dir = dir_flag(&args)?;
    let location =
        RemoteLocation::parse(args.get("remote").ok_or_else(|| usage("-remote=NAME/BUCKET[/PATH] is required"))?)
            .map_err(|e| usage(e.to_string()))?;
    if system_paths::reaches_system(&dir) {
        return Err(usage(format!("cannot mount on {dir}: choose a directory such as /mnt/data")));
    }
    if let Some(m) = mapping.mounts.iter().find(|m| path::is_within(&dir, &m.dir) || path::is_within(&m.dir, &dir)) {
        return Err(CmdError::Failed(if m.dir == dir {
            format!("{dir} is already mounted from {}; run remote.unmount -dir={dir} first", m.location)
        } else {
            format!("{dir} overlaps the mount {} ({}); mounts cannot nest", m.dir, m.location)
        }));
    }
    // Reach the bucket before touching anything: wrong credentials, a wrong endpoint or a
    // missing bucket fail here, with nothing changed.
    let storage = open(ctx, &location).await?;
    storage.list(&location.key_prefix(), None, None, 1).await?;

    let existed = match filer.stat(&dir).await? {
        Some(e) if !e.is_dir() => return Err(CmdError::Failed(format!("{dir} is a file"))),
        Some(_) => {
            if !args.is_set("nonempty") && !filer.list(&dir, None, 1).await?.entries.is_empty() {
                return Err(CmdError::Failed(format!(
                    "{dir} is not empty; pass -nonempty to mount over its entries (they stay, as local-only entries)"
                )));
            }
            true
        }
        None => {
            filer
                .apply(Txn::put(&dir, NewEntry::dir(0), Origin::System).with_precondition(Precondition::Absent))
                .await?;
            false
        }
    };
    let mount = Mount { dir: dir.clone(), location: location.clone(), sync: false };
    let report = match run_sync(ctx, &mount, &ReconcileOptions::default(), false, true, out).await {
        Ok(r) => r,
        Err(e) => {
            // Nothing half-mounted: take back what the pull wrote.
            let undo = forget(filer, &dir).await;
            if existed && let Ok(r) = &undo {
                tracing::info!(removed = r.removed, "undid a partial first pull");
            }
            return Err(e);
        }
    };
    let mut new_mapping = mapping;
    new_mapping.mounts.push(mount);
    new_mapping.mounts.sort_by(|a, b| a.dir.cmp(&b.dir));
    if let Err(e) = write_json(filer, system_paths::MOUNT_MAPPING, &new_mapping, mapping_version).await {
        let _ = forget(filer, &dir).await;
        return Err(match e {
            Error::PreconditionFailed { .. } => CmdError::Failed(
                "the mount mapping changed concurrently; nothing was mounted; run the command again".into(),
            ),
            e => e.into(),
        });
    }
    writeln!(out, "mounted {location} on {dir}: {}", report.summary())?;
    Ok(())
}

pub async fn unmount(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let filer = &*ctx.filer;
    let (mut mapping, version) = mapping(filer).await?;
    if !args.has_flags() {
        print_mounts(out, &mapping)?;
        return Ok(());
    }
    let dir = dir_flag(&args)?;
    let Some(pos) = mapping.mounts.iter().position(|m| m.dir == dir) else {
        return Err(CmdError::Failed(format!("{dir} is not a mount; remote.mount lists them")));
    };
    let m = mapping.mounts.remove(pos);
    // The mapping goes first: from then on nothing syncs into the directory.
    write_json(filer, system_paths::MOUNT_MAPPING, &mapping, version).await.map_err(|e| match e {
        Error::PreconditionFailed { .. } => {
            CmdError::Failed("the mount mapping changed concurrently; run the command again".into())
        }
        e => e.into(),
    })?;
    let r = forget(filer, &dir).await?;
    writeln!(out, "unmounted {} from {dir}: removed {} entries (no object was deleted)", m.location, r.removed)?;
    if r.kept > 0 {
        writeln!(out, "kept {} entries that hold local data, e.g.:", r.kept)?;
        for p in &r.kept_examples {
            writeln!(out, "  {}", tidemark_core::path::printable(p))?;
        }
    }
    Ok(())
}

pub async fn meta_sync(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let dir = dir_flag(&args)?;
    let (mapping, _) = mapping(&*ctx.filer).await?;
    let mount = match mapping.find_dir(&dir) {
        Some(m) => m.clone(),
        None => {
            return Err(CmdError::Failed(match mapping.find_for(&dir) {
                Some(m) => {
                    format!("{dir} is inside the mount {}; sync the mount: remote.meta.sync -dir={}", m.dir, m.dir)
                }
                None => format!("{dir} is not a mount; remote.mount lists them"),
            }));
        }
    };
    let dry_run = args.is_set("dryRun");
    let quiet = args.is_set("quiet");
    let ranges = match args.get("listRanges") {
        None => tidemark_engine::listing::DEFAULT_RANGES,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => n,
            _ => return Err(CmdError::Usage(format!("-listRanges={v:?}: give a number from 1 to 256"))),
        },
    };
    let opts = ReconcileOptions { delete: args.bool_or("delete", true), dry_run, ranges, ..Default::default() };
    let report = run_sync(ctx, &mount, &opts, dry_run, quiet, out).await?;
    writeln!(out, "{}{}", if dry_run { "dry run, nothing written: " } else { "" }, report.summary())?;
    Ok(())
}

pub async fn sync_enable(ctx: &Context, args: Args, out: Out<'_>, enable: bool) -> Result<(), CmdError> {
    let dir = dir_flag(&args)?;
    let (mut mapping, version) = mapping(&*ctx.filer).await?;
    let Some(m) = mapping.mounts.iter_mut().find(|m| m.dir == dir) else {
        return Err(CmdError::Failed(format!("{dir} is not a mount; remote.mount lists them")));
    };
    if m.sync == enable {
        writeln!(out, "outbound sync of {dir} is already {}", if enable { "enabled" } else { "disabled" })?;
        return Ok(());
    }
    m.sync = enable;
    write_json(&*ctx.filer, system_paths::MOUNT_MAPPING, &mapping, version).await.map_err(|e| match e {
        Error::PreconditionFailed { .. } => {
            CmdError::Failed("the mount mapping changed concurrently; run the command again".into())
        }
        e => e.into(),
    })?;
    writeln!(out, "outbound sync of {dir} {}", if enable { "enabled: local writes are uploaded" } else { "disabled" })?;
    Ok(())
}
