//! Requests per hour, per subscription: the admin samples each subscription's request counters
//! on every detection pass and keeps an hour of samples, so the page can say what the last hour
//! (or as much of it as this admin has seen) asked of the bucket and the queue.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// How far back the rate looks.
pub const WINDOW_MS: i64 = 3_600_000;
/// Samples kept at least this far apart (an hour is about 60 of them).
pub const SPACING_MS: i64 = 60_000;
/// Less than this seen, and no rate is given (one slice's burst is not an hour's figure).
pub const LEAST_MS: i64 = 10_000;

type Counts = BTreeMap<String, u64>;

#[derive(Debug, Default)]
pub struct RequestRates {
    samples: HashMap<String, VecDeque<(i64, Counts)>>,
}

impl RequestRates {
    /// Records `fingerprint`'s counters at `now_ms`.
    pub fn record(&mut self, fingerprint: &str, now_ms: i64, counts: &Counts) {
        let q = self.samples.entry(fingerprint.to_string()).or_default();
        // A sample a minute at most (detection runs every second): the newest replaces the
        // last while that is within a minute of the one before it.
        if q.len() >= 2 && now_ms - q[q.len() - 2].0 < SPACING_MS {
            q.pop_back();
        }
        q.push_back((now_ms, counts.clone()));
        // Keep one sample at or before the window's start, for a whole hour's difference.
        while q.len() > 2 && q[1].0 <= now_ms - WINDOW_MS {
            q.pop_front();
        }
    }

    /// Forgets the subscriptions not in `live`.
    pub fn retain(&mut self, live: &[&str]) {
        self.samples.retain(|fp, _| live.contains(&fp.as_str()));
    }

    /// Requests per hour by operation over the samples kept (at most about an hour), and the
    /// span they cover in milliseconds; `None` before [`LEAST_MS`] were seen.
    pub fn per_hour(&self, fingerprint: &str) -> Option<(BTreeMap<String, f64>, i64)> {
        let q = self.samples.get(fingerprint)?;
        let ((t0, first), (t1, _)) = (q.front()?, q.back()?);
        let span = t1 - t0;
        if span < LEAST_MS {
            return None;
        }
        let hours = span as f64 / WINDOW_MS as f64;
        // The increases from sample to sample, as Prometheus's `increase` reads a counter: one
        // that went down (a status written afresh, a slice's last figures lost with its
        // worker) counts from zero again.
        let mut total: BTreeMap<String, u64> = first.keys().map(|op| (op.clone(), 0)).collect();
        for (a, b) in q.iter().zip(q.iter().skip(1)) {
            for (op, n) in &b.1 {
                let before = a.1.get(op).copied().unwrap_or(0);
                *total.entry(op.clone()).or_default() += if *n >= before { n - before } else { *n };
            }
        }
        Some((total.into_iter().map(|(op, n)| (op, n as f64 / hours)).collect(), span))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(list: u64, head: u64) -> Counts {
        [("LIST".to_string(), list), ("HEAD".to_string(), head)].into()
    }

    #[test]
    fn an_hour_of_samples_gives_the_hours_requests() {
        let mut r = RequestRates::default();
        r.record("a", 0, &counts(0, 0));
        assert!(r.per_hour("a").is_none(), "nothing seen yet");
        r.record("a", 5_000, &counts(1, 10));
        assert!(r.per_hour("a").is_none(), "5 s is not enough to say");
        // 30 minutes: 10 LISTs and 100 HEADs make 20 and 200 an hour.
        r.record("a", 1_800_000, &counts(10, 100));
        let (rate, span) = r.per_hour("a").unwrap();
        assert_eq!(span, 1_800_000);
        assert_eq!((rate["LIST"], rate["HEAD"]), (20.0, 200.0));
        // Two hours on, only the last hour counts.
        for (t, n) in [(3_600_000, 20), (5_400_000, 30), (7_200_000, 40)] {
            r.record("a", t, &counts(n, n * 10));
        }
        let (rate, span) = r.per_hour("a").unwrap();
        assert!((3_600_000..=5_400_000).contains(&span), "{span}");
        assert!(rate["LIST"] > 0.0 && rate["LIST"] <= 20.0, "{rate:?}");
        // A counter written afresh counts from zero again; subscriptions gone are forgotten.
        let mut fresh = RequestRates::default();
        for (t, n) in [(0, 100), (900_000, 110), (1_800_000, 5), (3_600_000, 25)] {
            fresh.record("b", t, &counts(n, 0));
        }
        assert_eq!(fresh.per_hour("b").unwrap().0["LIST"], 10.0 + 5.0 + 20.0);
        r.retain(&[]);
        assert!(r.per_hour("a").is_none());
    }
}
