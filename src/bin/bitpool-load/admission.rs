//! `--admission N`: what the admission webhook's check of a pool update or delete costs with N
//! addresses allocated. One namespaced pool, N address objects naming it and its ledger; the
//! webhook's handler answers the AdmissionReviews of a delete and of a shrinking update (both
//! refused) in this process, first reading the pool's ledger, then — the ledger removed — as it
//! did before it read ledgers, from a list of every address object in the namespace.

use std::time::{Duration, Instant};

use bitpool::api::capi::{GROUP, IPAddress, IPAddressSpec, IPPoolReference, LocalObjectName};
use bitpool::api::capi_pools::InClusterIPPool;
use bitpool::ipam::ledger::{Ledger, LedgerRef};
use bitpool::webhook::{Phase, Webhooks};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::workload::{Load, POOL_KIND};

const NAMESPACE: &str = "load-admission";
const POOL: &str = "admission";
/// Reviews timed per way of reading; the median is reported.
const ROUNDS: usize = 5;

/// The Markdown rows of the measurement.
pub async fn measure(load: &Load, count: usize, limit: Duration) -> Result<String, String> {
    if count > 65_000 {
        return Err("--admission: at most 65,000 addresses (one /16)".into());
    }
    load.ensure_namespace(NAMESPACE).await?;
    let pool = pool(load).await?;
    let addresses: Vec<std::net::Ipv4Addr> = (0..count)
        .map(|i| std::net::Ipv4Addr::new(10, 128, (i / 250) as u8, (i % 250 + 1) as u8))
        .collect();
    eprintln!("load: admission: creating {count} address objects");
    let api: Api<IPAddress> = Api::namespaced(load.client.clone(), NAMESPACE);
    load.each(addresses.clone(), |ip| {
        let api = api.clone();
        async move {
            let object = address_object(ip);
            match api.create(&PostParams::default(), &object).await {
                Err(kube::Error::Api(e)) if e.is_already_exists() => Ok(()),
                other => other.map(drop),
            }
        }
    })
    .await?;
    let ledger = LedgerRef::new(
        load.client.clone(),
        NAMESPACE,
        POOL_KIND,
        Some(NAMESPACE),
        POOL,
        pool.uid().unwrap_or_default(),
        None,
    );
    let recorded = Ledger::from_addresses(addresses.iter().map(|ip| (*ip).into()));
    ledger
        .create(&recorded)
        .await
        .map_err(|e| format!("cannot write the ledger: {e}"))?;
    let webhooks = Webhooks {
        client: load.client.clone(),
        refuse_overlap: false,
        ledger_namespace: NAMESPACE.into(),
        writers: Default::default(),
    };
    let delete = review(&pool, "DELETE", None)?;
    let mut shrunk = serde_json::to_value(&pool).map_err(|e| e.to_string())?;
    shrunk["spec"]["addresses"] = json!(["10.128.0.0/17"]);
    let update = review(&pool, "UPDATE", Some(shrunk))?;
    let reviews = [("delete", delete), ("shrinking update", update)];
    let mut from_ledger = Vec::new();
    for (_, body) in &reviews {
        from_ledger.push(median(&webhooks, body, count).await?);
    }
    ledger
        .delete()
        .await
        .map_err(|e| format!("cannot delete the ledger: {e}"))?;
    let mut rows = String::new();
    for ((what, body), recorded) in reviews.iter().zip(from_ledger) {
        let listed = median(&webhooks, body, count).await?;
        let ratio = listed / recorded;
        rows.push_str(&format!(
            "| {what} | {count} | {recorded:.0} | {listed:.0} | {ratio:.1}× |\n"
        ));
    }
    load.delete_namespace(NAMESPACE, limit).await?;
    Ok(rows)
}

/// The median time (ms) the webhook takes to answer `body`, checking it refuses.
async fn median(webhooks: &Webhooks, body: &[u8], count: usize) -> Result<f64, String> {
    let mut times = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let answer = webhooks.admit(body, Phase::Validate).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        let answer: serde_json::Value =
            serde_json::from_slice(&answer).map_err(|e| e.to_string())?;
        let refused = answer["response"]["allowed"] == json!(false);
        let message = answer["response"]["status"]["message"].to_string();
        if !refused || !(message.contains(&count.to_string()) || message.contains("10.128.")) {
            return Err(format!("the review was not refused as expected: {message}"));
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[ROUNDS / 2])
}

async fn pool(load: &Load) -> Result<InClusterIPPool, String> {
    load.ensure_pool(NAMESPACE, POOL, "10.128.0.0/16").await
}

fn address_object(ip: std::net::Ipv4Addr) -> IPAddress {
    let name = format!("a-{}", ip.to_string().replace('.', "-"));
    IPAddress::new(
        &name,
        IPAddressSpec {
            claim_ref: LocalObjectName { name: name.clone() },
            pool_ref: IPPoolReference {
                name: POOL.into(),
                kind: POOL_KIND.into(),
                api_group: GROUP.into(),
            },
            address: ip.to_string(),
            prefix: 16,
            gateway: None,
        },
    )
}

/// An AdmissionReview of `operation` on the pool (the new object for an update).
fn review(
    pool: &InClusterIPPool,
    operation: &str,
    object: Option<serde_json::Value>,
) -> Result<Vec<u8>, String> {
    let old = serde_json::to_value(pool).map_err(|e| e.to_string())?;
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "load-admission",
            "kind": {"group": GROUP, "version": "v1alpha2", "kind": POOL_KIND},
            "resource": {"group": GROUP, "version": "v1alpha2", "resource": "inclusterippools"},
            "name": pool.name_any(),
            "namespace": NAMESPACE,
            "operation": operation,
            "userInfo": {},
            "object": object,
            "oldObject": old,
        }
    });
    serde_json::to_vec(&review).map_err(|e| e.to_string())
}
