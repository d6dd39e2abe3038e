//! The Metal3Data reconciler, apart from the IPAM it claims addresses from:
//!
//! - [`template`]: Metal3DataTemplate — each Metal3DataClaim gets the lowest free index and its
//!   Metal3Data;
//! - [`data`]: Metal3Data — an IP claim of the right kind per referenced pool, the rendered
//!   metaData and networkData secrets ([`crate::render`]), released on deletion;
//! - [`unanswered`]: IP claims no IPAM provider answers, reported on their Metal3Data.
//!
//! The controllers below run in [`crate::manager::run`], on the shared watch caches.

pub mod data;
pub mod ip_claims;
pub mod secrets;
pub mod template;
pub mod unanswered;

use std::sync::Arc;

use futures::{StreamExt, stream};
use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::reflector::ObjectRef;

use crate::api::metal3_data::{Metal3Data, Metal3DataClaim, Metal3DataTemplate};
use crate::runtime::Context;
use crate::runtime::cache::{Caches, Shared};
use crate::runtime::trigger::Triggers;

/// Metal3DataTemplates, triggered by their Metal3DataClaims and Metal3Data, by Metal3Data
/// removals (see [`template::after_data_removal`]) and by their Clusters' unpause.
pub(crate) fn template_controller(
    caches: &Caches,
    ctx: &Arc<Context>,
) -> Option<Controller<Metal3DataTemplate>> {
    let (templates, datas) = (&caches.data_templates, &caches.datas);
    let removed = ctx.clone();
    let mut controller =
        Controller::for_shared_stream(templates.subscribe()?, templates.store.clone())
            .watches_shared_stream(caches.data_claims.subscribe()?, |claim| {
                data::template_of(&claim.spec.template, claim.meta().namespace.as_deref())
            })
            .watches_shared_stream(datas.subscribe()?, |d| {
                data::template_of(&d.spec.template, d.meta().namespace.as_deref())
            })
            // Looked up on each removal, when the cache no longer holds what went.
            .reconcile_on(
                caches
                    .datas_removed
                    .stream()
                    .flat_map(move |()| stream::iter(template::after_data_removal(&removed))),
            );
    if let Some(clusters) = &caches.clusters {
        let templates = templates.store.clone();
        controller = controller.watches_shared_stream(clusters.subscribe()?, move |cluster| {
            template::unpaused_by(&templates, &cluster)
        });
    }
    Some(controller)
}

/// Metal3DataClaims whose template is missing (see [`template::reconcile_claim`]),
/// triggered again when a template of their name appears, and all of them when a template goes
/// (a claim whose last change came while its template was there has no event of its own).
pub(crate) fn orphan_data_claim_controller(
    data_claims: &Shared<Metal3DataClaim>,
    caches: &Caches,
    ctx: &Arc<Context>,
) -> Option<Controller<Metal3DataClaim>> {
    let ctx = ctx.clone();
    let templates = &caches.data_templates;
    Some(
        Controller::for_shared_stream(data_claims.subscribe()?, data_claims.store.clone())
            .reconcile_all_on(caches.templates_removed.stream())
            .watches_shared_stream(templates.subscribe()?, move |template| {
                let namespace = template.meta().namespace.clone().unwrap_or_default();
                let name = template.meta().name.clone().unwrap_or_default();
                template::of_template(&ctx.data_claims, &namespace, &name, |c| &c.spec.template)
                    .into_iter()
                    .map(|c| ObjectRef::from_obj(&*c))
                    .collect::<Vec<_>>()
            }),
    )
}

/// Metal3Data, triggered by their Metal3DataClaims, the IP claims they own and those claims'
/// addresses.
pub(crate) fn data_controller(
    datas: &Shared<Metal3Data>,
    data_claims: &Shared<Metal3DataClaim>,
    caches: &Caches,
    ctx: &Arc<Context>,
) -> Option<Controller<Metal3Data>> {
    let (for_capi, for_metal3) = (ctx.clone(), ctx.clone());
    Some(
        Controller::for_shared_stream(datas.subscribe()?, datas.store.clone())
            .watches_shared_stream(data_claims.subscribe()?, |claim| {
                data::data_of_claim(&claim)
            })
            .reconcile_on(
                Triggers::new()
                    .with(
                        caches
                            .ipclaims
                            .index
                            .requests(|claim| data::owner_data(&claim.meta)),
                    )
                    .with(
                        caches
                            .claims
                            .index
                            .requests(|claim| data::owner_data(&claim.meta)),
                    )
                    .with(caches.addresses.index.requests(move |address| {
                        let claim = for_capi
                            .claims
                            .get(address.meta.namespace(), &address.claim)?;
                        data::owner_data(&claim.meta)
                    }))
                    .with(caches.metal3_addresses.index.requests(move |address| {
                        let claim = for_metal3
                            .ipclaims
                            .get(address.meta.namespace(), &address.claim)?;
                        data::owner_data(&claim.meta)
                    }))
                    .stream(),
            ),
    )
}
