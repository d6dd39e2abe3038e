//! The per-pool ledger: the record, written with optimistic concurrency, of every address a
//! pool has handed out. It is what makes the API server the judge of "is this address free":
//! every change is a replace carrying the resourceVersion it was computed from, so a stale
//! writer (another bitpool process, or a stale cache) gets 409 Conflict and recomputes.
//!
//! A ConfigMap in bitpool's ledger namespace holds it (never in a tenant's namespace, so a
//! tenant who may write ConfigMaps there cannot touch allocation state): `binaryData.ipv4` and
//! `binaryData.ipv6` are roaring bitmaps of the allocated addresses of each family (a pool that
//! changes family can never confuse the two), `data.pending` the reservations whose address
//! object is not yet confirmed — address → claim UID, name and time — so that a crash between
//! "ledger says taken" and "address object created" resumes with the same address for the same
//! claim. `data.rebuiltAt` marks a ledger rebuilt without knowing what was in flight (see
//! [`REBUILD_FENCE`]). `data.writtenTo` is the UID of the ConfigMap the record was judged whole
//! in: a ConfigMap restored from a backup is a new object with an old UID there, so bitpool knows
//! it may lack addresses handed out since (see [`Ledger::whole`]).
//!
//! Nothing outside this folder reads or writes that format:
//!
//! - [`record`]: the record in memory and in its ConfigMap, and the timing bounds it keeps;
//! - [`intent`]: the transaction, pure: what one commit asks and what it leaves;
//! - [`store`]: where a pool's ledger lives, read, created, replaced and deleted;
//! - [`memory`]: a record as stored, and the last one this process read or wrote of each pool;
//! - [`commit`]: reading (rebuilding a lost record, fenced) and committing an intent, retried
//!   on conflicts;
//! - [`session`]: one reconcile's use of its pool's ledger;
//! - [`handover`]: the ledger as it travels on the pool for `clusterctl move`.

pub mod commit;
pub mod handover;
pub mod intent;
pub mod memory;
pub mod record;
pub mod session;
pub mod store;

pub use commit::{Committed, LEDGER_ANNOTATION};
pub use intent::{ClaimId, Found, Intent, Refusal, Request};
pub use memory::Stored;
pub use record::{
    CREATE_WINDOW, IN_FLIGHT_BOUND, LEDGER_LABEL, Ledger, MAX_BITMAP_BYTES, MAX_PENDING_BYTES,
    POOL_ANNOTATION, POOL_UID_ANNOTATION, PendingRoom, REBUILD_FENCE, Reservation,
    TRANSIT_ALLOWANCE,
};
pub use session::Session;
pub use store::{LedgerRef, Loaded, ensure_namespace, forget, ledger_name, ledger_of};
