//! What an operator asks of a running installation — `bitpool pools`, `who-has`, `explain` and
//! `check`, also `kubectl bitpool …` — answered from one read of the cluster ([`Snapshot`]) by
//! pure functions of it. Nothing here writes to the cluster.

pub mod check;
pub mod explain;
#[cfg(test)]
mod fixtures;
pub mod pools;
pub mod snapshot;
pub mod table;
pub mod who_has;

pub use snapshot::{AnyPool, ReadError, Scope, Snapshot};

use crate::api::capi::IPAddressClaim;

/// Whether a Cluster API claim is served: its Ready condition is True.
pub fn claim_served(claim: &IPAddressClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}
