//! Per-token limits on writes: each token may make `per_minute` writes a minute, in bursts of
//! up to `burst`; beyond that a 429 says when to come back (`Retry-After`). Keyed by the token
//! (its hash), never by address: workers and CI runners share addresses, not tokens.

use crate::error::AppError;
use axum::http::{header, HeaderValue, StatusCode};
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use std::num::NonZeroU32;

type Keyed = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

pub struct WriteLimits {
    limiter: Option<Keyed>,
    per_minute: u32,
    burst: u32,
}

impl WriteLimits {
    /// `per_minute` 0: no limit.
    pub fn new(per_minute: u32, burst: u32) -> WriteLimits {
        let limiter = NonZeroU32::new(per_minute).map(|rate| {
            let burst = NonZeroU32::new(burst).unwrap_or(rate);
            RateLimiter::keyed(Quota::per_minute(rate).allow_burst(burst))
        });
        WriteLimits {
            limiter,
            per_minute,
            burst,
        }
    }

    /// Count one write by `token` (already authenticated: only valid tokens take a slot, so
    /// the table holds at most one entry per issued token).
    pub fn check(&self, token: &str, name: &str) -> Result<(), AppError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        let key = kernel_store::hash_token(token);
        match limiter.check_key(&key) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(limiter.clock().now());
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                let secs = secs.max(1);
                Err(AppError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "token `{name}` made more than {} writes a minute (bursts of {}); retry after {secs} s (`Retry-After`), or ask the operator for a higher `--write-rate-per-minute`",
                        self.per_minute, self.burst
                    ),
                )
                .header(header::RETRY_AFTER, HeaderValue::from(secs)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_gets_its_burst_then_a_429_with_retry_after() {
        let limits = WriteLimits::new(60, 3);
        for _ in 0..3 {
            limits.check("kz_a", "a").unwrap();
        }
        let e = limits.check("kz_a", "a").unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.headers, [(header::RETRY_AFTER, HeaderValue::from(1u64))]);
        assert!(e.detail.contains("token `a`"), "{}", e.detail);
        // Another token has its own budget.
        limits.check("kz_b", "b").unwrap();
        // 0 is no limit.
        let none = WriteLimits::new(0, 0);
        for _ in 0..1000 {
            none.check("kz_a", "a").unwrap();
        }
    }
}
