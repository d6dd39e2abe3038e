//! One reconcile's use of its pool's ledger: where the ledger lives, the pool it records and
//! the space it is checked against, opened once and used by both of the reconcile's
//! transactions.

use std::sync::Arc;

use super::commit::{self, Committed};
use super::intent::Intent;
use super::store::{LedgerRef, Stored, ledger_of};
use crate::ipam::context::Context;
use crate::ipam::dialect::PoolDialect;
use crate::ipam::spec::Base;
use crate::runtime::error::Error;

/// A pool's ledger as one reconcile reads and commits it.
pub struct Session<'a, P> {
    pool: &'a P,
    ctx: &'a Arc<Context>,
    /// The pool's empty space, `None` when its spec is invalid (nothing is allocated then).
    base: Option<&'a Base>,
    at: LedgerRef,
}

impl<'a, P: PoolDialect> Session<'a, P> {
    /// The session of `pool`'s ledger for one reconcile.
    pub fn open(pool: &'a P, ctx: &'a Arc<Context>, base: Option<&'a Base>) -> Self {
        Self {
            pool,
            ctx,
            base,
            at: ledger_of(pool, ctx),
        }
    }

    /// The ledger, as people read its name.
    pub fn describe(&self) -> String {
        self.at.describe()
    }

    /// The ledger as the server has it now, created or rebuilt when it is missing or cannot be
    /// trusted; `None` for a missing one when `create` is false.
    pub async fn read(&self, create: bool) -> Result<Option<Stored>, Error> {
        commit::load(&self.at, self.pool, self.ctx, create).await
    }

    /// Commits `intent`, starting from `known` (the ledger as this reconcile last read it) and
    /// retrying on conflicts with a fresh read; see [`commit::commit`].
    pub async fn commit(
        &self,
        known: Option<Stored>,
        intent: &Intent,
        create: bool,
    ) -> Result<Committed, Error> {
        let (pool, ctx, base) = (self.pool, self.ctx, self.base);
        commit::commit(&self.at, pool, ctx, base, known, intent, create).await
    }
}
