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

#[cfg(test)]
mod tests {
    use super::*;

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
