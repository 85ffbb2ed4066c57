//! Prometheus `/metrics`: the per-subscription counters (read from the status blobs on each
//! detection pass), slice durations by outcome, and the apply-batch latency and event-to-apply
//! lag histograms (from the samples workers send with their heartbeats).

use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use tidemark_core::jobs::{REMOTE_EVENTS, Samples};
use tidemark_engine::apply::Counters;
use tidemark_engine::slice::SliceState;

use crate::scheduler::Scheduler;
use crate::snapshot::Snapshot;

type Labels = Vec<(String, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

fn slice_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.5, 2.0, 12))
}
fn batch_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}
fn lag_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    slice_duration: Histograms,
    apply_batch: Histograms,
    lag: Histograms,
}

#[derive(Debug)]
struct Live {
    snapshot: Arc<RwLock<Snapshot>>,
    scheduler: Arc<Mutex<Scheduler>>,
}

/// A label value as the text format must carry it: prometheus-client writes values verbatim, and
/// a directory name may hold `"`, `\\` or a newline, which would end the value early and forge
/// series (or break the scrape).
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A per-subscription counter: its name, help, and where it is in the status blob's counters.
type CounterDef = (&'static str, &'static str, fn(&Counters) -> u64);

const COUNTERS: &[CounterDef] = &[
    ("tidemark_events_received", "Deliveries received from the subscription's queue, redeliveries included.", |c| {
        c.received
    }),
    ("tidemark_events_applied", "Deliveries handled successfully and acknowledged.", |c| c.applied),
    ("tidemark_events_failed", "Deliveries whose handling failed (they redeliver).", |c| c.failed),
    ("tidemark_events_echo_suppressed", "Keys skipped as the echo of this cluster's own upload.", |c| {
        c.echo_suppressed
    }),
    (
        "tidemark_events_shadowed",
        "Keys refused because a file or directory stands where their path would be (brought in once it goes).",
        |c| c.shadowed,
    ),
    ("tidemark_events_ignored", "Deliveries or events that needed nothing (test events, other prefixes, ...).", |c| {
        c.ignored
    }),
    ("tidemark_entries_changed", "Entries created, updated or deleted by applied events.", |c| c.changes),
    (
        "tidemark_events_heads_saved",
        "Keys whose notifications an earlier HEAD of the slice had already answered (no HEAD made).",
        |c| c.heads_saved,
    ),
];

impl Collector for Live {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snap = self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone();
        let labels =
            |dir: &str, fp: &str| -> Labels { vec![("dir".into(), label(dir)), ("fingerprint".into(), label(fp))] };
        for (name, help, get) in COUNTERS {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for v in &snap.subscriptions {
                let c = v.status.as_ref().map(|s| s.counters.clone()).unwrap_or_default();
                ConstCounter::new(get(&c)).encode(m.encode_family(&labels(&v.doc.dir, &v.doc.fingerprint))?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "tidemark_remote_requests",
            "Requests the subscription's slices made of its bucket, by operation (HEAD, LIST, GET, ...).",
            None,
            MetricType::Counter,
        )?;
        for v in &snap.subscriptions {
            let Some(status) = &v.status else { continue };
            for (op, n) in &status.counters.requests {
                let mut l = labels(&v.doc.dir, &v.doc.fingerprint);
                l.push(("op".into(), label(op)));
                ConstCounter::new(*n).encode(m.encode_family(&l)?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "tidemark_subscription_state",
            "1 for the state the subscription's last status blob records (idle, reconciling, tailing, errored).",
            None,
            MetricType::Gauge,
        )?;
        for v in &snap.subscriptions {
            let state = v.status.as_ref().map_or(SliceState::Idle, |s| s.state);
            for s in [SliceState::Idle, SliceState::Reconciling, SliceState::Tailing, SliceState::Errored] {
                let mut l = labels(&v.doc.dir, &v.doc.fingerprint);
                l.push(("state".into(), crate::ui::state_name(s).into()));
                ConstGauge::new(i64::from(s == state)).encode(m.encode_family(&l)?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "tidemark_events_dead_lettered",
            "Messages waiting in the subscription's dead-letter queue (received too often without being applied).",
            None,
            MetricType::Gauge,
        )?;
        for v in &snap.subscriptions {
            if let Some(n) = v.status.as_ref().and_then(|s| s.dead_lettered) {
                ConstGauge::new(n as i64).encode(m.encode_family(&labels(&v.doc.dir, &v.doc.fingerprint))?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "tidemark_event_lag_max_seconds",
            "The largest event-to-apply lag the subscription has seen.",
            None,
            MetricType::Gauge,
        )?;
        for v in &snap.subscriptions {
            let lag = v.status.as_ref().and_then(|s| s.counters.max_lag_ms).unwrap_or(0) as f64 / 1000.0;
            ConstGauge::new(lag).encode(m.encode_family(&labels(&v.doc.dir, &v.doc.fingerprint))?)?;
        }
        let (workers, running, enabled) = {
            let s = self.scheduler.lock().unwrap_or_else(|p| p.into_inner());
            (s.workers().len() as i64, s.running_jobs() as i64, s.enabled())
        };
        let m = enc.encode_descriptor(
            "tidemark_workers",
            "Workers registered and heart-beating.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(workers).encode(m)?;
        let m = enc.encode_descriptor(
            "tidemark_slices_running",
            "Slices assigned to workers now.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(running).encode(m)?;
        let mut m = enc.encode_descriptor(
            "tidemark_job_type_enabled",
            "1 when the job type is enabled on the Job types page.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(enabled))
            .encode(m.encode_family(&vec![("job_type".to_string(), REMOTE_EVENTS.to_string())])?)?;
        Ok(())
    }
}

impl Metrics {
    pub fn new(snapshot: Arc<RwLock<Snapshot>>, scheduler: Arc<Mutex<Scheduler>>) -> Self {
        // The registry ends each help text with a period itself (the collector's are as written).
        let mut registry = Registry::default();
        let slice_duration: Histograms = Family::new_with_constructor(slice_buckets);
        let apply_batch: Histograms = Family::new_with_constructor(batch_buckets);
        let lag: Histograms = Family::new_with_constructor(lag_buckets);
        registry.register(
            "tidemark_slice_duration_seconds",
            "How long slices ran, by how they ended",
            slice_duration.clone(),
        );
        registry.register(
            "tidemark_apply_batch_duration_seconds",
            "Wall time to apply one batch of deliveries (HEADs, conditional writes, acks)",
            apply_batch.clone(),
        );
        registry.register(
            "tidemark_event_apply_lag_seconds",
            "From the event's time (the provider's clock) to the applied write",
            lag.clone(),
        );
        registry.register_collector(Box::new(Live { snapshot, scheduler }));
        Metrics { registry, slice_duration, apply_batch, lag }
    }

    pub fn slice_ended(&self, outcome: &str, secs: f64) {
        self.slice_duration.get_or_create(&vec![("outcome".to_string(), label(outcome))]).observe(secs);
    }

    pub fn samples(&self, dir_of: impl Fn(&str) -> Option<String>, samples: &[Samples]) {
        for s in samples {
            let dir = dir_of(&s.fingerprint).unwrap_or_default();
            let l: Labels = vec![("dir".into(), label(&dir)), ("fingerprint".into(), label(&s.fingerprint))];
            let batch = self.apply_batch.get_or_create(&l);
            for x in &s.apply_batch_secs {
                batch.observe(*x);
            }
            let lag = self.lag.get_or_create(&l);
            for x in &s.lag_secs {
                lag.observe(*x);
            }
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding /metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_cannot_end_early_or_forge_a_series() {
        let m = Metrics::new(Default::default(), Arc::new(Mutex::new(Scheduler::new(Default::default()))));
        let hostile = "/mnt/a\"} 1\ntidemark_forged{x=\"\\";
        m.samples(
            |_| Some(hostile.to_string()),
            &[Samples { fingerprint: "fp\"\n".into(), lag_secs: vec![0.5], ..Default::default() }],
        );
        let text = m.render();
        assert!(!text.lines().any(|l| l.starts_with("tidemark_forged")), "{text}");
        assert!(text.contains(r#"dir="/mnt/a\"} 1\ntidemark_forged{x=\"\\""#), "{text}");
        assert!(text.contains(r#"fingerprint="fp\"\n""#), "{text}");
    }
}
