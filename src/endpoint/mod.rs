//! A cluster's control-plane endpoint from a pool (issue 30, item 4): a Cluster or a
//! Metal3Cluster names an address pool in the
//! [`ENDPOINT_POOL_ANNOTATION`](crate::api::capi::ENDPOINT_POOL_ANNOTATION) annotation; bitpool
//! claims one address for the Cluster (an IPAddressClaim it owns, so the address goes back when
//! the Cluster goes) and writes it into the endpoint's host where that is empty.
//!
//! - [`reference`]: the annotation, the claim's name and shape (plain data);
//! - [`plan`]: what a Cluster's endpoint needs next (pure, table-tested);
//! - [`controller`]: the Cluster controller that carries a plan out;
//! - the Metal3Cluster's host is filled at creation by the mutating webhook
//!   ([`crate::webhook::endpoint`]): CAPM3 refuses a Metal3Cluster without one.

pub mod controller;
pub mod plan;
pub mod reference;
