//! The event source of a `local` remote: filesystem notifications of the bucket's directory
//! (inotify and friends, through the `notify` crate) fed into an in-process queue with the same
//! at-least-once contract as a cloud queue — receive, visibility timeout, ack, extend, release.
//!
//! Unlike a cloud queue it keeps nothing while nobody watches: a watcher starts with the first
//! slice of a directory in this process and lives as long as the process, and it says so
//! through [`EventSource::missed_events`] (a fresh watcher, or a full buffer), so the slice runs
//! a gap reconcile first. The messages are S3-shaped event records (the S3 decoder reads them);
//! each names a key and whether the path exists now — the applier asks the directory (HEAD) what
//! the object is anyway.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use notify::{EventKind as FsKind, RecursiveMode, Watcher};

use tidemark_core::events::{AckReport, Delivery, EventSource};
use tidemark_core::{Error, Result, SystemClock};

/// The queue name of a local mount's subscription: the directory's notifications.
pub const WATCH_QUEUE: &str = "fs-notify";

/// Messages kept before the watcher gives up and asks for a gap reconcile instead.
const CAPACITY: usize = 100_000;
const MAX_BATCH: usize = 100;

struct Message {
    body: Bytes,
    receive_count: u32,
    sent_at_ms: i64,
}

#[derive(Default)]
struct Queue {
    next: u64,
    ready: VecDeque<Message>,
    /// Delivered and not acknowledged: back to `ready` when the deadline passes.
    in_flight: HashMap<String, (Message, Instant)>,
    /// Released with a delay.
    delayed: Vec<(Instant, Message)>,
    missed: bool,
}

impl Queue {
    fn len(&self) -> usize {
        self.ready.len() + self.in_flight.len() + self.delayed.len()
    }

    fn push(&mut self, body: Bytes) {
        if self.len() >= CAPACITY {
            self.missed = true;
            return;
        }
        self.ready.push_back(Message { body, receive_count: 0, sent_at_ms: now_ms() });
    }

    /// Moves what became visible again back to the front of `ready`.
    fn expire(&mut self, now: Instant) {
        let due: Vec<String> = self.in_flight.iter().filter(|(_, (_, d))| *d <= now).map(|(k, _)| k.clone()).collect();
        for k in due {
            if let Some((m, _)) = self.in_flight.remove(&k) {
                self.ready.push_front(m);
            }
        }
        let (back, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.delayed).into_iter().partition(|(d, _)| *d <= now);
        self.delayed = keep;
        for (_, m) in back {
            self.ready.push_front(m);
        }
    }
}

struct Watch {
    dir: PathBuf,
    bucket: String,
    queue: Mutex<Queue>,
    arrived: tokio::sync::Notify,
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
}

fn now_ms() -> i64 {
    use tidemark_core::Clock;
    SystemClock.now_ms()
}

/// Form-encodes a key as S3 notifications do (`+` for a space).
fn form_encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn record(bucket: &str, key: &str, exists: bool) -> serde_json::Value {
    let name = if exists { "ObjectCreated:Put" } else { "ObjectRemoved:Delete" };
    serde_json::json!({
        "eventVersion": "2.1",
        "eventTime": tidemark_core::format_rfc3339_ms(now_ms()),
        "eventName": name,
        "s3": {"bucket": {"name": bucket}, "object": {"key": form_encode(key)}},
    })
}

impl Watch {
    /// The key of a path under the directory, if it names one Tidemark can mirror.
    fn key_of(&self, p: &Path) -> Option<String> {
        let rel = p.strip_prefix(&self.dir).ok()?;
        let s = rel.to_str()?; // a name that is not UTF-8 is no key; the reconcile reports it
        if s.is_empty() || s.split('/').any(|seg| seg.starts_with(".tidemark-tmp-")) {
            return None;
        }
        Some(s.to_string())
    }

    fn on_event(&self, event: notify::Result<notify::Event>) {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "filesystem notifications failed; a gap reconcile follows");
                self.queue.lock().unwrap_or_else(|p| p.into_inner()).missed = true;
                self.arrived.notify_waiters();
                return;
            }
        };
        if event.need_rescan() {
            self.queue.lock().unwrap_or_else(|p| p.into_inner()).missed = true;
        }
        let wanted = matches!(
            event.kind,
            FsKind::Create(_)
                | FsKind::Modify(_)
                | FsKind::Remove(_)
                | FsKind::Access(notify::event::AccessKind::Close(notify::event::AccessMode::Write))
        );
        if !wanted {
            return;
        }
        let mut records = Vec::new();
        for p in &event.paths {
            let Some(key) = self.key_of(p) else { continue };
            match std::fs::symlink_metadata(p) {
                Ok(md) if md.is_dir() => {
                    records.push(record(&self.bucket, &format!("{key}/"), true));
                    // Files created in a new directory before its watch was added send nothing.
                    if matches!(event.kind, FsKind::Create(_)) {
                        self.walk(p, &mut records);
                    }
                }
                Ok(_) => records.push(record(&self.bucket, &key, true)),
                Err(_) => {
                    // Gone: it was a file or a directory; the HEAD of each decides.
                    records.push(record(&self.bucket, &key, false));
                    records.push(record(&self.bucket, &format!("{key}/"), false));
                }
            }
        }
        if records.is_empty() {
            return;
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        for r in records {
            q.push(Bytes::from(serde_json::json!({ "Records": [r] }).to_string()));
        }
        drop(q);
        self.arrived.notify_waiters();
    }

    fn walk(&self, dir: &Path, out: &mut Vec<serde_json::Value>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let Some(key) = self.key_of(&p) else { continue };
            match e.file_type() {
                Ok(t) if t.is_dir() => {
                    out.push(record(&self.bucket, &format!("{key}/"), true));
                    self.walk(&p, out);
                }
                Ok(_) => out.push(record(&self.bucket, &key, true)),
                Err(_) => {}
            }
        }
    }
}

static WATCHES: LazyLock<Mutex<HashMap<PathBuf, Arc<Watch>>>> = LazyLock::new(Default::default);

/// Watches `root/bucket` (once per process) and consumes its notifications.
pub struct LocalWatchSource {
    watch: Arc<Watch>,
    visibility: Duration,
}

impl LocalWatchSource {
    pub fn open(root: &Path, bucket: &str, visibility: Duration) -> Result<Self> {
        // The storage's own checks: an existing directory, a bucket name that is one segment.
        crate::local::LocalStorage::at(root, bucket)?;
        let dir = std::fs::canonicalize(root.join(bucket))
            .map_err(|e| Error::io(format!("resolving {}", root.join(bucket).display()), e))?;
        let mut all = WATCHES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = all.get(&dir) {
            return Ok(LocalWatchSource { watch: w.clone(), visibility });
        }
        let watch = Arc::new(Watch {
            dir: dir.clone(),
            bucket: bucket.to_string(),
            // A new watcher knows nothing of what happened before it: reconcile first.
            queue: Mutex::new(Queue { missed: true, ..Default::default() }),
            arrived: tokio::sync::Notify::new(),
            watcher: Mutex::new(None),
        });
        let weak = Arc::downgrade(&watch);
        // Links are not followed: what lies behind one is outside the bucket.
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher = notify::RecommendedWatcher::new(
            move |ev| {
                if let Some(w) = weak.upgrade() {
                    w.on_event(ev)
                }
            },
            config,
        )
        .map_err(|e| Error::Unavailable { message: format!("cannot watch {}: {e}", dir.display()) })?;
        watcher.watch(&dir, RecursiveMode::Recursive).map_err(|e| Error::Unavailable {
            message: format!(
                "cannot watch {} for changes: {e} (on Linux, raise fs.inotify.max_user_watches)",
                dir.display()
            ),
        })?;
        *watch.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(watcher);
        all.insert(dir, watch.clone());
        Ok(LocalWatchSource { watch, visibility })
    }

    /// Puts a message on this directory's queue as if a notification had produced it (the
    /// conformance suite's producer; nothing else needs it).
    pub fn inject(&self, body: &str) {
        self.watch.queue.lock().unwrap_or_else(|p| p.into_inner()).push(Bytes::from(body.to_string()));
        self.watch.arrived.notify_waiters();
    }

    fn take(&self, max: usize) -> Vec<Delivery> {
        let mut q = self.watch.queue.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        q.expire(now);
        let mut out = Vec::new();
        while out.len() < max {
            let Some(mut m) = q.ready.pop_front() else { break };
            m.receive_count += 1;
            q.next += 1;
            let ack_id = format!("{}", q.next);
            out.push(Delivery {
                ack_id: ack_id.clone(),
                body: m.body.clone(),
                attributes: Default::default(),
                receive_count: m.receive_count,
                sent_at_ms: Some(m.sent_at_ms),
            });
            q.in_flight.insert(ack_id, (m, now + self.visibility));
        }
        out
    }
}

#[async_trait]
impl EventSource for LocalWatchSource {
    fn describe(&self) -> String {
        format!("{WATCH_QUEUE}:{}", self.watch.dir.display())
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so an event between the look and the wait is not missed.
            let arrived = self.watch.arrived.notified();
            let got = self.take(max.clamp(1, MAX_BATCH));
            if !got.is_empty() {
                // Let a burst (a copy of many files) gather into one batch.
                return Ok(got);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            // Wake for new events, or to re-check deadlines of in-flight messages.
            let _ = tokio::time::timeout((deadline - now).min(Duration::from_millis(250)), arrived).await;
        }
    }

    async fn ack(&self, ack_ids: &[String]) -> Result<AckReport> {
        let mut q = self.watch.queue.lock().unwrap_or_else(|p| p.into_inner());
        Ok(AckReport::removing(ack_ids, |id| q.in_flight.remove(id).is_some()))
    }

    async fn extend(&self, ack_id: &str, by: Duration) -> Result<()> {
        let mut q = self.watch.queue.lock().unwrap_or_else(|p| p.into_inner());
        match q.in_flight.get_mut(ack_id) {
            Some((_, deadline)) => {
                *deadline = Instant::now() + by;
                Ok(())
            }
            None => Err(Error::NotFound { path: format!("delivery {ack_id} (acknowledged, or already redelivered)") }),
        }
    }

    async fn release(&self, ack_id: &str, delay: Duration) -> Result<()> {
        let mut q = self.watch.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((m, _)) = q.in_flight.remove(ack_id) {
            q.delayed.push((Instant::now() + delay, m));
        }
        Ok(())
    }

    fn missed_events(&self) -> bool {
        self.watch.queue.lock().unwrap_or_else(|p| p.into_inner()).missed
    }

    fn caught_up(&self) {
        self.watch.queue.lock().unwrap_or_else(|p| p.into_inner()).missed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::events::{Decoded, EventKind, Provider, decode};

    #[test]
    fn records_decode_as_s3_events_with_the_key_intact() {
        for key in ["a b+c%d/ü.txt", "dir/", "plain"] {
            let body = serde_json::json!({ "Records": [record("bkt", key, true)] }).to_string();
            let d = Delivery {
                ack_id: "1".into(),
                body: Bytes::from(body),
                attributes: Default::default(),
                receive_count: 1,
                sent_at_ms: None,
            };
            let Decoded::Events { events } = decode(Provider::S3, &d) else { panic!("{key}") };
            assert_eq!((events[0].bucket.as_str(), events[0].key.as_str()), ("bkt", key));
            assert_eq!(events[0].kind, EventKind::Created);
        }
    }
}
