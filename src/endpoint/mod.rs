//! A cluster's control-plane endpoint from a pool (issue 30, item 4): a Cluster or a
//! Metal3Cluster names an address pool in the
//! [`ENDPOINT_POOL_ANNOTATION`](crate::api::capi::ENDPOINT_POOL_ANNOTATION) annotation; bitpool
//! claims one address for the Cluster (an IPAddressClaim it owns, so the address goes back when
//! the Cluster goes) and writes it into the endpoint's host where that is empty.
//!
//! - [`reference`]: the annotation, the claim's name and shape (plain data);
//! - [`plan`]: what a Cluster's endpoint needs next (pure, table-tested);
//! - [`controller`]: the Cluster controller that carries a plan out ([`controller()`] builds it
//!   with its triggers);
//! - the Metal3Cluster's host is filled at creation by the mutating webhook
//!   ([`crate::webhook::endpoint`]): CAPM3 refuses a Metal3Cluster without one.

pub mod controller;
pub mod plan;
pub mod reference;

use std::sync::Arc;

use kube::runtime::Controller;
use kube::runtime::reflector::ObjectRef;

use crate::api::capi::Cluster;
use crate::runtime::Context;
use crate::runtime::cache::Caches;
use crate::runtime::cached::ClaimObject;
use crate::runtime::trigger::Triggers;

/// The Clusters that name an endpoint pool, triggered by their changes and those of their
/// endpoint claims and the claims' address objects. `None` without Cluster API core.
pub(crate) fn controller(caches: &Caches, ctx: &Arc<Context>) -> Option<Controller<Cluster>> {
    let clusters = caches.clusters.as_ref()?;
    let cluster_of = |claim: &ClaimObject| {
        let cluster = reference::cluster_of_claim(|key| claim.meta.label(key))?;
        Some(ObjectRef::<Cluster>::new(cluster).within(claim.meta.namespace()))
    };
    let claims = ctx.claims.clone();
    let triggers = Triggers::new()
        .with(
            caches
                .claims
                .index
                .requests(move |claim| cluster_of(&claim)),
        )
        .with(caches.addresses.index.requests(move |address| {
            let claim = claims.get(address.meta.namespace(), &address.claim)?;
            cluster_of(&claim)
        }));
    let controller = Controller::for_shared_stream(clusters.subscribe()?, clusters.store.clone())
        .reconcile_on(triggers.stream());
    Some(controller)
}
