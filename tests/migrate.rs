//! `bitpool migrate` end to end: a Metal3 IPPool with 50 allocations, and one of three subnets,
//! each becomes an InClusterIPPool, and claims re-created against it under the same names get the
//! same addresses.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use bitpool::api::capi_pools::InClusterIPPool;
use bitpool::api::labels::WATCH_FILTER as WATCH_FILTER_LABEL;
use bitpool::api::metal3_ipam::{
    IPClaim, IPPool, IPPoolSpec, Metal3IPAddress, Metal3IPAddressSpec, Metal3PoolRange,
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use support::{Bitpool, TestNamespace, eventually};

/// Runs the bitpool command line against the test cluster.
fn bitpool_cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_bitpool"))
        .args(args)
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .expect("run bitpool")
}

/// One allocation metal3 ip-address-manager made: the claim (`<bmh>-<pool>`), its address,
/// and the prefix and gateway it was handed out with.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    claim: String,
    address: String,
    prefix: i32,
    gateway: String,
}

/// Creates `pool` and the Metal3 IPAddresses of `held`, checks and applies `bitpool migrate`,
/// then re-creates every claim against the new InClusterIPPool (newest first, so that plain
/// lowest-first allocation would differ) and returns what the IPAddresses hold.
async fn migrate_then_claim_again(pool: IPPool, held: &[Held]) -> Vec<Held> {
    let client = support::client().await;
    support::install_all_crds(&client).await;
    let ns = TestNamespace::new(&client, "migrate").await;
    let name = ns.name.as_str();
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    let mut pool = pool;
    pool.metadata.namespace = Some(name.into());
    Api::<IPPool>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &pool)
        .await
        .expect("create IPPool");
    let metal3_addresses: Api<Metal3IPAddress> = Api::namespaced(client.clone(), name);
    let reference = |object: &str| ObjectReference {
        name: Some(object.into()),
        namespace: Some(name.into()),
        ..Default::default()
    };
    for h in held {
        let object = Metal3IPAddress {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}-{}",
                    pool.spec.name_prefix,
                    h.address.replace('.', "-")
                )),
                namespace: Some(name.into()),
                ..Default::default()
            },
            spec: Metal3IPAddressSpec {
                claim: reference(&h.claim),
                pool: reference(&pool_name),
                address: h.address.clone(),
                prefix: Some(h.prefix),
                gateway: Some(h.gateway.clone()),
                dns_servers: pool.spec.dns_servers.clone(),
            },
        };
        metal3_addresses
            .create(&PostParams::default(), &object)
            .await
            .expect("create Metal3 IPAddress");
    }

    let check = bitpool_cli(&["migrate", "--namespace", name, "--check"]);
    let report = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "check failed: {report}");
    assert!(
        report.contains(&format!("{} allocation(s), every address kept", held.len())),
        "{report}"
    );
    let printed = bitpool_cli(&["migrate", "--namespace", name]);
    let yaml = String::from_utf8_lossy(&printed.stdout);
    assert!(
        printed.status.success() && yaml.contains("kind: InClusterIPPool"),
        "{yaml}"
    );
    let first = &held[0];
    assert!(
        yaml.contains(&format!("{}: \"{}\"", first.claim, first.address)),
        "{yaml}"
    );
    let applied = bitpool_cli(&["migrate", "--namespace", name, "--apply"]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    // The new pool takes the watch filter of this test's bitpool.
    let pools: Api<bitpool::api::capi_pools::InClusterIPPool> =
        Api::namespaced(client.clone(), name);
    pools
        .patch(
            &pool_name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {WATCH_FILTER_LABEL: name}}})),
        )
        .await
        .expect("label the new pool");

    let _bitpool = Bitpool::start(name, &[]);
    let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), name);
    let mut names: Vec<&str> = held.iter().map(|h| h.claim.as_str()).collect();
    names.sort_unstable();
    for claim in names.into_iter().rev() {
        let object = IPAddressClaim {
            metadata: ObjectMeta {
                name: Some(claim.to_string()),
                namespace: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    WATCH_FILTER_LABEL.to_string(),
                    name.to_string(),
                )])),
                ..Default::default()
            },
            spec: IPAddressClaimSpec {
                cluster_name: None,
                pool_ref: IPPoolReference {
                    name: pool_name.clone(),
                    kind: "InClusterIPPool".into(),
                    api_group: "ipam.cluster.x-k8s.io".into(),
                },
            },
            status: None,
        };
        claims
            .create(&PostParams::default(), &object)
            .await
            .expect("create claim");
    }
    let addresses: Api<IPAddress> = Api::namespaced(client.clone(), name);
    let what = format!("{} IPAddresses", held.len());
    let mut got: Vec<Held> = eventually(&what, Duration::from_secs(90), || async {
        let list = addresses.list(&Default::default()).await.ok()?;
        (list.items.len() == held.len()).then(|| {
            list.items
                .into_iter()
                .map(|a| Held {
                    claim: a.spec.claim_ref.name,
                    address: a.spec.address,
                    prefix: a.spec.prefix,
                    gateway: a.spec.gateway.unwrap_or_default(),
                })
                .collect()
        })
    })
    .await;
    got.sort();
    got
}

fn sorted(mut held: Vec<Held>) -> Vec<Held> {
    held.sort();
    held
}

fn range(start: &str, end: &str) -> Metal3PoolRange {
    Metal3PoolRange {
        start: Some(start.into()),
        end: Some(end.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_metal3_pool_with_50_allocations_migrates_without_changing_an_address() {
    let pool = IPPool {
        metadata: ObjectMeta {
            name: Some("bmv4".into()),
            ..Default::default()
        },
        spec: IPPoolSpec {
            name_prefix: "test1-bmv4".into(),
            pools: vec![
                range("192.168.111.100", "192.168.111.149"),
                Metal3PoolRange {
                    subnet: Some("192.168.111.160/27".into()),
                    ..Default::default()
                },
            ],
            prefix: Some(24),
            gateway: Some("192.168.111.1".into()),
            dns_servers: vec!["192.168.111.1".into()],
            ..Default::default()
        },
        status: None,
    };
    // Addresses scattered over both entries (not the ones a fresh pool would hand out first).
    let held: Vec<Held> = (0..50u32)
        .map(|i| Held {
            claim: format!("node-{i}-bmv4"),
            address: match i % 2 {
                0 => format!("192.168.111.{}", 149 - i),
                _ => format!("192.168.111.{}", 161 + i / 2),
            },
            prefix: 24,
            gateway: "192.168.111.1".into(),
        })
        .collect();
    let got = migrate_then_claim_again(pool, &held).await;
    assert_eq!(
        got,
        sorted(held),
        "every claim got the address it had before the migration"
    );
}

/// A pool of three racks, each its own subnet with its own prefix and gateway (the shape
/// Metal3 users have, which an InClusterIPPool of one subnet could not take): one
/// InClusterIPPool with two further `subnets`, every address kept, each IPAddress with its
/// subnet's prefix and gateway.
#[tokio::test]
async fn a_metal3_pool_of_three_subnets_migrates_without_changing_an_address() {
    let mut entries = vec![
        range("10.40.0.10", "10.40.0.30"),
        range("10.40.1.10", "10.40.1.30"),
        range("10.40.2.10", "10.40.2.30"),
    ];
    entries[1].gateway = Some("10.40.1.1".into());
    entries[2].gateway = Some("10.40.2.1".into());
    entries[2].prefix = Some(25);
    let pool = IPPool {
        metadata: ObjectMeta {
            name: Some("racks".into()),
            ..Default::default()
        },
        spec: IPPoolSpec {
            name_prefix: "test1-racks".into(),
            pools: entries,
            prefix: Some(24),
            gateway: Some("10.40.0.1".into()),
            ..Default::default()
        },
        status: None,
    };
    let held: Vec<Held> = (0..12u32)
        .map(|i| {
            let rack = i % 3;
            Held {
                claim: format!("node-{i}-racks"),
                address: format!("10.40.{rack}.{}", 30 - i),
                prefix: if rack == 2 { 25 } else { 24 },
                gateway: format!("10.40.{rack}.1"),
            }
        })
        .collect();
    let got = migrate_then_claim_again(pool, &held).await;
    assert_eq!(
        got,
        sorted(held),
        "every claim got its address, with its subnet's prefix and gateway"
    );
}

/// `--from-file`: the same planning from YAML (here, an IPPool and an IPAddress as `kubectl get
/// -o yaml` would list them), with no cluster at all.
#[test]
fn migrate_reads_yaml_files_and_checks_without_a_cluster() {
    let dir = support::root().join("target/test-logs");
    std::fs::create_dir_all(&dir).expect("target/test-logs");
    let input = dir.join("migrate-input.yaml");
    std::fs::write(
        &input,
        r#"apiVersion: ipam.metal3.io/v1alpha1
kind: IPPool
metadata: {name: pool0, namespace: metal3}
spec:
  namePrefix: test1-pool0
  pools: [{start: 192.168.0.10, end: 192.168.0.20}]
  prefix: 24
  gateway: 192.168.0.1
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
apiVersion: ipam.metal3.io/v1alpha1
kind: IPAddress
metadata: {name: test1-pool0-192-168-0-15, namespace: metal3}
spec:
  address: 192.168.0.15
  pool: {name: pool0, namespace: metal3}
  claim: {name: node-3-pool0, namespace: metal3}
"#,
    )
    .expect("write input");
    let path = input.to_string_lossy().to_string();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_bitpool"))
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .expect("run bitpool")
    };
    let check = run(&["migrate", "--from-file", &path, "--check"]);
    let report = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{report}");
    assert!(
        report.contains("IPPool metal3/pool0: 1 allocation(s), every address kept"),
        "{report}"
    );
    let printed = run(&["migrate", "--from-file", &path]);
    let yaml = String::from_utf8_lossy(&printed.stdout);
    assert!(
        yaml.contains("node-3-pool0: \"192.168.0.15\"") && yaml.contains("name: pool0"),
        "{yaml}"
    );
    let missing = run(&["migrate", "--from-file", "/nonexistent/file.yaml"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("cannot read /nonexistent/file.yaml")
    );
}

/// Waits until `read` of the pool's conditions says `AddressesOverlap` is `wanted` (present
/// and True, or absent).
async fn wait_overlap<F, Fut>(what: &str, wanted: bool, read: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<
            Output = Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>,
        >,
{
    eventually(what, Duration::from_secs(60), || async {
        let conditions = read().await?;
        let overlap = conditions
            .iter()
            .any(|c| c.type_ == "AddressesOverlap" && c.status == "True");
        (overlap == wanted).then_some(())
    })
    .await
}

/// The seed's migration, exactly: a Metal3 IPPool of three subnets (one with DNS servers of
/// its own) served by bitpool, migrated with `bitpool migrate --apply` and switched to proxy to
/// the new InClusterIPPool. Through the proxy, every IPAddress carries the prefix, gateway and
/// DNS servers the Metal3 pool gives its subnet; IPClaims made together are served in the order
/// they were made; the proxying pool's counts follow what it holds and what its target has
/// left; and neither pool says its addresses overlap once the proxy serves.
#[tokio::test]
async fn through_the_proxy_addresses_counts_and_order_are_as_the_metal3_pool_had_them() {
    let env = support::Env::new("migrate-proxy").await;
    let name = env.name().to_string();
    let _bitpool = Bitpool::start(&name, &[]);
    let mut entries = vec![
        range("10.41.0.10", "10.41.0.40"),
        range("10.41.1.10", "10.41.1.40"),
        range("10.41.2.10", "10.41.2.40"),
    ];
    entries[1].gateway = Some("10.41.1.1".into());
    entries[2].gateway = Some("10.41.2.1".into());
    entries[2].prefix = Some(25);
    entries[2].dns_servers = vec!["10.41.2.53".into()];
    let spec = IPPoolSpec {
        name_prefix: "test1-racks".into(),
        pools: entries,
        prefix: Some(24),
        gateway: Some("10.41.0.1".into()),
        dns_servers: vec!["10.41.0.53".into()],
        pre_allocations: BTreeMap::from([
            ("late-rack1".into(), "10.41.1.20".into()),
            ("late-rack2".into(), "10.41.2.20".into()),
        ]),
        ..Default::default()
    };
    support::build::metal3_pool(&env, "racks", spec).await;
    let ipclaims: Api<IPClaim> = env.api();
    let mirror_of = |claim: &'static str| {
        let (ipclaims, addresses) = (ipclaims.clone(), env.api::<Metal3IPAddress>());
        async move {
            eventually(
                &format!("IPClaim {claim} served"),
                Duration::from_secs(60),
                || async {
                    let claim = ipclaims.get_opt(claim).await.ok()??;
                    let address = claim.status?.address?.name?;
                    addresses.get_opt(&address).await.ok()?
                },
            )
            .await
        }
    };
    for claim in ["early-0", "early-1", "early-2"] {
        support::build::ipclaim(&env, claim, "racks").await;
    }
    let mut before = Vec::new();
    for claim in ["early-0", "early-1", "early-2"] {
        before.push(mirror_of(claim).await);
    }
    assert_eq!(before[0].spec.dns_servers, ["10.41.0.53"]);

    // The new pool; until the Metal3 pool proxies, both really hand out these addresses.
    let applied = bitpool_cli(&["migrate", "--namespace", &name, "--apply"]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let pools: Api<InClusterIPPool> = env.api();
    pools
        .patch(
            "racks",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {WATCH_FILTER_LABEL: &name}}})),
        )
        .await
        .expect("label the new pool");
    let metal3_conditions = || async {
        Some(
            env.api::<IPPool>()
                .get("racks")
                .await
                .ok()?
                .status?
                .conditions,
        )
    };
    let capi_conditions = || async { Some(pools.get("racks").await.ok()?.status?.conditions) };
    wait_overlap("the pools overlap before the switch", true, capi_conditions).await;
    wait_overlap("the Metal3 pool says so too", true, metal3_conditions).await;
    env.api::<IPPool>()
        .patch(
            "racks",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"poolRef": {
                "apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "racks",
            }}})),
        )
        .await
        .expect("point the Metal3 pool at the new pool");
    wait_overlap(
        "the proxy and its target do not overlap",
        false,
        capi_conditions,
    )
    .await;
    wait_overlap("nor does the proxy say so", false, metal3_conditions).await;

    // Addresses of racks 1 and 2 made through the proxy: each its subnet's prefix, gateway and
    // DNS servers, as the Metal3 pool gave them (rack 1 has the pool's own servers).
    for claim in ["late-rack1", "late-rack2"] {
        support::build::ipclaim(&env, claim, "racks").await;
    }
    let rack1 = mirror_of("late-rack1").await.spec;
    let rack2 = mirror_of("late-rack2").await.spec;
    let lease = |a: &Metal3IPAddressSpec| {
        (
            a.address.clone(),
            a.prefix,
            a.gateway.clone(),
            a.dns_servers.clone(),
        )
    };
    assert_eq!(
        lease(&rack1),
        (
            "10.41.1.20".into(),
            Some(24),
            Some("10.41.1.1".into()),
            vec!["10.41.0.53".into()]
        )
    );
    assert_eq!(
        lease(&rack2),
        (
            "10.41.2.20".into(),
            Some(25),
            Some("10.41.2.1".into()),
            vec!["10.41.2.53".into()]
        )
    );
    for (claim, was) in ["early-0", "early-1", "early-2"].into_iter().zip(&before) {
        assert_eq!(
            mirror_of(claim).await.spec,
            was.spec,
            "{claim} kept its IPAddress"
        );
    }

    // Ten IPClaims made one after another, at once: served in that order, lowest first.
    for i in 0..10 {
        support::build::ipclaim(&env, &format!("burst-{i}"), "racks").await;
    }
    let burst = [
        "burst-0", "burst-1", "burst-2", "burst-3", "burst-4", "burst-5", "burst-6", "burst-7",
        "burst-8", "burst-9",
    ];
    for (i, claim) in burst.into_iter().enumerate() {
        let got = mirror_of(claim).await.spec.address;
        assert_eq!(
            got,
            format!("10.41.0.{}", 13 + i),
            "{claim}, made {i}th of the burst"
        );
    }

    // The proxying pool counts what it holds, and what its target has left.
    let held_counts = |held: i64| {
        let (ippools, pools) = (env.api::<IPPool>(), pools.clone());
        async move {
            eventually(
                &format!("the proxying pool counts {held} held"),
                Duration::from_secs(60),
                || async {
                    let status = ippools.get("racks").await.ok()?.status?;
                    let target = pools.get("racks").await.ok()?.status?.ip_addresses?;
                    let counts = (
                        status.used_ip_count?,
                        status.capacity?,
                        status.available_ip_count?,
                    );
                    (counts == (held, target.total, target.free) && target.used == held)
                        .then_some(counts)
                },
            )
            .await
        }
    };
    let (_, capacity, available) = held_counts(15).await;
    assert_eq!(capacity, 31 * 3, "the target's three ranges");
    assert_eq!(available, capacity - 15, "less what is held");
    for claim in ["burst-8", "burst-9"] {
        ipclaims
            .delete(claim, &Default::default())
            .await
            .expect("delete an IPClaim");
    }
    held_counts(13).await;
}
