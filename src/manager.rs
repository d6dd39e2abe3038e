//! The one place that knows every subsystem: it builds the caches and the shared context, the
//! IPAM engine's and the Metal3Data reconciler's controllers on them, and runs them all.

use std::sync::Arc;

use futures::future;
use kube::Client;
use kube::runtime::Controller;
use kube::runtime::controller::Config as ControllerConfig;

use crate::api::capi::{Cluster, IPAddressClaim};
use crate::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterPrefixPool, InClusterIPPool, InClusterPrefixPool,
};
use crate::api::metal3_data::{Metal3Data, Metal3DataClaim, Metal3DataTemplate};
use crate::api::metal3_ipam::{IPClaim, IPPool};
use crate::endpoint;
use crate::ipam::coverage::Coverage;
use crate::ipam::engine;
use crate::ipam::{self, claims, controllers, ledger, proxy};
use crate::metal3data;
use crate::runtime::cache::Caches;
use crate::runtime::context::Needs;
use crate::runtime::controller::{Switch, run_controller};
use crate::runtime::resume;
use crate::runtime::trigger::DEBOUNCE;
use crate::runtime::{Context, Settings};

/// The controllers a process runs (`None` for those of a group that is off).
struct Controllers {
    in_cluster: Option<Controller<InClusterIPPool>>,
    global: Option<Controller<GlobalInClusterIPPool>>,
    prefix: Option<Controller<InClusterPrefixPool>>,
    global_prefix: Option<Controller<GlobalInClusterPrefixPool>>,
    metal3: Option<Controller<IPPool>>,
    orphan_claims: Option<Controller<IPAddressClaim>>,
    orphan_ipclaims: Option<Controller<IPClaim>>,
    templates: Option<Controller<Metal3DataTemplate>>,
    orphan_data_claims: Option<Controller<Metal3DataClaim>>,
    datas: Option<Controller<Metal3Data>>,
    endpoints: Option<Controller<Cluster>>,
}

impl Controllers {
    /// Every controller of the groups that are on, subscribed to the caches it reads.
    fn new(
        caches: &Caches,
        ctx: &Arc<Context>,
        coverage: &Arc<Coverage>,
        stopped: &tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let config = ControllerConfig::default()
            .debounce(DEBOUNCE)
            .concurrency(ctx.settings.concurrency);
        let groups = ctx.settings.groups;
        let on = Switch {
            config: &config,
            stopped,
            ctx,
        };
        let orphan_claims = controllers::orphan_controller(
            &caches.claims.index,
            &caches.pools_removed,
            ctx,
            claims::capi_stand_in,
        );
        let orphan_ipclaims = controllers::orphan_controller(
            &caches.ipclaims.index,
            &caches.pools_removed,
            ctx,
            claims::metal3_stand_in,
        );
        let (datas, data_claims) = (&caches.datas, &caches.data_claims);
        Self {
            in_cluster: on.when(
                groups.capi_ipam,
                controllers::pool_controller(&caches.pools, caches, ctx, coverage),
            ),
            global: on.when(
                groups.capi_ipam,
                controllers::pool_controller(&caches.global_pools, caches, ctx, coverage),
            ),
            prefix: on.when(
                groups.capi_ipam,
                controllers::pool_controller(&caches.prefix_pools, caches, ctx, coverage),
            ),
            global_prefix: on.when(
                groups.capi_ipam,
                controllers::pool_controller(&caches.global_prefix_pools, caches, ctx, coverage),
            ),
            metal3: on.when(
                groups.metal3_pools(),
                controllers::pool_controller(&caches.ippools, caches, ctx, coverage)
                    .and_then(|c| controllers::with_proxy_targets(c, caches, ctx)),
            ),
            orphan_claims: on.when(groups.capi_ipam || groups.metal3_ipam, Some(orphan_claims)),
            orphan_ipclaims: on.when(groups.metal3_pools(), Some(orphan_ipclaims)),
            templates: on.when(
                groups.metal3_data,
                metal3data::template_controller(caches, ctx),
            ),
            orphan_data_claims: on.when(
                groups.metal3_data,
                metal3data::orphan_data_claim_controller(data_claims, caches, ctx),
            ),
            datas: on.when(
                groups.metal3_data,
                metal3data::data_controller(datas, data_claims, caches, ctx),
            ),
            endpoints: on.when(
                groups.capi_ipam || groups.metal3_pools(),
                endpoint::controller(caches, ctx),
            ),
        }
    }

    /// Runs them all until they stop (at shutdown): the IPAM engine's on its context, the
    /// Metal3Data reconciler's on the shared one.
    async fn run(self, ctx: &Arc<Context>, ipam_ctx: &Arc<ipam::Context>) {
        // The CAPI pool kinds serve new claims while the claims and address objects are being
        // listed.
        let (early, all) = (Needs::AllButClaimsAndAddresses, Needs::Everything);
        let ipam = future::join5(
            run_controller(self.in_cluster, early, engine::reconcile, ipam_ctx),
            run_controller(self.global, early, engine::reconcile, ipam_ctx),
            run_controller(self.prefix, early, engine::reconcile, ipam_ctx),
            run_controller(self.global_prefix, early, engine::reconcile, ipam_ctx),
            run_controller(self.metal3, all, proxy::reconcile, ipam_ctx),
        );
        let rest = future::join5(
            run_controller(self.orphan_claims, all, claims::reconcile, ipam_ctx),
            run_controller(
                self.orphan_ipclaims,
                all,
                claims::reconcile_ipclaim,
                ipam_ctx,
            ),
            run_controller(self.templates, all, metal3data::template::reconcile, ctx),
            run_controller(self.datas, all, metal3data::data::reconcile, ctx),
            run_controller(
                self.orphan_data_claims,
                all,
                metal3data::template::reconcile_claim,
                ctx,
            ),
        );
        let endpoints = run_controller(self.endpoints, all, endpoint::controller::reconcile, ctx);
        future::join3(ipam, rest, endpoints).await;
    }
}

/// Runs every controller until `shutdown` completes.
pub async fn run(
    client: Client,
    settings: Settings,
    ops: Arc<crate::ops::Ops>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    if let Err(e) = ledger::ensure_namespace(&client, &settings.ledger_namespace).await {
        // Retried by every pool that needs its ledger.
        tracing::warn!(namespace = %settings.ledger_namespace, error = %e, "cannot create the ledger namespace yet");
    }
    let mut caches = Caches::new(&client).await;
    let ctx = Arc::new(caches.context(&client, &settings, ops));
    let synced = ctx.clone();
    tokio::spawn(async move {
        synced.wait_for_caches().await;
        synced.ops.mark_caches_synced();
        tracing::info!("watch caches synced");
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let ipam_ctx = Arc::new(ipam::Context::new(ctx.clone()));
    let controllers = Controllers::new(&caches, &ctx, &ipam_ctx.coverage, &stopped);
    caches.start(&client, &settings);
    // Where the next process picks the claims' changes up (`runtime::resume`).
    let keeping = match caches.claims_followed(&client, &settings) {
        (Some(followed), now) => Some(resume::keep(followed, ctx.clone(), stopped.clone(), now)),
        (None, _) => None,
    };

    let stopping = ctx.clone();
    let stop_on_shutdown = async move {
        shutdown.await;
        stopping.begin_shutdown();
        let _ = stop.send(true);
    };
    tracing::info!(version = crate::VERSION, commit = crate::COMMIT, namespace = ?settings.namespace, watch_filter = ?settings.watch_filter, groups = ?settings.groups, "controllers started");
    tokio::spawn(ipam::sweep::run(ipam_ctx.clone()));
    let keeping = async move {
        if let Some(keeping) = keeping {
            keeping.await;
        }
    };
    future::join3(controllers.run(&ctx, &ipam_ctx), stop_on_shutdown, keeping).await;
}
