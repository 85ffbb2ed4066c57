//! What the worker's slices measure, held until the next heartbeat carries it to the admin.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tidemark_core::jobs::Samples;
use tidemark_engine::slice::SliceObserver;

/// Samples kept per subscription between heartbeats; beyond it the oldest are dropped (a
/// histogram needs a representative sample, not every one).
const KEEP: usize = 5_000;

#[derive(Default, Debug)]
pub struct Collector {
    samples: Mutex<BTreeMap<String, Samples>>,
}

impl Collector {
    pub fn take(&self) -> Vec<Samples> {
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner())).into_values().collect()
    }
}

fn push_capped(v: &mut Vec<f64>, x: f64) {
    if v.len() >= KEEP {
        v.remove(0);
    }
    v.push(x);
}

impl SliceObserver for Collector {
    fn batch_applied(&self, fingerprint: &str, took: Duration, lags_ms: &[i64]) {
        let mut all = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let s = all
            .entry(fingerprint.to_string())
            .or_insert_with(|| Samples { fingerprint: fingerprint.to_string(), ..Default::default() });
        push_capped(&mut s.apply_batch_secs, took.as_secs_f64());
        for l in lags_ms {
            push_capped(&mut s.lag_secs, *l as f64 / 1000.0);
        }
    }
}
