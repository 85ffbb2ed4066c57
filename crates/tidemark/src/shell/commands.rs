//! The shell's commands. Each is a row of [`ALL`]: its name, synopsis, flags and body.

use futures::StreamExt;
use tidemark_core::model::{Content, Entry};
use tidemark_core::{ByteStream, DeleteOptions, WriteOptions, format_rfc3339_ms, path};

use super::flags::{Args, flag, switch};
use super::{CmdError, Command, Context, Out};
use super::{cache, remote, s3, subscriptions};

pub static ALL: &[Command] = &[
    Command {
        name: "fs.ls",
        synopsis: "[-l] [PATH]",
        summary: "list a directory (default /), or show one file",
        details: "With -l: mode, size in bytes, modification time (UTC), how much of a remote-backed file this filer\n\
                  has cached (`100%`; `-` for local content and directories) and name. Directories end in `/`.",
        flags: &[switch("l", "long listing: mode, size, mtime, name")],
        positional: (0, 1),
        run: |ctx, args, out| Box::pin(fs_ls(ctx, args, out)),
    },
    Command {
        name: "fs.meta.cat",
        synopsis: "PATH",
        summary: "print an entry's metadata as JSON",
        details: "A remote-backed file also shows `cache`: the bytes and chunks of its current version cached here.",
        flags: &[],
        positional: (1, 1),
        run: |ctx, args, out| Box::pin(fs_meta_cat(ctx, args, out)),
    },
    Command {
        name: "fs.cat",
        synopsis: "PATH",
        summary: "print a file's content",
        details: "",
        flags: &[],
        positional: (1, 1),
        run: |ctx, args, out| Box::pin(fs_cat(ctx, args, out)),
    },
    Command {
        name: "fs.put",
        synopsis: "LOCALFILE PATH",
        summary: "upload a local file (or - for stdin) to PATH",
        details: "If PATH is an existing directory or ends in `/`, the file keeps its name inside it.\n\
                  The entry appears only once every byte is stored: an interrupted upload leaves the old entry.",
        flags: &[],
        positional: (2, 2),
        run: |ctx, args, out| Box::pin(fs_put(ctx, args, out)),
    },
    Command {
        name: "fs.rm",
        synopsis: "[-r] PATH",
        summary: "remove a file, or with -r a directory and everything below it",
        details: "",
        flags: &[switch("r", "remove a directory and everything below it")],
        positional: (1, 1),
        run: |ctx, args, out| Box::pin(fs_rm(ctx, args, out)),
    },
    Command {
        name: "remote.configure",
        synopsis: "[-name=NAME -type=s3|gcs|azure|local [-TYPE.SETTING=VALUE ...]] [-delete]",
        summary: "add, change, delete or (no flags) list remote storages",
        details: "Stored at /etc/tidemark/remote/NAME.conf. Secrets are masked whenever shown.\n\
                  Changing an existing remote merges the settings given into it.\n\
                  s3:    -s3.endpoint -s3.region -s3.access_key -s3.secret_key -s3.session_token\n\
                  \x20      -s3.force_path_style -s3.sqs_endpoint -s3.sns_endpoint -s3.events_endpoint\n\
                  gcs:   -gcs.endpoint -gcs.service_account_json | -gcs.access_token -gcs.pubsub_endpoint -gcs.project\n\
                  \x20      -gcs.resource_manager_endpoint -gcs.emulator=true (the emulators: no credentials; an\n\
                  \x20      endpoint alone never turns credentials off); without -gcs.service_account_json or\n\
                  \x20      -gcs.access_token: Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's\n\
                  \x20      application-default login, the metadata server of a Google Cloud machine or GKE pod)\n\
                  azure: -azure.account -azure.blob_endpoint -azure.queue_endpoint, and one way to sign in:\n\
                  \x20      -azure.account_key | -azure.sas_token (the data plane only), or a Microsoft Entra ID identity\n\
                  \x20      (the data plane and Resource Manager) chosen by -azure.identity=client_secret (-azure.tenant_id\n\
                  \x20      -azure.client_id -azure.client_secret) | workload_identity (-azure.federated_token_file, or\n\
                  \x20      AKS's AZURE_* variables) | managed_identity (-azure.client_id: a user-assigned one) | azure_cli;\n\
                  \x20      without -azure.identity: the key, the SAS, a client secret, a federated token file, a managed\n\
                  \x20      identity endpoint (IDENTITY_ENDPOINT), in that order; the data role the identity needs is\n\
                  \x20      Storage Blob Data Contributor (and, for events, Storage Queue Data Message Processor/Sender)\n\
                  \x20      (to provision events) -azure.subscription_id -azure.resource_group -azure.arm_endpoint\n\
                  \x20      -azure.login_endpoint\n\
                  local: -local.root (the directory whose subdirectories are the buckets)\n\
                  example: remote.configure -name=aws1 -type=s3 -s3.region=eu-west-1 -s3.access_key=AK -s3.secret_key=SK",
        flags: &[
            flag("name", "the remote's name: letters, digits, - and _"),
            flag("type", "s3, gcs, azure or local"),
            switch("delete", "delete the remote (refused while a mount uses it)"),
            flag("s3.endpoint", "endpoint URL of an S3-compatible store or emulator"),
            flag("s3.region", "region (default us-east-1)"),
            flag("s3.access_key", "access key id (default: the AWS credential chain)"),
            flag("s3.secret_key", "secret access key"),
            flag("s3.session_token", "session token for temporary credentials"),
            flag("s3.force_path_style", "true: address buckets as ENDPOINT/BUCKET (default with an endpoint)"),
            flag("s3.sqs_endpoint", "endpoint URL of SQS, for events (default: -s3.endpoint)"),
            flag("s3.sns_endpoint", "endpoint URL of SNS, for events (default: -s3.endpoint)"),
            flag("s3.events_endpoint", "endpoint URL of EventBridge, for -via=eventbridge (default: -s3.endpoint)"),
            flag("s3.queue_integration", "false: an S3-compatible store without SQS/SNS; events cannot be provisioned"),
            flag("local.root", "the directory whose subdirectories are the buckets"),
            flag("gcs.endpoint", "Cloud Storage endpoint (default https://storage.googleapis.com)"),
            flag(
                "gcs.service_account_json",
                "a Google credentials file: a service account key, authorized user, external account (workload \
                 identity federation) or impersonated service account (default: Application Default Credentials)",
            ),
            flag("gcs.access_token", "an OAuth2 access token, instead of a service account"),
            flag(
                "gcs.emulator",
                "true: the endpoints are emulators (fake-gcs-server, the Pub/Sub emulator): no credentials are sent",
            ),
            flag("gcs.pubsub_endpoint", "Pub/Sub endpoint, for events (default https://pubsub.googleapis.com)"),
            flag("gcs.project", "the project of the Pub/Sub topic and subscription, for events"),
            flag(
                "gcs.resource_manager_endpoint",
                "Cloud Resource Manager (default https://cloudresourcemanager.googleapis.com)",
            ),
            flag("azure.account", "the storage account name"),
            flag("azure.account_key", "the account's shared key (base64)"),
            flag("azure.sas_token", "a SAS token, instead of the account key"),
            flag(
                "azure.identity",
                "shared_key, sas, client_secret, workload_identity, managed_identity or azure_cli (default: inferred)",
            ),
            flag("azure.federated_token_file", "workload identity: the federated token's file"),
            flag("azure.blob_endpoint", "blob endpoint URL (default https://ACCOUNT.blob.core.windows.net)"),
            flag(
                "azure.queue_endpoint",
                "queue endpoint URL, for events (default https://ACCOUNT.queue.core.windows.net)",
            ),
            flag("azure.subscription_id", "the storage account's Azure subscription, to provision Event Grid delivery"),
            flag("azure.resource_group", "the storage account's resource group, to provision Event Grid delivery"),
            flag("azure.tenant_id", "the Microsoft Entra tenant of the identity"),
            flag("azure.client_id", "the identity's application (client) id (managed_identity: a user-assigned one)"),
            flag("azure.client_secret", "the service principal's client secret"),
            flag("azure.arm_endpoint", "Azure Resource Manager (default https://management.azure.com)"),
            flag("azure.login_endpoint", "Microsoft Entra sign-in (default https://login.microsoftonline.com)"),
        ],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(remote::configure(ctx, args, out)),
    },
    Command {
        name: "remote.mount",
        synopsis: "[-dir=/mnt/data -remote=NAME/BUCKET[/PATH] [-nonempty]]",
        summary: "mount a bucket (or a path in it) on a directory, pulling its metadata; no flags: list mounts",
        details: "The first metadata pull runs before the mount is recorded; if it fails, what it pulled is removed.\n\
                  Content is not copied: a read fetches what it needs from the bucket, then the filer's cache serves it.",
        flags: &[
            flag("dir", "the directory to mount on"),
            flag("remote", "NAME/BUCKET or NAME/BUCKET/PATH"),
            switch("nonempty", "allow mounting on a directory that already has entries"),
        ],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(remote::mount(ctx, args, out)),
    },
    Command {
        name: "remote.unmount",
        synopsis: "[-dir=/mnt/data]",
        summary: "unmount a directory: forget the mount, then its synced metadata; no flags: list mounts",
        details: "Never deletes an object. Entries that hold local data (local-only, or written since the last sync) are kept.",
        flags: &[flag("dir", "the mounted directory")],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(remote::unmount(ctx, args, out)),
    },
    Command {
        name: "remote.sync.enable",
        synopsis: "-dir=/mnt/data",
        summary: "upload local writes under a mount to its bucket (the outbound sync)",
        details: "The filer uploads each local write (with tidemark-origin and tidemark-version metadata, so the\n\
                  bucket's event for it is recognised as this cluster's own echo) and propagates deletes users make.",
        flags: &[flag("dir", "the mounted directory")],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(remote::sync_enable(ctx, args, out, true)),
    },
    Command {
        name: "remote.sync.disable",
        synopsis: "-dir=/mnt/data",
        summary: "stop uploading local writes under a mount",
        details: "",
        flags: &[flag("dir", "the mounted directory")],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(remote::sync_enable(ctx, args, out, false)),
    },
    Command {
        name: "remote.events.enable",
        synopsis: "-dir=/mnt/data [-queue=URL|NAME | -via=sns|eventbridge | -topic=T] [-events=created,removed] [-prefix=P] [-slice=5m] ...",
        summary: "subscribe a mount to its bucket's event notifications",
        details: "-queue: the queue the bucket's notifications already reach (bring your own; consume only): an SQS queue URL,\n\
                  a Pub/Sub subscription (projects/P/subscriptions/S) or an Azure queue name.\n\
                  A local directory mount needs no queue: its filesystem notifications are its events (fs-notify).\n\
                  Without -queue (S3): provision a queue and point the bucket's notification at it (sqs_direct), or with\n\
                  -via=sns a shared topic per bucket and this cluster's queue subscribed to it (several clusters can share\n\
                  one bucket's events); with -via=eventbridge the bucket's EventBridge delivery (turned on if off), a rule of\n\
                  this cluster's on the default bus and its queue as the target (each cluster its own rule).\n\
                  Without -queue (Cloud Storage, needs -gcs.project): a Pub/Sub topic of the subscription's own (recorded as\n\
                  sqs_direct), the publisher role on it for the bucket's service agent, this cluster's subscription, and the\n\
                  bucket's notification configuration (JSON_API_V1, the event types, the prefix); with -topic=T an existing\n\
                  topic instead, which several clusters can share, each with its own subscription (recorded as sns_fanout;\n\
                  Tidemark never deletes that topic). -via is S3's. -maxReceives (5 to 100, default 10; 0: none) adds a\n\
                  dead-letter topic NAME-dead with a subscription that keeps its messages.\n\
                  Without -queue (Azure; needs -azure.subscription_id, -azure.resource_group and a service principal:\n\
                  -azure.tenant_id, -azure.client_id, -azure.client_secret): a storage queue (and NAME-poison), the account's\n\
                  Event Grid system topic (the existing one, or a new one) and an event subscription of this cluster's on it,\n\
                  filtered to the container and prefix, delivering to the queue. Enabling the\n\
                  same identity again changes nothing; a new queue, prefix or event types\n\
                  is a new subscription (new fingerprint, baseline first), refused while provisioned resources exist.\n\
                  -prefetch=GLOB warms the content cache: after an event's create or update of a matching file is applied,\n\
                  the filer fetches the new version in the background, so it is local when read (off by default; `-prefetch=`\n\
                  turns it off). It never delays the apply of other keys or the slice's lease.\n\
                  A provisioned queue gets a dead-letter queue (NAME-dead): a message received -maxReceives times without\n\
                  being applied (one that cannot be decoded, a key that keeps failing) moves there rather than coming back\n\
                  for ever; remote.events.list shows how many wait there (DEAD), and reconciles converge their entries anyway.",
        flags: &[
            flag("dir", "the mounted directory"),
            flag("queue", "the queue to consume (bring your own)"),
            flag("via", "sns: an SNS fan-out; eventbridge: an EventBridge rule (omit for a direct SQS queue)"),
            flag("topic", "Cloud Storage: an existing Pub/Sub topic to subscribe to (projects/P/topics/T or T)"),
            flag("events", "event types: created, removed, other (default created,removed)"),
            flag("prefix", "only keys below this path of the mount"),
            flag("slice", "how long one slice runs before the next is proposed (default 5m)"),
            flag("reconcileInterval", "how often a scheduled full reconcile runs (default 24h)"),
            flag("gapThreshold", "a tail interrupted longer than this runs a gap reconcile (default 1h)"),
            flag("visibility", "the queue's visibility timeout for a delivery in progress (default 60s)"),
            flag(
                "concurrency",
                "HEADs of distinct keys in flight at once; a batch's writes are one transaction (default 8)",
            ),
            flag("prefetch", "fetch the new version of matching files into the cache on events, e.g. *.parquet"),
            flag("prefetchMaxSize", "only prefetch files of at most this size (e.g. 64M)"),
            flag(
                "maxReceives",
                "receives of one message before it is dead-lettered (default 10; 0: no dead-letter queue)",
            ),
        ],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(subscriptions::enable(ctx, args, out)),
    },
    Command {
        name: "remote.events.list",
        synopsis: "[-json]",
        summary: "list event subscriptions: dir, topology, queue, bucket/prefix, events, fingerprint, state",
        details: "",
        flags: &[switch("json", "print the subscription documents as JSON")],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(subscriptions::list(ctx, args, out)),
    },
    Command {
        name: "remote.events.disable",
        synopsis: "-dir=/mnt/data [-teardown]",
        summary: "remove a mount's event subscription (-teardown: and what Tidemark provisioned for it)",
        details: "A bring-your-own queue is never touched.",
        flags: &[flag("dir", "the mounted directory"), switch("teardown", "deprovision the managed resources too")],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(subscriptions::disable(ctx, args, out)),
    },
    Command {
        name: "s3.configure",
        synopsis: "[-user=NAME [-access_key=AK -secret_key=SK] [-actions=Read,Write,List,Admin] [-buckets=B1,B2] [-delete] [-apply]]",
        summary: "manage the S3 gateway's access keys and what each identity may do",
        details: "Without flags: show the identities (secrets masked). With -user: add keys, actions or buckets to that\n\
                  identity (created if new); with -delete: remove the named key, actions or buckets, or the whole identity.\n\
                  Without -buckets, an identity uses the buckets it created through S3 and those no identity created\n\
                  (made by the shell or a remote mount); a bucket another identity created is that one's alone.\n\
                  -buckets names the buckets the identity uses instead, whoever created them. The identity `anonymous`\n\
                  (no keys) is what unsigned requests may do (canned ACLs such as public-read open more). Changes are shown and saved only with -apply; gateways pick them up within 2 s.\n\
                  While no key exists, a gateway on loopback accepts the development key tidemark/tidemark.",
        flags: &[
            flag("user", "the identity's name"),
            flag("access_key", "an access key id to add (or, with -delete, to remove)"),
            flag("secret_key", "its secret (8 to 128 characters)"),
            flag("actions", "Read, Write, List, Admin (comma-separated)"),
            flag("buckets", "the buckets the identity's actions apply to, whoever created them (comma-separated)"),
            switch("delete", "remove instead of add"),
            switch("apply", "save the change (otherwise it is only shown)"),
        ],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(s3::configure(ctx, args, out)),
    },
    Command {
        name: "remote.cache",
        synopsis: "-dir=/mnt/data [-include=GLOB] [-exclude=GLOB] [-minSize=N] [-maxSize=N] [-concurrent=N]",
        summary: "fetch remote-backed files into the filer's content cache, so reads are local",
        details: "Fetches every chunk not cached yet of the files that match (a pattern matches the file's name, or with a `/`\n\
                  its path below -dir; sizes take K/M/G suffixes). Shows bytes and ETA on a terminal, then a summary.\n\
                  Local and locally written files are never cache and are left alone; archived objects (S3 GLACIER or\n\
                  DEEP_ARCHIVE not restored, Azure's Archive tier) cannot be read, and are skipped and counted.",
        flags: &[
            flag("dir", "the directory (or one file)"),
            flag("include", "only files matching this pattern, e.g. *.parquet"),
            flag("exclude", "not files matching this pattern"),
            flag("minSize", "only files of at least this size"),
            flag("maxSize", "only files of at most this size"),
            flag("concurrent", "files fetched at once (default 8)"),
        ],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(cache::cache(ctx, args, out)),
    },
    Command {
        name: "remote.uncache",
        synopsis: "-dir=/mnt/data [-include=GLOB] [-exclude=GLOB] [-minSize=N] [-maxSize=N]",
        summary: "drop the cached content of remote-backed files (metadata stays; the next read fetches again)",
        details: "Never touches local-only files or local writes not yet uploaded: those are not cache.",
        flags: &[
            flag("dir", "the directory (or one file)"),
            flag("include", "only files matching this pattern"),
            flag("exclude", "not files matching this pattern"),
            flag("minSize", "only files of at least this size"),
            flag("maxSize", "only files of at most this size"),
        ],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(cache::uncache(ctx, args, out)),
    },
    Command {
        name: "remote.meta.sync",
        synopsis: "-dir=/mnt/data [-delete=true] [-dryRun] [-quiet] [-listRanges=16]",
        summary: "reconcile a mount's metadata with its bucket (a full diff)",
        details: "Prints `path (create|update|delete|skip: reason)` for every change and notable skip (every path with\n\
                  -dryRun), then a summary. Local-only and locally written entries are never touched.\n\
                  The bucket is listed as up to -listRanges key ranges at once (S3, GCS, local; Azure lists as one):\n\
                  the same keys in the same order as one stream of pages, at the bucket's parallel rate.",
        flags: &[
            flag("dir", "the mounted directory"),
            flag(
                "listRanges",
                "key ranges of the bucket listed at once, 1 to 256 (default 16; 1: one stream of pages)",
            ),
            switch("delete", "delete entries whose object is gone (default true; -delete=false keeps them)"),
            switch("dryRun", "decide and print, write nothing"),
            switch("quiet", "print only the summary"),
        ],
        positional: (0, 0),
        run: |ctx, args, out| Box::pin(remote::meta_sync(ctx, args, out)),
    },
];

fn user_path(s: &str) -> Result<String, CmdError> {
    path::normalize_user_path(s).map_err(|e| CmdError::Usage(e.to_string()))
}

fn mode_string(e: &Entry) -> String {
    use tidemark_core::model::EntryKind;
    let mut s = String::with_capacity(10);
    s.push(match e.kind {
        EntryKind::File => '-',
        EntryKind::Dir => 'd',
        EntryKind::Symlink => 'l',
        EntryKind::Fifo => 'p',
        EntryKind::Socket => 's',
        EntryKind::CharDevice => 'c',
        EntryKind::BlockDevice => 'b',
    });
    for shift in [6, 3, 0] {
        let bits = (e.mode >> shift) & 0o7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// One line of `fs.ls`; with `long`, `cached` is the cache column.
/// A name as a listing shows it: quoted (`'name '`) where it would not read as itself — a space
/// at its start or end, control characters (escaped, as `path::printable` does), an empty
/// target — so that `a ` and `a` are told apart; other names as they are.
fn shown(name: &str) -> String {
    let printable = path::printable(name);
    let needs = name.is_empty()
        || name.starts_with(char::is_whitespace)
        || name.ends_with(char::is_whitespace)
        || matches!(printable, std::borrow::Cow::Owned(_));
    if needs { format!("'{}'", printable.replace('\'', "\\'")) } else { printable.into_owned() }
}

fn print_entry(out: Out<'_>, e: &Entry, long: Option<&str>) -> std::io::Result<()> {
    let name = if e.path == path::ROOT { "/".into() } else { shown(e.name()) };
    let slash = if e.is_dir() && e.path != path::ROOT { "/" } else { "" };
    // An object that must be restored before it can be read says so, with its class.
    let archived = tidemark_core::model::object_attrs::archived(&e.extended)
        .map(|class| format!("  (archived: {class}; restore it to read)"))
        .unwrap_or_default();
    match long {
        Some(cached) => {
            let target = e.posix.target.as_deref().map(|t| format!(" -> {}", shown(t))).unwrap_or_default();
            writeln!(
                out,
                "{} {:>12} {} {cached:>4} {name}{slash}{target}{archived}",
                mode_string(e),
                e.size,
                format_rfc3339_ms(e.mtime_ms)
            )
        }
        None => writeln!(out, "{name}{slash}"),
    }
}

/// The cache column for each of `entries` (one request for the remote-backed ones; `?` if the
/// filer cannot say).
async fn cache_columns(ctx: &Context, entries: &[Entry]) -> Vec<String> {
    let remote: Vec<String> = entries.iter().filter(|e| e.content == Content::Remote).map(|e| e.path.clone()).collect();
    let status = if remote.is_empty() { Vec::new() } else { ctx.filer.cache_status(&remote).await.unwrap_or_default() };
    // The answers come in the order asked: the remote-backed entries' order.
    let mut answers = status.iter();
    entries
        .iter()
        .map(|e| {
            let s = if e.content == Content::Remote { answers.next() } else { None };
            cache::cache_column(e, s)
        })
        .collect()
}

async fn fs_ls(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let p = user_path(args.positional.first().map_or("/", String::as_str))?;
    let long = args.is_set("l");
    let entry = ctx.filer.stat(&p).await?.ok_or_else(|| CmdError::Failed(format!("{p}: no such entry")))?;
    if !entry.is_dir() {
        let columns = if long { cache_columns(ctx, std::slice::from_ref(&entry)).await } else { Vec::new() };
        print_entry(out, &entry, columns.first().map(String::as_str))?;
        return Ok(());
    }
    let mut after: Option<String> = None;
    loop {
        let page = ctx.filer.list(&p, after.as_deref(), 1000).await?;
        let columns = if long { cache_columns(ctx, &page.entries).await } else { Vec::new() };
        for (i, e) in page.entries.iter().enumerate() {
            print_entry(&mut *out, e, columns.get(i).map(String::as_str))?;
        }
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok(()),
        }
    }
}

async fn fs_meta_cat(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let p = user_path(&args.positional[0])?;
    let entry = ctx.filer.stat(&p).await?.ok_or_else(|| CmdError::Failed(format!("{p}: no such entry")))?;
    let mut doc = serde_json::to_value(&entry).map_err(|e| CmdError::Failed(e.to_string()))?;
    if entry.content == Content::Remote
        && let Some(s) = ctx.filer.cache_status(std::slice::from_ref(&p)).await?.into_iter().next()
        && let Some(obj) = doc.as_object_mut()
    {
        obj.insert("cache".into(), serde_json::json!({ "cached_bytes": s.cached_bytes, "chunks": s.chunks }));
    }
    let json = serde_json::to_string_pretty(&doc).map_err(|e| CmdError::Failed(e.to_string()))?;
    writeln!(out, "{json}")?;
    Ok(())
}

async fn fs_cat(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let p = user_path(&args.positional[0])?;
    let (_, mut stream) = ctx.filer.read(&p, None).await?;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| CmdError::Failed(format!("{p}: reading content: {e}")))?;
        out.write_all(&chunk)?;
    }
    Ok(())
}

async fn fs_put(ctx: &Context, args: Args, out: Out<'_>) -> Result<(), CmdError> {
    let local = &args.positional[0];
    let target = &args.positional[1];
    let body: ByteStream = if local == "-" {
        tokio_util::io::ReaderStream::new(tokio::io::stdin()).boxed()
    } else {
        let f = tokio::fs::File::open(local).await.map_err(|e| CmdError::Failed(format!("{local}: {e}")))?;
        if f.metadata().await.is_ok_and(|m| m.is_dir()) {
            return Err(CmdError::Failed(format!("{local}: is a directory; fs.put uploads one file")));
        }
        tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024).boxed()
    };
    let mut dest = user_path(target)?;
    let into_dir = target.ends_with('/') || ctx.filer.stat(&dest).await?.is_some_and(|e| e.is_dir());
    if into_dir {
        let name =
            std::path::Path::new(local).file_name().and_then(|n| n.to_str()).filter(|_| local != "-").ok_or_else(
                || CmdError::Usage(format!("{target} is a directory; name the file to write (PATH/NAME)")),
            )?;
        dest = user_path(&path::join(&dest, name))?;
    }
    let entry = ctx.filer.write(&dest, body, WriteOptions::default()).await?;
    writeln!(out, "{dest}: {} bytes, version {}", entry.size, entry.version)?;
    Ok(())
}

async fn fs_rm(ctx: &Context, args: Args, _out: Out<'_>) -> Result<(), CmdError> {
    let p = user_path(&args.positional[0])?;
    if p == path::ROOT {
        return Err(CmdError::Failed("refusing to remove /".into()));
    }
    ctx.filer.delete(&p, DeleteOptions { recursive: args.is_set("r"), ..Default::default() }).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::shown;

    /// A name that would not read as itself in a listing is quoted; others print as they are.
    #[test]
    fn names_that_would_not_read_as_themselves_are_quoted() {
        for (name, want) in [
            ("plain", "plain"),
            ("with space", "with space"),
            ("ends in a space ", "'ends in a space '"),
            (" starts", "' starts'"),
            ("bell\u{7}", "'bell\\x07'"),
            ("new\nline", "'new\\x0aline'"),
            ("it's ", "'it\\'s '"),
            ("é", "é"),
        ] {
            assert_eq!(shown(name), want, "{name:?}");
        }
    }
}
