//! Rate limits, each answered with a 429 that says when to come back (`Retry-After`):
//!
//! - `WriteLimits`: each token may make `per_minute` writes a minute, in bursts of up to
//!   `burst`. Keyed by the token (its hash), never by address: workers and CI runners share
//!   addresses, not tokens.
//! - `AddressLimits`: requests without a valid token, per client address (an IPv6 client by
//!   its /64, what one host is usually given), so that no one without a token can flood the
//!   hub; callers with a token are not limited by address.

use crate::error::AppError;
use axum::http::{header, HeaderValue, StatusCode};
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
            Err(not_until) => Err(too_many(
                not_until.wait_time_from(limiter.clock().now()),
                |secs| {
                    format!(
                    "token `{name}` made more than {} writes a minute (bursts of {}); retry after {secs} s (`Retry-After`), or ask the operator for a higher `--write-rate-per-minute`",
                    self.per_minute, self.burst
                )
                },
            )),
        }
    }
}

/// A 429 saying to come back after `wait` (whole seconds, at least 1).
fn too_many(wait: Duration, detail: impl FnOnce(u64) -> String) -> AppError {
    let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
    AppError::new(StatusCode::TOO_MANY_REQUESTS, detail(secs))
        .header(header::RETRY_AFTER, HeaderValue::from(secs))
}

type ByAddress = RateLimiter<IpAddr, DefaultKeyedStateStore<IpAddr>, DefaultClock>;

/// The limit on requests without a token, per client address.
pub struct AddressLimits {
    limiter: Option<ByAddress>,
    per_minute: u32,
    burst: u32,
    /// Checks made, to forget addresses whose budget is full again now and then.
    checks: AtomicU64,
}

/// Every this many checks, the addresses back to a full budget are forgotten (the table holds
/// only the addresses seen within about a minute).
const FORGET_EVERY: u64 = 4096;

impl AddressLimits {
    /// `per_minute` 0: no limit.
    pub fn new(per_minute: u32, burst: u32) -> AddressLimits {
        let limiter = NonZeroU32::new(per_minute).map(|rate| {
            let burst = NonZeroU32::new(burst).unwrap_or(rate);
            RateLimiter::keyed(Quota::per_minute(rate).allow_burst(burst))
        });
        AddressLimits {
            limiter,
            per_minute,
            burst,
            checks: AtomicU64::new(0),
        }
    }

    pub fn enabled(&self) -> bool {
        self.limiter.is_some()
    }

    /// Count one request without a token from `ip`.
    pub fn check(&self, ip: IpAddr) -> Result<(), AppError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        if self.checks.fetch_add(1, Ordering::Relaxed) % FORGET_EVERY == FORGET_EVERY - 1 {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        let key = client_key(ip);
        match limiter.check_key(&key) {
            Ok(()) => Ok(()),
            Err(not_until) => Err(too_many(
                not_until.wait_time_from(limiter.clock().now()),
                |secs| {
                    format!(
                    "this client address made more than {} requests a minute without a token (bursts of {}); retry after {secs} s (`Retry-After`), or send a token (`Authorization: Bearer <token>`): requests with a valid token are not limited by address (the operator sets this with `serve --anonymous-rate-per-minute`)",
                    self.per_minute, self.burst
                )
                },
            )),
        }
    }
}

/// The key of a client address: an IPv4 address (an IPv4-mapped IPv6 one too) as it is, an
/// IPv6 address by its /64.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
        v4 => v4,
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

    #[test]
    fn an_address_gets_its_burst_then_a_429_and_ipv6_counts_by_its_64() {
        let limits = AddressLimits::new(60, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        limits.check(a).unwrap();
        limits.check(a).unwrap();
        let e = limits.check(a).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.headers, [(header::RETRY_AFTER, HeaderValue::from(1u64))]);
        assert!(e.detail.contains("without a token"), "{}", e.detail);
        // The same address mapped into IPv6 is the same client; another address is not.
        assert!(limits.check("::ffff:192.0.2.1".parse().unwrap()).is_err());
        limits.check("192.0.2.2".parse().unwrap()).unwrap();
        // One /64 is one client.
        limits.check("2001:db8:0:1::1".parse().unwrap()).unwrap();
        limits.check("2001:db8:0:1::2".parse().unwrap()).unwrap();
        assert!(limits
            .check("2001:db8:0:1:ffff::9".parse().unwrap())
            .is_err());
        limits.check("2001:db8:0:2::1".parse().unwrap()).unwrap();
        assert!(!AddressLimits::new(0, 0).enabled());
    }
}
