//! How every controller runs: once the caches hold their initial lists, while this process
//! leads and until shutdown, with a retry policy per error (see [`super::error`]).

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::{StreamExt, future};
use kube::Resource;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use serde::de::DeserializeOwned;

use super::cache::describe;
use super::context::{Context, Needs};
use super::error::Error;

fn error_policy<K, C>(object: Arc<K>, error: &Error, ctx: Arc<C>) -> Action
where
    K: Resource<DynamicType = ()>,
    C: AsRef<Context>,
{
    let ctx = (*ctx).as_ref();
    let described = describe(&*object);
    ctx.ops
        .metrics
        .reconcile_failed(&K::kind(&()), error.kind());
    let retry = ctx.failed(&described, error);
    tracing::warn!(
        object = %described,
        error = %error,
        error_kind = error.kind(),
        retry_in = ?retry,
        "reconcile failed"
    );
    match retry {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    }
}

/// Runs `reconcile` once the caches it `needs` hold their initial lists, while this process
/// leads and unless shutdown has begun; resets the object's retry backoff when it succeeds.
/// Losing the lease drops the reconcile at once, as a crash would: every write is resumable.
async fn guarded<K, C, F, Fut>(
    object: Arc<K>,
    own: Arc<C>,
    needs: Needs,
    reconcile: F,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()>,
    C: AsRef<Context>,
    F: FnOnce(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, Error>>,
{
    let ctx = (*own).as_ref();
    ctx.wait_for(needs).await;
    if ctx.shutting_down() || !ctx.ops.leadership.is_leading() {
        // A new leader reconciles everything when it takes over.
        return Ok(Action::await_change());
    }
    let described = describe(&*object);
    let started = std::time::Instant::now();
    let result = tokio::select! {
        result = reconcile(object, own.clone()) => result,
        _ = ctx.ops.leadership.lost() => {
            tracing::info!(object = %described, "reconcile dropped: this process stopped leading");
            return Ok(Action::await_change());
        }
    };
    ctx.ops.metrics.reconciled(&K::kind(&()), started.elapsed());
    if result.is_ok() {
        ctx.succeeded(&described);
    }
    result
}

/// Turns a controller on (configured) or off, by its group.
pub struct Switch<'a> {
    pub config: &'a ControllerConfig,
    pub stopped: &'a tokio::sync::watch::Receiver<bool>,
    pub ctx: &'a Context,
}

impl Switch<'_> {
    /// `controller` configured to run, if its group is on.
    pub fn when<K>(
        &self,
        group_on: bool,
        controller: Option<Controller<K>>,
    ) -> Option<Controller<K>>
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    {
        controller
            .filter(|_| group_on)
            .map(|c| configure(c, self.config, self.stopped, self.ctx))
    }
}

/// Runs `controller` (if it is on) with `reconcile`, guarded, once the caches it `needs` are
/// complete, until it stops.
pub async fn run_controller<K, C, R, Fut>(
    controller: Option<Controller<K>>,
    needs: Needs,
    reconcile: R,
    ctx: &Arc<C>,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    C: AsRef<Context> + Send + Sync + 'static,
    R: Fn(Arc<K>, Arc<C>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    if let Some(controller) = controller {
        let run = controller.run(
            move |object, ctx| guarded(object, ctx, needs, reconcile.clone()),
            error_policy,
            ctx.clone(),
        );
        drive(run).await;
    }
}

/// Every controller's settings: concurrency and debounce, stopping with the process, and a
/// reconcile of every object when this process becomes the leader (it skipped them before).
fn configure<K>(
    controller: Controller<K>,
    config: &ControllerConfig,
    stopped: &tokio::sync::watch::Receiver<bool>,
    ctx: &Context,
) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let mut stopped = stopped.clone();
    controller
        .with_config(config.clone())
        .reconcile_all_on(ctx.ops.leadership.gained())
        .graceful_shutdown_on(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
}

/// Runs a controller to its end (shutdown); failed reconciles were logged by [`error_policy`].
async fn drive<K: Resource>(
    results: impl futures::Stream<
        Item = Result<
            (ObjectRef<K>, Action),
            kube::runtime::controller::Error<Error, watcher::Error>,
        >,
    >,
) {
    results
        .for_each(|result| {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller event");
            }
            future::ready(())
        })
        .await;
}
