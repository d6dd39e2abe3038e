//! Reading, rebuilding and committing a pool's ledger.
//!
//! A ledger that is missing, unreadable or written for an earlier pool is rebuilt from the pool's
//! live address objects, read from the server. What was in flight is not in those objects, so a
//! rebuilt ledger is fenced ([`super::REBUILD_FENCE`]) unless no reservation was ever made in the
//! pool: the pool carries [`LEDGER_ANNOTATION`] from before its first reservation.

use std::sync::Arc;

use kube::ResourceExt;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::handover;
use super::intent::{self, Intent};
use super::memory::Stored;
use super::record::Ledger;
use super::store::{LedgerRef, Loaded, ensure_namespace};
use crate::alloc::AddressSpace;
use crate::ipam::context::{CachedSpace, Context};
use crate::ipam::dialect::{Outcomes, PoolDialect, Usage, fresh_pool_addresses};
use crate::ipam::key::PoolKey;
use crate::ipam::spec::Base;
use crate::runtime::error::{Call, Error, Verb};
use crate::runtime::objects;

/// Set on a pool before its first reservation: a pool that has it and no ledger has lost its
/// record.
pub const LEDGER_ANNOTATION: &str = "ipam.bitpool.dev/ledger";
/// Ledger writes attempted before a reconcile gives up and retries later.
const LEDGER_ATTEMPTS: usize = 8;

/// Whether a reservation may ever have been made in the pool's ledger: the pool carries
/// [`LEDGER_ANNOTATION`] (read from the server, not a cache).
async fn ever_reserved<P: PoolDialect>(pool: &P, ctx: &Context) -> Result<bool, Error> {
    let api = pool.api_for(ctx.client.clone());
    let name = pool.name_any();
    let current = api.get(&name).await.call(Verb::Get, &api, &name)?;
    Ok(current.annotations().contains_key(LEDGER_ANNOTATION))
}

/// Marks the pool before its first reservation, so that a ledger lost after it is rebuilt with a
/// fence, and a pool that never reserved anything starts at once (also when two processes race
/// to create its first ledger).
async fn mark_before_reserving<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    ledger_ref: &LedgerRef,
) -> Result<(), Error> {
    if pool.annotations().contains_key(LEDGER_ANNOTATION) {
        return Ok(());
    }
    let api = pool.api_for(ctx.client.clone());
    let patch = serde_json::json!({ "metadata": { "annotations": {
        LEDGER_ANNOTATION: format!("{}/{}", ledger_ref.namespace, ledger_ref.name)
    } } });
    objects::merge_patch(&api, &pool.name_any(), patch).await
}

/// A ledger rebuilt from the pool's live address objects, fenced when the record was lost.
///
/// A lost record is rebuilt from a fresh list: another process may have just created objects
/// for its reservations. A pool that never reserved is seeded from the synced cache instead:
/// no bitpool process creates an address object before the pool carries its mark, which was
/// just read from the server, so what there is to adopt was written by another provider before
/// (the one bitpool replaces), and a list would add nothing. One list per new pool would cost
/// a read of every address object in the namespace, per pool. The cache does not reach what a
/// cluster-scoped pool holds outside the namespace this process is limited to, nor anything
/// before its initial list has arrived (a pool served while it is listed): a list does.
async fn rebuild<P: PoolDialect>(
    pool: &P,
    ctx: &Context,
    lost: Option<String>,
) -> Result<Ledger, Error> {
    let beyond_cache = (pool.key().namespace.is_none() && ctx.settings.namespace.is_some())
        || !P::addresses_listed(ctx);
    let existing = match lost {
        None if !beyond_cache => pool.addresses(ctx, None),
        _ => fresh_pool_addresses(pool, ctx).await?,
    };
    let mut ledger = Ledger::from_addresses(existing.iter().filter_map(|a| pool.held(a)));
    if let Some(because) = lost {
        tracing::warn!(
            pool = %pool.key().describe(),
            addresses = existing.len(),
            reason = %because,
            "rebuilding the pool's ledger from its address objects; no new address until the rebuild fence ends"
        );
        ledger.fence(&objects::now().0.to_string(), because);
        ctx.ops.metrics.ledger_rebuilt(P::KIND.as_str());
    }
    Ok(ledger)
}

/// Reads the ledger, creating or rebuilding it when it is missing or cannot be trusted; `None`
/// for a missing ledger when `create` is false (a pool being deleted needs no new ledger).
pub async fn load<P: PoolDialect>(
    ledger_ref: &LedgerRef,
    pool: &P,
    ctx: &Context,
    create: bool,
) -> Result<Option<Stored>, Error> {
    for _ in 0..LEDGER_ATTEMPTS {
        let written = match ledger_ref.load().await? {
            Loaded::Found(stored) => return Ok(Some(stored)),
            Loaded::Missing if !create => return Ok(None),
            Loaded::Missing => {
                let reserved = ever_reserved(pool, ctx).await?;
                // A pool is marked only after its first ledger was created: one found now was
                // created by a process racing this one since the read above, not lost.
                if reserved && !matches!(ledger_ref.load().await?, Loaded::Missing) {
                    continue;
                }
                let lost = reserved.then(|| format!("{} was missing", ledger_ref.describe()));
                // A pool never marked has no object a bitpool process made: its first record
                // is whole, and says so in its first write.
                let whole = lost.is_none();
                let ledger = rebuild(pool, ctx, lost).await?;
                match ledger_ref.create(&ledger).await {
                    Err(Error::LedgerNamespaceMissing(ns)) => {
                        ensure_namespace(&ctx.client, &ns).await?;
                        None
                    }
                    other => other?.map(|mut stored| {
                        if whole {
                            stored.ledger.written_to = stored.ledger.uid.clone();
                        }
                        stored
                    }),
                }
            }
            Loaded::Untrusted {
                reason,
                resource_version,
            } => {
                let because = format!("{} could not be trusted: {reason}", ledger_ref.describe());
                let ledger = rebuild(pool, ctx, Some(because)).await?;
                ledger_ref
                    .replace(resource_version.as_deref(), &ledger)
                    .await?
            }
        };
        if let Some(stored) = written {
            return Ok(Some(stored));
        }
    }
    Err(Error::LedgerContention {
        ledger: ledger_ref.describe(),
        attempts: LEDGER_ATTEMPTS,
    })
}

/// What a commit wrote.
pub struct Committed {
    pub ledger: Ledger,
    /// The pool's usage (none for an invalid spec).
    pub usage: Option<Usage>,
    /// Each allocation's lease or refusal.
    pub outcomes: Outcomes,
    /// The ledger as stored (with its version), for the next commit of the same reconcile to
    /// start from.
    pub stored: Option<Stored>,
}

/// Where a commit starts.
#[derive(Debug)]
pub enum Start {
    /// From nothing: the ledger is read first.
    Unread,
    /// From the ledger as this reconcile read it, wrote it or began from it. On a conflict the
    /// intent is applied to the fresh record, all but the addresses it judged leaked: that was
    /// judged from a record changed since, and is judged again by a later reconcile.
    Read(Stored),
    /// From the ledger as an earlier reconcile of this process left it. What was judged from it
    /// stands only if the server still has it, as the write's version proves (or a read, when
    /// there is nothing to write): otherwise nothing is written, and [`Error::LedgerOutdated`]
    /// asks the caller to judge again from a fresh read.
    Remembered(Stored),
}

/// Applies `intent` to the server's ledger from `start`, retrying on conflicts with the fresh
/// ledger (see [`Start`] for what a conflict keeps of the intent). The write carries the version
/// it started from, so a ledger changed since costs a conflict and a fresh read, never a wrong
/// record, and an unchanged one costs no read at all.
/// `base` is `None` when the spec is invalid; the space that mirrors the written ledger is kept
/// for the next reconcile. Without `create` (nothing to allocate, or the pool is being deleted)
/// a missing ledger is not recreated and nothing is committed: there is nothing to record.
pub async fn commit<P: PoolDialect>(
    ledger_ref: &LedgerRef,
    pool: &P,
    ctx: &Arc<Context>,
    base: Option<&Base>,
    start: Start,
    intent: &Intent,
    create: bool,
) -> Result<Committed, Error> {
    let key = pool.key();
    let mut rng = StdRng::from_os_rng();
    let now = objects::now().0.to_string();
    let mut marked = intent.allocate.is_empty();
    let mut intent = std::borrow::Cow::Borrowed(intent);
    let mut start = start;
    for _ in 0..LEDGER_ATTEMPTS {
        let (stored, remembered) = match std::mem::replace(&mut start, Start::Unread) {
            Start::Read(stored) => (stored, false),
            Start::Remembered(stored) => (stored, true),
            Start::Unread => match load(ledger_ref, pool, ctx, create).await? {
                Some(stored) => (stored, false),
                None => {
                    return Ok(Committed {
                        ledger: Ledger::default(),
                        usage: base.map(|base| Usage::of(&base.space)),
                        outcomes: Outcomes::new(),
                        stored: None,
                    });
                }
            },
        };
        // After the ledger exists (a mark before would make a new pool's first ledger look lost)
        // and before anything is reserved in it.
        if !marked {
            mark_before_reserving(pool, ctx, ledger_ref).await?;
            marked = true;
        }
        let mut space = base.map(|base| space_of(ctx, &key, base, &stored));
        let (next, outcomes) =
            intent::apply(&stored.ledger, space.as_mut(), &intent, &now, &mut rng);
        let written = if next == stored.ledger && remembered {
            unchanged_since(ledger_ref, &stored).await?
        } else if next == stored.ledger {
            Some(stored.clone())
        } else {
            handover::cover(pool, ctx, &stored.ledger, &next).await?;
            ledger_ref.replace(stored.version(), &next).await?
        };
        let Some(written) = written else {
            tracing::debug!(pool = %key.describe(), remembered, "ledger changed under us; recomputing");
            ctx.ops.metrics.ledger_conflict(key.kind.as_str());
            if remembered {
                let ledger = ledger_ref.describe();
                return Err(Error::LedgerOutdated { ledger });
            }
            if !intent.release_unbound.is_empty() {
                intent.to_mut().release_unbound.clear();
            }
            continue;
        };
        let usage = space.as_ref().map(Usage::of);
        if let (Some(space), Some(base)) = (space, base) {
            keep_space(ctx, &key, base, &written, space);
        }
        return Ok(Committed {
            ledger: next,
            usage,
            outcomes,
            stored: Some(written),
        });
    }
    Err(Error::LedgerContention {
        ledger: ledger_ref.describe(),
        attempts: LEDGER_ATTEMPTS,
    })
}

/// `stored` as the server still has it, `None` if anyone wrote it since: an intent that changes
/// nothing writes nothing, so no write's version checks a remembered record it was judged from.
async fn unchanged_since(ledger_ref: &LedgerRef, stored: &Stored) -> Result<Option<Stored>, Error> {
    Ok(match ledger_ref.load().await? {
        Loaded::Found(now) if now.version() == stored.version() => Some(now),
        _ => None,
    })
}

/// The pool's address space with what `stored` allocates marked: the one the last commit kept,
/// if it was built for this spec and this version of the ledger.
fn space_of(ctx: &Context, key: &PoolKey, base: &Base, stored: &Stored) -> AddressSpace {
    ctx.take_space(key, &base.spec, stored.version())
        .unwrap_or_else(|| {
            let mut space = base.space.clone();
            space.mark_all_used(stored.ledger.addresses());
            space
        })
}

/// Keeps `space`, which mirrors `written`, for the next commit of the pool `key`.
fn keep_space(ctx: &Context, key: &PoolKey, base: &Base, written: &Stored, space: AddressSpace) {
    if let Some(version) = written.version() {
        let cached = CachedSpace {
            pool: base.spec.clone(),
            ledger_version: version.to_string(),
            space,
        };
        ctx.keep_space(key, cached);
    }
}

#[cfg(test)]
mod tests;
