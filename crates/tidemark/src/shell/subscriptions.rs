//! `remote.events.enable`, `remote.events.list`, `remote.events.disable`: the subscription
//! documents of the reference's "subscription document" section.

use tidemark_core::remote::{MountMapping, RemoteConf, StorageKind, system_paths};
use tidemark_core::subscription::{
    EventTypes, Identity, ManagedResources, SUBSCRIPTIONS_DIR, SubscriptionDoc, SubscriptionOptions, Topology, doc_path,
};
use tidemark_core::{DeleteOptions, Error, Precondition, format_rfc3339_ms, path};
use tidemark_engine::docs::{read_json, write_json};
use tidemark_engine::slice::{StatusBlob, status_path};

use super::flags::Args;
use super::{CmdError, Context, Out};

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The remote's event-notification capability, or the refusal that says what to do instead.
async fn capability(
    conf: &RemoteConf,
    bucket: &str,
    dir: &str,
    topic: Option<&str>,
) -> Result<Box<dyn tidemark_core::subscription::EventNotifications>, CmdError> {
    tidemark_cloud::event_notifications(conf, bucket, topic).await?.ok_or_else(|| {
        CmdError::Failed(format!(
            "remote {:?} cannot provision event notifications: keep {dir} in sync with remote.meta.sync, or pass -queue= \
             if its notifications reach a queue",
            conf.name
        ))
    })
}

/// What Tidemark provisions for `conf`'s provider, given `-via` and `-topic`: S3's queue, SNS
/// fan-out or EventBridge rule; on Cloud Storage a topic of its own (`sqs_direct`) or a shared
/// existing one (`sns_fanout`); on Azure an Event Grid subscription into a queue.
fn provisioned_topology(conf: &RemoteConf, via: Option<&str>, topic: Option<&str>) -> Result<Topology, CmdError> {
    match (conf.kind, via, topic) {
        (StorageKind::Gcs, Some(_), _) => Err(CmdError::Usage(
            "-via is S3's: Cloud Storage events come through Pub/Sub; omit it for a topic of this subscription's own, \
             or give -topic= for an existing one"
                .into(),
        )),
        (StorageKind::Gcs, None, Some(_)) => Ok(Topology::SnsFanout),
        (StorageKind::Gcs, None, None) => Ok(Topology::SqsDirect),
        (_, _, Some(_)) => Err(CmdError::Usage(
            "-topic names an existing Pub/Sub topic, for Cloud Storage mounts; on S3 use -via=sns".into(),
        )),
        (StorageKind::Azure, Some(_), _) => Err(CmdError::Usage(
            "-via is S3's: Azure blob events come through Event Grid to a storage queue Tidemark provisions; omit it"
                .into(),
        )),
        (StorageKind::Azure, None, None) => Ok(Topology::SqsDirect),
        (StorageKind::S3, None, None) => Ok(Topology::SqsDirect),
        (StorageKind::S3, Some("sns"), None) => Ok(Topology::SnsFanout),
        (StorageKind::S3, Some("eventbridge"), None) => Ok(Topology::EventBridge),
        (StorageKind::S3, Some(v), None) => Err(CmdError::Usage(format!(
            "unknown -via={v:?}: use -via=sns or -via=eventbridge, or omit it for a direct SQS queue"
        ))),
        (StorageKind::Local, _, None) => Err(CmdError::Failed(format!(
            "remote {:?} is a local directory: its events are its filesystem notifications; omit -via",
            conf.name
        ))),
    }
}

/// `90`, `90s`, `5m`, `2h`, `1d` as seconds.
fn parse_secs(flag: &str, v: &str) -> Result<u64, CmdError> {
    let (num, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, "s"),
    };
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(CmdError::Usage(format!("-{flag}={v:?}: give seconds, or a number with s, m, h or d"))),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| CmdError::Usage(format!("-{flag}={v:?}: give seconds, or a number with s, m, h or d")))?;
    n.checked_mul(mult).filter(|s| *s > 0).ok_or_else(|| CmdError::Usage(format!("-{flag}={v:?} is out of range")))
}

/// The subscription's options: `base` with what the flags change.
fn options_from(args: &Args, base: &SubscriptionOptions) -> Result<SubscriptionOptions, CmdError> {
    let mut o = base.clone();
    if let Some(v) = args.get("slice") {
        o.slice_secs = parse_secs("slice", v)?;
    }
    if let Some(v) = args.get("reconcileInterval") {
        o.reconcile_interval_secs = parse_secs("reconcileInterval", v)?;
    }
    if let Some(v) = args.get("gapThreshold") {
        o.gap_threshold_secs = parse_secs("gapThreshold", v)?;
    }
    if let Some(v) = args.get("visibility") {
        o.visibility_timeout_secs = parse_secs("visibility", v)?;
    }
    if let Some(v) = args.get("concurrency") {
        o.apply_concurrency = v.parse().map_err(|_| {
            CmdError::Usage(format!(
                "-concurrency={v:?}: give 1 to {}",
                tidemark_core::subscription::MAX_APPLY_CONCURRENCY
            ))
        })?;
    }
    if let Some(v) = args.get("prefetch") {
        // `-prefetch=` (empty) turns it off again.
        o.prefetch = Some(v.to_string()).filter(|v| !v.is_empty());
    }
    if let Some(v) = args.get("prefetchMaxSize") {
        o.prefetch_max_size =
            Some(tidemark_core::cache::parse_size(v).map_err(|e| CmdError::Usage(format!("-prefetchMaxSize: {e}")))?);
    }
    // The bounds a slice checks again when it reads the document.
    o.validate().map_err(CmdError::Usage)?;
    Ok(o)
}

/// The same identity enabled again: only options can change.
async fn update_options(
    ctx: &Context,
    args: &Args,
    doc_file: &str,
    old: &SubscriptionDoc,
    version: u64,
    out: Out<'_>,
) -> Result<(), CmdError> {
    if let Some(v) = args.get("maxReceives")
        && old.managed.max_receives.unwrap_or(0) != max_receives_of(Some(v))?
    {
        return Err(CmdError::Failed(format!(
            "{}: -maxReceives is set on the queue Tidemark provisioned ({}); to change it run remote.events.disable -dir={} -teardown, then enable again",
            old.dir,
            old.managed.max_receives.map_or("no dead-letter queue".to_string(), |n| n.to_string()),
            old.dir
        )));
    }
    let options = options_from(args, &old.options)?;
    if options == old.options {
        writeln!(out, "events already enabled on {} (fingerprint {}); nothing changed", old.dir, old.fingerprint)?;
        return Ok(());
    }
    let doc = SubscriptionDoc { options, updated_at_ms: now_ms(), ..old.clone() };
    write_json(&*ctx.filer, doc_file, &doc, Some(version)).await?;
    writeln!(
        out,
        "events on {}: options updated (fingerprint {} unchanged; the next slice uses them)",
        old.dir, old.fingerprint
    )?;
    Ok(())
}

/// `-maxReceives`: 1 to SQS's 1000, or 0 for no dead-letter queue.
fn max_receives_of(v: Option<&str>) -> Result<u32, CmdError> {
    use tidemark_core::subscription::{DEFAULT_MAX_RECEIVES, MAX_MAX_RECEIVES};
    let Some(v) = v else { return Ok(DEFAULT_MAX_RECEIVES) };
    v.parse::<u32>().ok().filter(|n| *n <= MAX_MAX_RECEIVES).ok_or_else(|| {
        CmdError::Usage(format!("-maxReceives={v:?}: give 1 to {MAX_MAX_RECEIVES}, or 0 for no dead-letter queue"))
    })
}

fn dir_of(args: &Args) -> Result<String, CmdError> {
    let d = args.get("dir").ok_or_else(|| CmdError::Usage("-dir is required".into()))?;
    path::normalize_user_path(d).map_err(|e| CmdError::Usage(e.to_string()))
}

/// `sqs_direct`: provision, then record the subscription with what was provisioned. A failure
/// part-way takes back what was created.
#[allow(clippy::too_many_arguments)]
async fn provision_direct(
    ctx: &Context,
    dir: &str,
    conf: &RemoteConf,
    bucket: &str,
    prefix: String,
    event_types: EventTypes,
    topology: Topology,
    args: &Args,
    out: Out<'_>,
) -> Result<(), CmdError> {
    let filer = &*ctx.filer;
    // Bad flags are refused before anything is provisioned (nothing to take back).
    let options = options_from(args, &SubscriptionOptions::default())?;
    let max_receives = max_receives_of(args.get("maxReceives"))?;
    let doc_file = doc_path(dir);
    let existing = read_json::<SubscriptionDoc>(filer, &doc_file).await?;
    if let Some((old, version)) = &existing {
        let same = old.identity.topology == topology
            && old.identity.bucket == bucket
            && old.identity.prefix == prefix
            && old.identity.event_types == event_types;
        if same {
            return update_options(ctx, args, &doc_file, old, *version, out).await;
        }
        if !old.managed.is_empty() {
            return Err(CmdError::Failed(format!(
                "{dir} has a subscription with resources Tidemark provisioned ({}); a changed queue, topology, bucket, prefix or event \
                 types is a new subscription: run remote.events.disable -dir={dir} -teardown first",
                old.identity.topology.as_str()
            )));
        }
    }
    let make = |queue: &str| Identity {
        queue: queue.to_string(),
        topology,
        bucket: bucket.to_string(),
        prefix: prefix.clone(),
        event_types: event_types.clone(),
    };
    let now = now_ms();
    let queue_name = format!("tidemark-{}", &make(&format!("{dir}@{now}")).fingerprint()[..12]);
    let notifications = capability(conf, bucket, dir, args.get("topic")).await?;
    let mut managed = ManagedResources::default();
    let fingerprint_of = |url: &str| make(url).fingerprint();
    let provisioned: Result<String, Error> = notifications
        .provision(topology, &queue_name, &prefix, &event_types, max_receives, &fingerprint_of, &mut managed)
        .await;
    let url = match provisioned {
        Ok(url) => url,
        Err(e) => {
            if let Err(undo) = notifications.teardown(&mut managed).await.map(drop) {
                return Err(CmdError::Failed(format!(
                    "{e}; and taking back what was created failed too ({undo}); still there: {managed:?}"
                )));
            }
            return Err(e.into());
        }
    };
    let identity = make(&url);
    let doc = SubscriptionDoc {
        dir: dir.to_string(),
        fingerprint: identity.fingerprint(),
        identity,
        options,
        managed,
        created_at_ms: now,
        updated_at_ms: now,
    };
    if let Err(e) = write_json(filer, &doc_file, &doc, existing.map(|(_, v)| v)).await {
        let mut managed = doc.managed.clone();
        let _ = notifications.teardown(&mut managed).await;
        return Err(e.into());
    }
    let dead = match (&doc.managed.dead_letter_queue_url, doc.managed.max_receives) {
        (Some(d), Some(n)) => format!(", dead letters after {n} receives to {d}"),
        _ => ", no dead-letter queue".to_string(),
    };
    writeln!(
        out,
        "events enabled on {dir}: provisioned {} {} for bucket {} (prefix {:?}, events {}{dead}), fingerprint {}; the first slice runs a baseline reconcile",
        topology.as_str(),
        url,
        bucket,
        doc.identity.prefix,
        doc.identity.event_types.describe(),
        doc.fingerprint
    )?;
    Ok(())
}

pub async fn enable(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let filer = &*ctx.filer;
    let dir = dir_of(&args)?;
    let (mapping, _) = read_json::<MountMapping>(filer, system_paths::MOUNT_MAPPING).await?.unwrap_or_default();
    let mount = mapping.find_dir(&dir).ok_or_else(|| {
        CmdError::Failed(format!("{dir} is not a mount; mount it first (remote.mount -dir={dir} -remote=...)"))
    })?;
    let (conf, _) = ctx.remote_conf(&mount.location.storage).await?.ok_or_else(|| {
        CmdError::Failed(format!("the remote {:?} of {dir} is not configured", mount.location.storage))
    })?;
    let event_types = match args.get("events") {
        Some(e) => EventTypes::parse(e).map_err(CmdError::Usage)?,
        None => EventTypes::default(),
    };
    let mut prefix = mount.location.key_prefix();
    if let Some(p) = args.get("prefix") {
        let p = p.trim_matches('/');
        if p.split('/').any(|s| path::segment_problem(s).is_some()) {
            return Err(CmdError::Usage(format!("bad -prefix={p:?}")));
        }
        prefix.push_str(p);
        prefix.push('/');
    }
    if args.get("queue").is_some() && args.get("topic").is_some() {
        return Err(CmdError::Usage(
            "-queue (bring your own subscription) and -topic (provision a subscription to that topic) exclude each other"
                .into(),
        ));
    }
    let (topology, queue) = match (args.get("queue"), args.get("via")) {
        (Some(_), None) if args.get("maxReceives").is_some() => {
            return Err(CmdError::Usage(
                "-maxReceives sets up the dead-letter queue of a queue Tidemark provisions; a bring-your-own queue (-queue) is \
                 consumed only: give it a redrive policy (or dead-letter topic) yourself"
                    .into(),
            ));
        }
        (Some(q), None) if !q.is_empty() => (Topology::ByoQueue, q.to_string()),
        // A local directory's events are its filesystem notifications: nothing to provision.
        (None, None) if conf.kind == StorageKind::Local => {
            (Topology::ByoQueue, tidemark_cloud::local_events::WATCH_QUEUE.to_string())
        }
        (Some(_), Some(_)) => {
            return Err(CmdError::Usage(
                "-queue (bring your own queue) and -via (provision) exclude each other".into(),
            ));
        }
        (_, via) => {
            if conf.kind == StorageKind::S3 && conf.setting("queue_integration") == Some("false") {
                return Err(CmdError::Failed(format!(
                    "remote {:?} is an S3-compatible store without queue integration (-s3.queue_integration=false): Tidemark cannot \
                     provision notifications there; keep {dir} in sync with remote.meta.sync (e.g. from cron), or pass -queue= if \
                     its notifications do reach a queue",
                    conf.name
                )));
            }
            let topology = provisioned_topology(&conf, via, args.get("topic"))?;
            return provision_direct(
                ctx,
                &dir,
                &conf,
                &mount.location.bucket,
                prefix,
                event_types,
                topology,
                &args,
                out,
            )
            .await;
        }
    };
    let identity = Identity { queue, topology, bucket: mount.location.bucket.clone(), prefix, event_types };
    let fingerprint = identity.fingerprint();
    let doc_file = doc_path(&dir);
    let existing = read_json::<SubscriptionDoc>(filer, &doc_file).await?;
    if let Some((old, version)) = &existing {
        if old.identity == identity {
            return update_options(ctx, &args, &doc_file, old, *version, out).await;
        }
        if !old.managed.is_empty() {
            return Err(CmdError::Failed(format!(
                "{dir} has a subscription with resources Tidemark provisioned ({}); a changed queue, topology, bucket, prefix or event \
                 types is a new subscription: run remote.events.disable -dir={dir} -teardown first",
                old.identity.topology.as_str()
            )));
        }
    }
    let now = now_ms();
    let doc = SubscriptionDoc {
        dir: dir.clone(),
        identity,
        fingerprint: fingerprint.clone(),
        options: options_from(
            &args,
            &existing.as_ref().map(|(d, _)| d.options.clone()).unwrap_or_else(SubscriptionOptions::default),
        )?,
        managed: Default::default(),
        created_at_ms: existing.as_ref().map_or(now, |(d, _)| d.created_at_ms),
        updated_at_ms: now,
    };
    write_json(filer, &doc_file, &doc, existing.map(|(_, v)| v)).await.map_err(|e| match e {
        Error::PreconditionFailed { .. } => {
            CmdError::Failed("the subscription changed concurrently; run the command again".into())
        }
        e => e.into(),
    })?;
    writeln!(
        out,
        "events enabled on {dir}: {} {} (bucket {}, prefix {:?}, events {}), fingerprint {fingerprint}; the first slice runs a baseline reconcile",
        doc.identity.topology.as_str(),
        doc.identity.queue,
        doc.identity.bucket,
        doc.identity.prefix,
        doc.identity.event_types.describe()
    )?;
    Ok(())
}

async fn all_docs(ctx: &Context) -> Result<Vec<SubscriptionDoc>, CmdError> {
    let mut docs = Vec::new();
    let mut after = None;
    loop {
        let page = match ctx.filer.list(SUBSCRIPTIONS_DIR, after.as_deref(), 1000).await {
            Ok(p) => p,
            Err(Error::NotFound { .. }) => return Ok(docs),
            Err(e) => return Err(e.into()),
        };
        for e in &page.entries {
            if let Some((d, _)) = read_json::<SubscriptionDoc>(&*ctx.filer, &e.path).await? {
                docs.push(d);
            }
        }
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok(docs),
        }
    }
}

/// The admin's view of the slices: fingerprint → who runs it (`None`: waiting for a worker).
/// `Err` says why the admin could not be asked (the list goes on without it).
async fn slices_from_admin(ctx: &Context) -> Result<std::collections::BTreeMap<String, Option<String>>, String> {
    let Some(admin) = &ctx.admin else { return Err("no --admin".into()) };
    let base = if admin.addr.contains("://") { admin.addr.clone() } else { format!("http://{}", admin.addr) };
    let client =
        reqwest::Client::builder().timeout(std::time::Duration::from_secs(2)).build().map_err(|e| e.to_string())?;
    let mut rb = client.get(format!("{base}/api/v1/subscriptions"));
    if let Some(t) = &admin.token {
        rb = rb.bearer_auth(t);
    }
    let resp = rb.send().await.map_err(|e| format!("the admin at {} is not reachable ({e})", admin.addr))?;
    if !resp.status().is_success() {
        return Err(format!("the admin at {} answered {}", admin.addr, resp.status()));
    }
    let v: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
    let mut out = std::collections::BTreeMap::new();
    for s in v["subscriptions"].as_array().into_iter().flatten() {
        if let (Some(fp), Some(job)) = (s["fingerprint"].as_str(), s["job"].as_object()) {
            out.insert(fp.to_string(), job.get("worker").and_then(|w| w.as_str()).map(str::to_string));
        }
    }
    Ok(out)
}

fn slice_text(slices: &Result<std::collections::BTreeMap<String, Option<String>>, String>, fp: &str) -> String {
    match slices {
        Err(_) => "?".into(),
        Ok(m) => match m.get(fp) {
            Some(Some(w)) => format!("running on {w}"),
            Some(None) => "waiting for a worker".into(),
            None => "none".into(),
        },
    }
}

pub async fn list(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let docs = all_docs(ctx).await?;
    let slices = if docs.is_empty() { Ok(Default::default()) } else { slices_from_admin(ctx).await };
    if args.is_set("json") {
        let mut items = Vec::new();
        for d in &docs {
            let status = read_json::<StatusBlob>(&*ctx.filer, &status_path(&d.fingerprint)).await?.map(|(s, _)| s);
            let mut v = serde_json::to_value(d).map_err(|e| CmdError::Failed(e.to_string()))?;
            if let Some(obj) = v.as_object_mut() {
                obj.insert("status".into(), serde_json::to_value(&status).unwrap_or_default());
                obj.insert("slice".into(), slice_text(&slices, &d.fingerprint).into());
            }
            items.push(v);
        }
        let json = serde_json::to_string_pretty(&items).map_err(|e| CmdError::Failed(e.to_string()))?;
        writeln!(out, "{json}")?;
        return Ok(());
    }
    if docs.is_empty() {
        writeln!(out, "no event subscriptions; enable one with remote.events.enable -dir=... -queue=...")?;
        return Ok(());
    }
    writeln!(
        out,
        "DIR\tTOPOLOGY\tQUEUE\tBUCKET/PREFIX\tEVENTS\tFINGERPRINT\tSTATE\tRECEIVED\tAPPLIED\tFAILED\tIGNORED\tECHO\tSHADOWED\tDEAD\tUPDATED\tSLICE"
    )?;
    for d in docs {
        // Slices write a status blob per fingerprint; until one has run, the state is idle.
        let status = read_json::<StatusBlob>(&*ctx.filer, &status_path(&d.fingerprint)).await?.map(|(s, _)| s);
        let (state, c) = match &status {
            Some(s) => (format!("{:?}", s.state).to_lowercase(), s.counters.clone()),
            None => ("idle".to_string(), Default::default()),
        };
        // `-` where there is no dead-letter queue (or it was not seen yet).
        let dead = status.as_ref().and_then(|s| s.dead_lettered).map_or("-".to_string(), |n| n.to_string());
        writeln!(
            out,
            "{}\t{}\t{}\t{}/{}\t{}\t{}\t{state}\t{}\t{}\t{}\t{}\t{}\t{}\t{dead}\t{}\t{}",
            d.dir,
            d.identity.topology.as_str(),
            d.identity.queue,
            d.identity.bucket,
            d.identity.prefix,
            d.identity.event_types.describe(),
            d.fingerprint,
            c.received,
            c.applied,
            c.failed,
            c.ignored,
            c.echo_suppressed,
            c.shadowed,
            format_rfc3339_ms(d.updated_at_ms),
            slice_text(&slices, &d.fingerprint)
        )?;
    }
    if let Err(why) = &slices {
        writeln!(out, "(SLICE unknown: {why}; pass --admin or set TIDEMARK_ADMIN)")?;
    }
    Ok(())
}

pub async fn disable(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let dir = dir_of(&args)?;
    let doc_file = doc_path(&dir);
    let Some((doc, version)) = read_json::<SubscriptionDoc>(&*ctx.filer, &doc_file).await? else {
        return Err(CmdError::Failed(format!("no event subscription on {dir}; remote.events.list shows them")));
    };
    if !doc.managed.is_empty() && !args.is_set("teardown") {
        return Err(CmdError::Failed(format!(
            "{dir} has resources Tidemark provisioned; run remote.events.disable -dir={dir} -teardown to remove them with the subscription"
        )));
    }
    let mut doc = doc;
    let mut version = version;
    let mut done = Vec::new();
    if !doc.managed.is_empty() {
        let (mapping, _) =
            read_json::<MountMapping>(&*ctx.filer, system_paths::MOUNT_MAPPING).await?.unwrap_or_default();
        let storage = mapping.find_dir(&dir).map(|m| m.location.storage.clone()).ok_or_else(|| {
            CmdError::Failed(format!(
                "{dir} is no longer a mount, so its remote's credentials are unknown: mount it again to tear down"
            ))
        })?;
        let (conf, _) = ctx
            .remote_conf(&storage)
            .await?
            .ok_or_else(|| CmdError::Failed(format!("the remote {storage:?} is not configured")))?;
        let notifications = capability(&conf, &doc.identity.bucket, &dir, None).await?;
        let mut left = doc.managed.clone();
        let torn = notifications.teardown(&mut left).await;
        if let Err(e) = &torn {
            // Keep the document, with what remains, so the teardown can be retried.
            doc.managed = left.clone();
            doc.updated_at_ms = now_ms();
            version = write_json(&*ctx.filer, &doc_file, &doc, Some(version)).await?;
            let _ = version;
            return Err(CmdError::Failed(format!(
                "teardown stopped part-way ({e}); still provisioned: {left:?}; the subscription is kept: run remote.events.disable -dir={dir} -teardown again"
            )));
        }
        done = torn.unwrap_or_default();
    }
    ctx.filer
        .delete(
            &doc_file,
            DeleteOptions { recursive: false, precondition: Precondition::Version(version), ..Default::default() },
        )
        .await
        .map_err(|e| match e {
            Error::PreconditionFailed { .. } => {
                CmdError::Failed("the subscription changed concurrently; run the command again".into())
            }
            e => e.into(),
        })?;
    if doc.managed.is_empty() {
        writeln!(
            out,
            "events disabled on {dir} ({} {}); nothing in the cloud was changed",
            doc.identity.topology.as_str(),
            doc.identity.queue
        )?;
    } else {
        writeln!(out, "events disabled on {dir}: {}", done.join("; "))?;
    }
    Ok(())
}
