//! Errors of the reconcilers, split into transient ones (the cluster will get better by itself:
//! retry soon) and permanent ones (a person must change something: back off, and let a watch
//! event of the object wake it at once).

use std::time::Duration;

use crate::client::deadline::DeadlineExceeded;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("API call failed: {0}")]
    Kube(#[source] kube::Error),
    #[error("the ledger namespace {0} does not exist; creating it")]
    LedgerNamespaceMissing(String),
    #[error("ledger {ledger} kept changing under {attempts} attempts")]
    LedgerContention { ledger: String, attempts: usize },
    #[error("{0} has no namespace")]
    MissingNamespace(String),
}

/// How an error is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Conflicts, timeouts, throttling, server errors, lost connections: soon.
    Transient,
    /// Forbidden, invalid, not found: exponential backoff up to a cap.
    Permanent,
    /// Nothing but a change of the object can help.
    OnChange,
}

impl Error {
    /// Stable, bounded label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) => match s.code {
                403 => "forbidden",
                404 => "not_found",
                409 => "conflict",
                422 | 400 => "invalid",
                429 => "throttled",
                500..=599 => "server_error",
                _ => "api_error",
            },
            Error::Kube(kube::Error::Service(e)) if e.is::<DeadlineExceeded>() => "deadline",
            Error::Kube(_) => "connection",
            Error::LedgerNamespaceMissing(_) => "ledger_namespace_missing",
            Error::LedgerContention { .. } => "ledger_contention",
            Error::MissingNamespace(_) => "missing_namespace",
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            Error::Kube(kube::Error::Api(s)) => match s.code {
                409 | 429 | 500..=599 => Retry::Transient,
                _ => Retry::Permanent,
            },
            Error::Kube(_) | Error::LedgerContention { .. } | Error::LedgerNamespaceMissing(_) => {
                Retry::Transient
            }
            Error::MissingNamespace(_) => Retry::OnChange,
        }
    }
}

/// The delay before the `failures`-th consecutive retry (1-based) of an error retried `retry`.
pub fn backoff(retry: Retry, failures: u32) -> Option<Duration> {
    let (first, cap) = match retry {
        Retry::Transient => (Duration::from_millis(250), Duration::from_secs(10)),
        Retry::Permanent => (Duration::from_secs(2), Duration::from_secs(300)),
        Retry::OnChange => return None,
    };
    let doublings = failures.saturating_sub(1).min(16);
    Some(first.saturating_mul(1 << doublings).min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        Error::Kube(kube::Error::Api(Box::new(
            kube::core::Status::failure("test", "Test").with_code(code),
        )))
    }

    #[test]
    fn errors_that_wait_for_a_person_back_off_and_transient_ones_retry_soon() {
        assert_eq!(api(409).retry(), Retry::Transient);
        assert_eq!(api(503).retry(), Retry::Transient);
        assert_eq!(api(403).retry(), Retry::Permanent);
        assert_eq!(api(422).retry(), Retry::Permanent);
        assert_eq!(Error::MissingNamespace("x".into()).retry(), Retry::OnChange);
        let permanent: Vec<_> = (1..=10)
            .map(|n| backoff(Retry::Permanent, n).expect("retried"))
            .collect();
        assert_eq!(permanent[0], Duration::from_secs(2));
        assert_eq!(permanent[1], Duration::from_secs(4));
        assert!(permanent.windows(2).all(|w| w[0] <= w[1]), "never shrinks");
        assert_eq!(permanent[9], Duration::from_secs(300), "capped");
        assert_eq!(
            backoff(Retry::Transient, 1),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            backoff(Retry::Transient, 100),
            Some(Duration::from_secs(10))
        );
        assert_eq!(backoff(Retry::OnChange, 3), None);
    }
}
