//! Builders: pools and claims of every kind with the test's metadata, created one by one or in
//! bursts. Each creation that fails fails the test.

use bitpool::api::capi::{IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use bitpool::api::capi_pools::{
    GlobalInClusterIPPool, GlobalInClusterIPPoolSpec, GlobalInClusterPrefixPool,
    GlobalInClusterPrefixPoolSpec, InClusterIPPool, InClusterIPPoolSpec, InClusterPrefixPool,
    InClusterPrefixPoolSpec,
};
use bitpool::api::metal3_ipam::{IPClaim, IPClaimSpec, IPPool, IPPoolSpec, Metal3PoolRange};
use futures::{StreamExt, stream};
use kube::Resource;
use kube::api::{Api, ListParams, PostParams};

use super::env::Env;

pub const CAPI_GROUP: &str = "ipam.cluster.x-k8s.io";

pub const METAL3_GROUP: &str = "ipam.metal3.io";

pub fn capi_spec(addresses: &[&str], prefix: i32) -> InClusterIPPoolSpec {
    InClusterIPPoolSpec {
        addresses: addresses.iter().map(|s| s.to_string()).collect(),
        prefix,
        ..Default::default()
    }
}

/// `spec` with a gateway.
pub fn with_gateway(spec: InClusterIPPoolSpec, gateway: &str) -> InClusterIPPoolSpec {
    InClusterIPPoolSpec {
        gateway: Some(gateway.into()),
        ..spec
    }
}

pub async fn create<K>(api: &Api<K>, object: &K) -> K
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object)
        .await
        .unwrap_or_else(|e| panic!("create {:?}: {e}", object.meta().name))
}

pub async fn capi_pool(env: &Env, name: &str, spec: InClusterIPPoolSpec) -> InClusterIPPool {
    let pool = InClusterIPPool {
        metadata: env.meta(name),
        spec,
        status: None,
    };
    create(&env.api(), &pool).await
}

/// The name `<namespace>-<name>` of a cluster-scoped object of the test (global names are
/// cluster-wide), and its metadata: no namespace, labelled for the test's bitpool.
fn global_meta(env: &Env, name: &str) -> (String, kube::api::ObjectMeta) {
    let full = format!("{}-{name}", env.name());
    let mut metadata = env.meta(&full);
    metadata.namespace = None;
    (full, metadata)
}

/// A global pool named `<namespace>-<name>` (global names are cluster-wide), labelled for the
/// test's bitpool.
pub async fn global_pool(env: &Env, name: &str, spec: InClusterIPPoolSpec) -> String {
    let (full, metadata) = global_meta(env, name);
    let pool = GlobalInClusterIPPool {
        metadata,
        spec: GlobalInClusterIPPoolSpec {
            pool: spec,
            namespace_selector: None,
        },
        status: None,
    };
    create(&Api::all(env.client.clone()), &pool).await;
    full
}

pub fn prefix_spec(prefixes: &[&str], length: i32) -> InClusterPrefixPoolSpec {
    InClusterPrefixPoolSpec {
        prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
        allocation_prefix_length: length,
        ..Default::default()
    }
}

pub async fn prefix_pool(
    env: &Env,
    name: &str,
    spec: InClusterPrefixPoolSpec,
) -> InClusterPrefixPool {
    let pool = InClusterPrefixPool {
        metadata: env.meta(name),
        spec,
        status: None,
    };
    create(&env.api(), &pool).await
}

/// A global prefix pool named `<namespace>-<name>`, labelled for the test's bitpool.
pub async fn global_prefix_pool(env: &Env, name: &str, spec: InClusterPrefixPoolSpec) -> String {
    let (full, metadata) = global_meta(env, name);
    let pool = GlobalInClusterPrefixPool {
        metadata,
        spec: GlobalInClusterPrefixPoolSpec {
            pool: spec,
            namespace_selector: None,
        },
        status: None,
    };
    create(&Api::all(env.client.clone()), &pool).await;
    full
}

pub fn metal3_spec(start: &str, end: &str, prefix: i32) -> IPPoolSpec {
    IPPoolSpec {
        name_prefix: "m3".into(),
        pools: vec![Metal3PoolRange {
            start: Some(start.into()),
            end: Some(end.into()),
            ..Default::default()
        }],
        prefix: Some(prefix),
        ..Default::default()
    }
}

pub async fn metal3_pool(env: &Env, name: &str, spec: IPPoolSpec) -> IPPool {
    let pool = IPPool {
        metadata: env.meta(name),
        spec,
        status: None,
    };
    create(&env.api(), &pool).await
}

/// The group a pool kind is of: Metal3's `IPPool`, or one of Cluster API's in-cluster pools.
pub fn group_of(kind: &str) -> &'static str {
    if kind == "IPPool" {
        METAL3_GROUP
    } else {
        CAPI_GROUP
    }
}

/// An IPAddressClaim on the pool `kind`/`pool`, not yet created.
pub fn claim_object(env: &Env, name: &str, kind: &str, pool: &str) -> IPAddressClaim {
    IPAddressClaim {
        metadata: env.meta(name),
        spec: IPAddressClaimSpec {
            cluster_name: None,
            pool_ref: IPPoolReference {
                name: pool.into(),
                kind: kind.into(),
                api_group: group_of(kind).into(),
            },
        },
        status: None,
    }
}

/// Creates an IPAddressClaim on the pool `kind`/`pool`.
pub async fn claim(env: &Env, name: &str, kind: &str, pool: &str) -> IPAddressClaim {
    create_claim(env, claim_object(env, name, kind, pool)).await
}

/// Creates `claim` in the test namespace.
pub async fn create_claim(env: &Env, claim: IPAddressClaim) -> IPAddressClaim {
    create(&env.api(), &claim).await
}

pub fn ipclaim_object(env: &Env, name: &str, pool: &str) -> IPClaim {
    IPClaim {
        metadata: env.meta(name),
        spec: IPClaimSpec {
            pool: k8s_openapi::api::core::v1::ObjectReference {
                name: Some(pool.into()),
                namespace: Some(env.name().to_string()),
                ..Default::default()
            },
        },
        status: None,
    }
}

pub async fn ipclaim(env: &Env, name: &str, pool: &str) -> IPClaim {
    create(&env.api(), &ipclaim_object(env, name, pool)).await
}

/// `count` claims named `<prefix>-NNNN` on one pool, created 32 at a time.
pub async fn burst(env: &Env, prefix: &str, kind: &str, pool: &str, count: usize) {
    let claims = (0..count).map(|i| claim_object(env, &format!("{prefix}-{i:04}"), kind, pool));
    create_claims(env, claims).await;
}

/// `count` IPClaims named `<prefix>-NNNN` on the Metal3 pool `pool`, created 32 at a time.
pub async fn ipclaim_burst(env: &Env, prefix: &str, pool: &str, count: usize) {
    let claims = (0..count).map(|i| ipclaim_object(env, &format!("{prefix}-{i:04}"), pool));
    create_all(&env.api(), claims).await;
}

/// Creates `claims` in the test namespace, 32 at a time.
pub async fn create_claims(env: &Env, claims: impl Iterator<Item = IPAddressClaim>) {
    create_all(&env.api(), claims).await;
}

/// Creates `objects` through `api`, 32 at a time; any refusal fails the test.
pub async fn create_all<K>(api: &Api<K>, objects: impl Iterator<Item = K>)
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let creations = objects.map(|object| async move {
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|e| format!("create {:?}: {e}", object.meta().name))
    });
    for result in stream::iter(creations)
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
    {
        result.unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Deletes every claim of `api`'s namespace. A deletecollection of thousands of claims can
/// outlast the API server's 60 s request timeout, which cuts the connection; like any client,
/// the test then asks again for what is left, as long as each attempt marks more claims
/// deleting than the one before (five attempts in a row without progress fail the test).
pub async fn delete_all_claims(api: &Api<IPAddressClaim>) {
    let mut stalled = 0;
    let mut left = usize::MAX;
    loop {
        let error = match api
            .delete_collection(&kube::api::DeleteParams::default(), &ListParams::default())
            .await
        {
            Ok(_) => return,
            Err(e) if !matches!(&e, kube::Error::Api(s) if s.code < 500) => e,
            Err(e) => panic!("delete every claim: {e}"),
        };
        let now_left = match api.list_metadata(&ListParams::default()).await {
            Ok(list) => list
                .items
                .iter()
                .filter(|claim| claim.metadata.deletion_timestamp.is_none())
                .count(),
            Err(_) => left,
        };
        if now_left == 0 {
            return;
        }
        stalled = if now_left < left { 0 } else { stalled + 1 };
        left = now_left;
        if stalled >= 5 {
            panic!(
                "delete every claim: {error}; {left} claims not marked deleting after five attempts without progress"
            );
        }
        eprintln!(
            "deletecollection of claims failed ({error}); {left} not yet deleting, asking again"
        );
    }
}
