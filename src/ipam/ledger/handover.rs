//! A pool's ledger as it travels on the pool for `clusterctl move` (see [`crate::ipam::moving`]):
//! written from the ledger, kept covering every address the ledger gains, and the ledger a copy
//! starts from.

use k8s_openapi::ByteString;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use super::record::Ledger;
use super::store::{Loaded, ensure_namespace, ledger_of};
use crate::alloc::set::AddressSet;
use crate::api::clusterctl::{BLOCK_MOVE_ANNOTATION, HANDOVER_ANNOTATION};
use crate::ipam::Context;
use crate::ipam::dialect::PoolDialect;
use crate::runtime::error::Error;
use crate::runtime::objects;

/// The most a hand-over may take: the API server allows 256 KiB of annotations in all.
pub const MAX_HANDOVER_BYTES: usize = 192 * 1024;

/// A pool's ledger, as it travels on the pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// The UID of the pool the ledger was written for: a pool with another UID is a copy.
    pub pool_uid: String,
    /// The ledger's bitmaps, as the ledger stores them.
    pub ipv4: ByteString,
    pub ipv6: ByteString,
    /// The Clusters of the namespace, paused for the move.
    pub clusters: Vec<String>,
}

impl Handover {
    /// The hand-over of `ledger`, written for the pool `pool_uid` and the paused `clusters`.
    pub fn of(ledger: &Ledger, pool_uid: &str, clusters: Vec<String>) -> Self {
        Self {
            pool_uid: pool_uid.to_string(),
            ipv4: ByteString(ledger.v4.to_bytes()),
            ipv6: ByteString(ledger.v6.to_bytes()),
            clusters,
        }
    }

    /// The hand-over as its annotation holds it, or how large it would be when it exceeds
    /// [`MAX_HANDOVER_BYTES`].
    pub fn encoded(&self) -> Result<String, usize> {
        // Strings and bytes always serialize.
        let text = serde_json::to_string(self).unwrap_or_default();
        match text.len() > MAX_HANDOVER_BYTES {
            true => Err(text.len()),
            false => Ok(text),
        }
    }

    /// The ledger it carries: every address allocated at the hand-over, none reserved.
    pub fn ledger(&self) -> Result<Ledger, String> {
        let decode = |bytes: &ByteString, family: &str| {
            AddressSet::from_bytes(&bytes.0).map_err(|e| format!("{family}: {e}"))
        };
        Ok(Ledger {
            v4: decode(&self.ipv4, "ipv4")?,
            v6: decode(&self.ipv6, "ipv6")?,
            ..Ledger::default()
        })
    }

    /// The hand-over a pool carries, if it was written for this very pool (not a copy's).
    pub fn on<P: PoolDialect>(pool: &P) -> Option<Self> {
        let text = pool.meta().annotations.as_ref()?.get(HANDOVER_ANNOTATION)?;
        serde_json::from_str::<Handover>(text)
            .ok()
            .filter(|h| Some(&h.pool_uid) == pool.meta().uid.as_ref())
    }
}

/// Before a ledger write that adds addresses to a pool handed over here, the hand-over takes
/// them: it must hold every address the ledger holds, whenever clusterctl copies the pool. (What
/// it holds beyond, released meanwhile, a copy frees once its move is over.) Pools not handed
/// over cost a look at one annotation.
pub async fn cover<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    before: &Ledger,
    next: &Ledger,
) -> Result<(), Error> {
    let Some(mut handover) = Handover::on(pool) else {
        return Ok(());
    };
    let mut added = next.addresses().filter(|a| !before.contains(*a)).peekable();
    if added.peek().is_none() {
        return Ok(());
    }
    let mut covered = handover.ledger().unwrap_or_default();
    for address in next.addresses() {
        covered.insert(address);
    }
    handover.ipv4 = ByteString(covered.v4.to_bytes());
    handover.ipv6 = ByteString(covered.v6.to_bytes());
    let changes = match handover.encoded() {
        Ok(text) => serde_json::json!({ HANDOVER_ANNOTATION: text }),
        // Too large to travel: the move is blocked again, and says so in the log.
        Err(bytes) => {
            tracing::warn!(pool = %pool.key().describe(), bytes, "the pool's ledger grew too large to travel with it; blocking clusterctl move again");
            serde_json::json!({BLOCK_MOVE_ANNOTATION: "", HANDOVER_ANNOTATION: null})
        }
    };
    annotate(pool, ctx, changes).await
}

/// Creates a copied pool's ledger from its hand-over (once: a ledger already there is this
/// pool's, written by an earlier reconcile).
pub async fn arrive<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    handover: &Handover,
) -> Result<(), Error> {
    let ledger_ref = ledger_of(pool, ctx);
    let ledger = match handover.ledger() {
        Ok(ledger) => ledger,
        // The engine rebuilds it from the address objects, fenced (the pool carries its mark).
        Err(reason) => {
            tracing::warn!(pool = %pool.key().describe(), %reason, "the ledger handed over with the pool cannot be read");
            return Ok(());
        }
    };
    let written = match ledger_ref.load().await? {
        Loaded::Found(_) => return Ok(()),
        Loaded::Missing => match ledger_ref.create(&ledger).await {
            Err(Error::LedgerNamespaceMissing(ns)) => {
                ensure_namespace(&ctx.client, &ns).await?;
                ledger_ref.create(&ledger).await?
            }
            other => other?,
        },
        Loaded::Untrusted {
            resource_version, ..
        } => {
            ledger_ref
                .replace(resource_version.as_deref(), &ledger)
                .await?
        }
    };
    match written {
        Some(_) => Ok(()),
        None => Err(Error::LedgerContention {
            ledger: ledger_ref.describe(),
            attempts: 1,
        }),
    }
}

/// Merge-patches the pool's annotations (`null` removes one).
pub async fn annotate<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    changes: serde_json::Value,
) -> Result<(), Error> {
    let patch = serde_json::json!({"metadata": {"annotations": changes}});
    objects::merge_patch(&pool.api_for(ctx.client.clone()), &pool.name_any(), patch).await
}
