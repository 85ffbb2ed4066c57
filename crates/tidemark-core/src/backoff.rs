//! Exponential backoff, as pure arithmetic: callers own the clock and the sleeping.

use std::time::Duration;

/// Delays that double after each consecutive failure, from `base` up to `max`; a success resets.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff { base, max, failures: 0 }
    }

    /// Records a failure and returns how long to wait before the next attempt.
    pub fn fail(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.current()
    }

    pub fn succeed(&mut self) {
        self.failures = 0;
    }

    /// The wait the last failure asked for (zero after a success).
    pub fn current(&self) -> Duration {
        if self.failures == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32.checked_shl(self.failures - 1).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// The breaks of a stream that is resumed where it broke (a download from a bucket, a read from
/// the filer): each break waits as a [`Backoff`] from `base` says, and at most `limit` come in
/// a row — a break is in a row with the one before unless [`Resumes::PROGRESS`] bytes arrived
/// between them, so a stream that keeps bringing bytes is resumed as often as it breaks.
#[derive(Debug, Clone)]
pub struct Resumes {
    backoff: Backoff,
    limit: u32,
    since: u64,
}

impl Resumes {
    pub const PROGRESS: u64 = 64 << 10;

    pub fn new(base: Duration, limit: u32) -> Self {
        Resumes { backoff: Backoff::new(base, Duration::from_secs(10)), limit, since: 0 }
    }

    /// `n` bytes arrived.
    pub fn got(&mut self, n: u64) {
        self.since = self.since.saturating_add(n);
        if self.since >= Self::PROGRESS {
            self.backoff.succeed();
        }
    }

    /// A break: how long to wait before resuming, or `None` once `limit` breaks came in a row.
    pub fn broke(&mut self) -> Option<Duration> {
        if self.backoff.failures() >= self.limit {
            return None;
        }
        self.since = 0;
        Some(self.backoff.fail())
    }

    /// The resumes in a row so far.
    pub fn in_a_row(&self) -> u32 {
        self.backoff.failures()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resumes_wait_longer_in_a_row_and_start_over_after_progress() {
        let mut r = Resumes::new(Duration::from_millis(100), 3);
        let waits: Vec<Option<u128>> = (0..4).map(|_| r.broke().map(|d| d.as_millis())).collect();
        assert_eq!(waits, [Some(100), Some(200), Some(400), None], "three in a row, then given up");
        let mut r = Resumes::new(Duration::from_millis(100), 3);
        for _ in 0..10 {
            assert_eq!(r.broke(), Some(Duration::from_millis(100)), "progress between breaks: never given up");
            r.got(Resumes::PROGRESS);
        }
        let mut waits = Vec::new();
        for _ in 0..3 {
            waits.push(r.broke().map(|d| d.as_millis()));
            r.got(Resumes::PROGRESS - 1);
        }
        assert_eq!(waits, [Some(100), Some(200), Some(400)], "less than PROGRESS between: in a row");
        assert_eq!((r.broke(), r.in_a_row()), (None, 3));
    }

    #[test]
    fn doubles_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
        assert_eq!(b.current(), Duration::ZERO);
        let waits: Vec<u128> = (0..10).map(|_| b.fail().as_millis()).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]);
        for _ in 0..100 {
            b.fail();
        }
        assert_eq!(b.current(), Duration::from_secs(60));
        b.succeed();
        assert_eq!(b.current(), Duration::ZERO);
    }
}
