//! One reconcile's use of its pool's ledger: where the ledger lives, the pool it records and
//! the space it is checked against, opened once and used by both of the reconcile's
//! transactions.

use std::sync::Arc;

use super::commit::{self, Committed, Start};
use super::intent::Intent;
use super::memory::Stored;
use super::store::{LedgerRef, ledger_of};
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
        let read = commit::load(&self.at, self.pool, self.ctx, create).await?;
        let of = self.at.record_of();
        match &read {
            Some(stored) => self.ctx.records.remember(&of, stored),
            None => self.ctx.records.forget(&of),
        }
        Ok(read)
    }

    /// The ledger as this process last read or wrote it, if it remembers it; else as the server
    /// has it now (see [`Self::read`]).
    pub async fn recall(&self, create: bool) -> Result<Start, Error> {
        if let Some(stored) = self.ctx.records.recall(&self.at.record_of()) {
            return Ok(Start::Remembered(stored));
        }
        Ok(self.read(create).await?.map_or(Start::Unread, Start::Read))
    }

    /// Commits `intent` from `start` and retries on conflicts with a fresh read; see
    /// [`commit::commit`]. What it wrote is remembered for the next reconcile.
    pub async fn commit(
        &self,
        start: Start,
        intent: &Intent,
        create: bool,
    ) -> Result<Committed, Error> {
        let (pool, ctx, base) = (self.pool, self.ctx, self.base);
        let of = self.at.record_of();
        let committed = commit::commit(&self.at, pool, ctx, base, start, intent, create).await;
        match &committed {
            Ok(Committed {
                stored: Some(stored),
                ..
            }) => ctx.records.remember(&of, stored),
            // Missing, changed by someone else, or unknown after an error: read it next time.
            _ => ctx.records.forget(&of),
        }
        committed
    }
}
