//! Coalescing across batches: what a slice remembers of the HEADs it made.
//!
//! A HEAD started at time *T* sees the bucket as it is at *T* or later. A notification is sent
//! after the change it reports, so one sent before *T* reports a change that HEAD already saw.
//! If the entry is still at the version the slice left after that HEAD, nothing has changed it
//! since, and the notification needs no new HEAD: the entry already reflects its change or a
//! later one. A change made after *T* has its own notification, sent after *T*, which is not
//! covered and is HEADed as always.
//!
//! The queue's send time and the HEAD's start come from two clocks, so a notification counts
//! as sent before the HEAD only when it was sent at least [`SKEW_MARGIN_MS`] earlier; one whose
//! queue does not say when it was sent never counts. The memory is the slice's (it ends with
//! the slice) and bounded: when it holds [`CAPACITY`] keys it starts again empty, which costs
//! HEADs, never correctness.

use std::collections::HashMap;
use std::sync::Mutex;

/// How far apart the queue's clock and this process's may be.
pub const SKEW_MARGIN_MS: i64 = 1_000;

/// The most keys remembered.
pub const CAPACITY: usize = 100_000;

/// When a key was last HEADed and the entry version that left (`None`: no entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    head_at_ms: i64,
    version: Option<u64>,
}

/// The HEADs a slice made, per key.
#[derive(Debug, Default)]
pub struct RecentHeads {
    seen: Mutex<HashMap<String, Seen>>,
}

impl RecentHeads {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether notifications of `key` all sent by `sent_by_ms` (the latest of them; `None`: a
    /// queue that does not say) need no HEAD, the entry being at `version` now.
    pub fn covers(&self, key: &str, sent_by_ms: Option<i64>, version: Option<u64>) -> bool {
        let Some(sent) = sent_by_ms else { return false };
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(key).is_some_and(|s| sent < s.head_at_ms.saturating_sub(SKEW_MARGIN_MS) && s.version == version)
    }

    /// Records that a HEAD of `key` started at `head_at_ms` and its apply left the entry at
    /// `version`.
    pub fn remember(&self, key: &str, head_at_ms: i64, version: Option<u64>) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= CAPACITY && !seen.contains_key(key) {
            seen.clear();
        }
        let new = Seen { head_at_ms, version };
        match seen.get_mut(key) {
            // HEADs of one key may finish out of order across batches; the later start wins.
            Some(s) if s.head_at_ms > head_at_ms => {}
            Some(s) => *s = new,
            None => {
                seen.insert(key.to_string(), new);
            }
        }
    }

    /// Forgets `key` (its apply failed or its outcome is unknown).
    pub fn forget(&self, key: &str) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    pub fn len(&self) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_notifications_sent_well_before_the_head_and_an_unchanged_entry_are_covered() {
        let r = RecentHeads::new();
        r.remember("k", 10_000, Some(7));
        assert!(r.covers("k", Some(8_999), Some(7)), "sent more than the margin before the HEAD");
        assert!(!r.covers("k", Some(9_000), Some(7)), "within the margin: the clocks may disagree");
        assert!(!r.covers("k", Some(12_000), Some(7)), "sent after the HEAD: a change it did not see");
        assert!(!r.covers("k", None, Some(7)), "a queue that does not say when it sent");
        assert!(!r.covers("k", Some(1), Some(8)), "the entry changed since");
        assert!(!r.covers("k", Some(1), None), "the entry is gone since");
        assert!(!r.covers("other", Some(1), Some(7)), "never HEADed");
        r.remember("gone", 10_000, None);
        assert!(r.covers("gone", Some(1), None), "an absent entry left absent");
        r.forget("k");
        assert!(!r.covers("k", Some(1), Some(7)));
    }

    #[test]
    fn the_later_head_wins_and_the_memory_stays_bounded() {
        let r = RecentHeads::new();
        r.remember("k", 20_000, Some(9));
        r.remember("k", 10_000, Some(7)); // finished later, started earlier
        assert!(r.covers("k", Some(15_000), Some(9)));
        for i in 0..CAPACITY + 10 {
            r.remember(&format!("k{i}"), 1, None);
        }
        assert!(r.len() <= CAPACITY);
    }
}
