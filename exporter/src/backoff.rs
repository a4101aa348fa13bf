//! Retry delays: exponential with jitter (backon), so that the agents of a whole cluster do not
//! retry the API server or a rate-limited kubelet in lockstep.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};

/// An endless exponential backoff between `min` and `max`, with jitter, that can be reset after
/// a success.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    current: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    /// Delays start at `min` and double up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        let max = max.max(min);
        let builder = ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            current: builder.build(),
            builder,
            max,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        // Jitter may add up to one more step; never exceed twice the cap.
        self.current.next().unwrap_or(self.max).min(self.max * 2)
    }

    /// Starts over from the minimum.
    pub fn reset(&mut self) {
        self.current = self.builder.build();
    }
}

/// `base` plus a random extra of up to `base`.
pub fn jittered(base: Duration) -> Duration {
    base + base.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_resets() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        let mut b = Backoff::new(min, max);
        let first = b.next_delay();
        assert!(first >= min && first < min * 3, "{first:?}");
        let late: Vec<_> = (0..20).map(|_| b.next_delay()).collect();
        assert!(late.iter().all(|d| *d <= max * 2));
        assert!(late.iter().rev().take(5).all(|d| *d >= max), "{late:?}");
        b.reset();
        assert!(b.next_delay() < min * 3);
    }

    #[test]
    fn jitter_stays_within_one_base() {
        let base = Duration::from_millis(200);
        for _ in 0..100 {
            let d = jittered(base);
            assert!(d >= base && d <= base * 2);
        }
    }
}
