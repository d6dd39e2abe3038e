//! Time as the API server tells it. Every timestamp one bitpool process writes for another to
//! judge (a reservation's age, the rebuild fence, a claim's deletion grace) is taken on this
//! clock, never on the machine's own: replicas whose clocks disagree still agree on the fence.
//!
//! Each response's `Date` header (whole seconds) brackets the server's clock: the server wrote
//! it between the request leaving and the response arriving, so the offset of the server's
//! clock from this machine's lies in `[date − received, date + 1 s − sent]`. The brackets of
//! successive responses are intersected, which narrows the offset to well under a second within
//! a few requests; a bracket that does not meet the others (a clock was stepped) starts over.

use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper::http;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tower::{Layer, Service};

/// How far this machine's clock may be from the API server's for this process to lead: the
/// leader lease (renewed and judged on each candidate's own clock) stays exclusive within it.
pub const MAX_SKEW: Duration = Duration::from_secs(2);
/// How far one process' idea of the server's time may be off: the bracket of one response is a
/// second wide plus the round trip, and a process keeps its bracket under this by intersecting.
pub const ALLOWANCE: Duration = Duration::from_secs(2);
/// A bracket is refreshed from new responses at least this often, so slow drift is followed.
const REFRESH: Duration = Duration::from_secs(60);

/// The offset of the server's clock from this machine's (server − local), as a bracket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offset {
    pub low: SignedDuration,
    pub high: SignedDuration,
}

impl Offset {
    /// The bracket one response gives: `date` as the server stamped it (whole seconds), and the
    /// local times the request left and its response arrived.
    pub fn of_response(date: Timestamp, sent: Timestamp, received: Timestamp) -> Self {
        Self {
            low: date.duration_since(received),
            high: (date + SignedDuration::from_secs(1)).duration_since(sent),
        }
    }

    /// The bracket both brackets allow, if they meet.
    pub fn intersect(self, other: Self) -> Option<Self> {
        let low = self.low.max(other.low);
        let high = self.high.min(other.high);
        (low <= high).then_some(Self { low, high })
    }

    /// The best single estimate: the middle of the bracket.
    pub fn estimate(self) -> SignedDuration {
        self.low + (self.high - self.low) / 2
    }

    /// The skew this bracket proves: how far the server's clock is from this machine's at the
    /// least (zero when the bracket contains zero).
    pub fn proven_skew(self) -> SignedDuration {
        if self.low > SignedDuration::ZERO {
            self.low
        } else if self.high < SignedDuration::ZERO {
            self.high
        } else {
            SignedDuration::ZERO
        }
    }
}

#[derive(Debug, Default)]
struct Estimate {
    offset: Option<Offset>,
    anchored: Option<Timestamp>,
}

impl Estimate {
    fn observe(&mut self, sample: Offset, at: Timestamp) {
        let fresh = self
            .anchored
            .is_some_and(|a| at.duration_since(a).unsigned_abs() < REFRESH);
        let narrowed = self
            .offset
            .filter(|_| fresh)
            .and_then(|o| o.intersect(sample));
        match narrowed {
            Some(offset) => self.offset = Some(offset),
            None => {
                self.offset = Some(sample);
                self.anchored = Some(at);
            }
        }
    }
}

static SERVER: Mutex<Estimate> = Mutex::new(Estimate {
    offset: None,
    anchored: None,
});

/// The API server's clock now, as this process best knows it (its own clock until a response
/// has been seen).
pub fn now() -> Timestamp {
    let offset = offset().map_or(SignedDuration::ZERO, Offset::estimate);
    Timestamp::now()
        .saturating_add(offset)
        .unwrap_or_else(|_| Timestamp::now())
}

/// The server's clock offset as measured so far.
pub fn offset() -> Option<Offset> {
    SERVER.lock().map_or(None, |e| e.offset)
}

/// Records one response's `Date` header.
fn observe(date: &http::HeaderValue, sent: Timestamp, received: Timestamp) {
    let Some(date) = date.to_str().ok().and_then(parse_http_date) else {
        return;
    };
    if let Ok(mut estimate) = SERVER.lock() {
        estimate.observe(Offset::of_response(date, sent, received), received);
    }
}

/// An HTTP date (`Wed, 02 Dec 2026 06:23:50 GMT`).
fn parse_http_date(text: &str) -> Option<Timestamp> {
    k8s_openapi::jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(text)
        .ok()
}

/// Says how this machine's clock differs from the server's, when it differs by more than
/// [`MAX_SKEW`] for certain.
pub fn skew_beyond_bound() -> Option<String> {
    let skew = offset()?.proven_skew();
    (skew.unsigned_abs() > MAX_SKEW).then(|| {
        let secs = skew.unsigned_abs().as_secs_f64();
        let way = if skew.is_negative() { "ahead of" } else { "behind" };
        format!(
            "this machine's clock is {secs:.1} s {way} the API server's (more than {} s): correct it (NTP)",
            MAX_SKEW.as_secs()
        )
    })
}

/// Measures the server's clock from the responses passing through (placed next to the wire).
#[derive(Clone, Copy, Debug, Default)]
pub struct ClockLayer;

impl<S> Layer<S> for ClockLayer {
    type Service = Clocked<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Clocked { inner }
    }
}

/// The service [`ClockLayer`] wraps: reads the server's `Date` from each response.
#[derive(Clone)]
pub struct Clocked<S> {
    inner: S,
}

impl<S, R, B> Service<R> for Clocked<S>
where
    S: Service<R, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let sent = Timestamp::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if let Some(date) = response.headers().get(http::header::DATE) {
                observe(date, sent, Timestamp::now());
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("test timestamp")
    }

    fn secs(s: f64) -> SignedDuration {
        SignedDuration::from_secs_f64(s)
    }

    #[test]
    fn an_http_date_is_read() {
        assert_eq!(
            parse_http_date("Wed, 02 Dec 2026 06:23:50 GMT"),
            Some(at("2026-12-02T06:23:50Z"))
        );
        assert_eq!(parse_http_date("yesterday"), None);
    }

    #[test]
    fn brackets_narrow_to_the_true_offset() {
        // The server runs 120.3 s behind; requests take 40 ms at different sub-second phases.
        let truth = secs(-120.3);
        let mut estimate = Estimate::default();
        for phase in [0.05, 0.35, 0.62, 0.91] {
            let sent = at("2026-12-02T06:00:00Z") + secs(phase);
            let served = sent + secs(0.02) + truth;
            let date = Timestamp::from_second(served.as_second()).expect("in range");
            let received = sent + secs(0.04);
            estimate.observe(Offset::of_response(date, sent, received), received);
        }
        let offset = estimate.offset.expect("measured");
        assert!(offset.low <= truth && truth <= offset.high, "{offset:?}");
        assert!(offset.high - offset.low < secs(0.4), "{offset:?}");
        assert!((offset.estimate() - truth).unsigned_abs() < Duration::from_millis(200));
    }

    #[test]
    fn a_stepped_clock_starts_a_new_bracket() {
        let mut estimate = Estimate::default();
        let sent = at("2026-12-02T06:00:00Z");
        let received = sent + secs(0.01);
        estimate.observe(Offset::of_response(sent, sent, received), received);
        // The server's clock was stepped 30 s ahead.
        let date = at("2026-12-02T06:00:31Z");
        let (sent, received) = (sent + secs(1.0), received + secs(1.0));
        estimate.observe(Offset::of_response(date, sent, received), received);
        let offset = estimate.offset.expect("measured");
        assert!(offset.low > secs(29.0), "{offset:?}");
    }

    #[test]
    fn only_a_proven_skew_counts() {
        let within = Offset {
            low: secs(-0.4),
            high: secs(0.6),
        };
        assert_eq!(within.proven_skew(), SignedDuration::ZERO);
        let ahead = Offset {
            low: secs(-120.5),
            high: secs(-119.5),
        };
        assert_eq!(ahead.proven_skew(), secs(-119.5));
        let behind = Offset {
            low: secs(59.5),
            high: secs(60.5),
        };
        assert_eq!(behind.proven_skew(), secs(59.5));
    }
}
