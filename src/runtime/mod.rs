//! What every subsystem runs on, and nothing that belongs to one of them:
//!
//! - [`cache`]: one watch per kind, feeding a shared cache and the controllers' triggers
//!   ([`trigger`]), which never hold a cache up;
//! - [`context`]: what every reconcile reads (the client, the settings, the caches) and the
//!   process' retry counts and shutdown;
//! - [`controller`]: how a controller runs (after the caches sync, while leading, with a retry
//!   policy per error);
//! - [`error`]: errors that name the call and the object, split into transient and permanent;
//! - [`index`], [`cached`], [`intern`], [`lean`]: the caches of claims and address objects, as
//!   bitpool's own compact types, fed by watches that skip what no reconcile reads;
//!   [`arrivals`]: the claims that change while their first list is still coming, followed
//!   from where the last process left them ([`resume`]);
//! - [`objects`]: small operations on any object (finalizers, conditions, owners, pause,
//!   get-optional, delete-ignoring-missing).

pub mod arrivals;
pub mod cache;
pub mod cached;
pub mod context;
pub mod controller;
pub mod error;
#[cfg(test)]
pub mod fake_api;
pub mod index;
pub mod intern;
pub mod lean;
pub mod objects;
pub mod resume;
pub mod selection;
pub mod trigger;
pub mod watched;

pub use context::{Context, Groups, Settings};
pub use error::Error;
