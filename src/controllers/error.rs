//! Errors of the reconcilers, split into transient ones (retry with backoff) and permanent
//! ones (wait until the object changes).

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("API call failed: {0}")]
    Kube(#[source] kube::Error),
    #[error(
        "ledger {ledger} is unreadable ({reason}); delete it to rebuild it from the pool's IPAddresses"
    )]
    LedgerCorrupt { ledger: String, reason: String },
    #[error("ledger {ledger} kept changing under {attempts} attempts")]
    LedgerContention { ledger: String, attempts: usize },
    #[error("{0} has no namespace")]
    MissingNamespace(String),
}

impl Error {
    /// Stable, bounded label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::LedgerCorrupt { .. } => "ledger_corrupt",
            Error::LedgerContention { .. } => "ledger_contention",
            Error::MissingNamespace(_) => "missing_namespace",
        }
    }

    /// When to try again; `None` means wait for a change of the object.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Kube(_) | Error::LedgerContention { .. } => Some(Duration::from_secs(2)),
            Error::LedgerCorrupt { .. } => Some(Duration::from_secs(60)),
            Error::MissingNamespace(_) => None,
        }
    }
}
