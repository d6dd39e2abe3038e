//! `bitpool migrate` end to end: a Metal3 IPPool with 50 allocations, and one of three subnets,
//! each becomes an InClusterIPPool, and claims re-created against it under the same names get the
//! same addresses.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bitpool::api::capi::{IPAddress, IPAddressClaim, IPAddressClaimSpec, IPPoolReference};
use bitpool::api::metal3_ipam::{
    IPPool, IPPoolSpec, Metal3IPAddress, Metal3IPAddressSpec, Metal3PoolRange,
};
use bitpool::runtime::WATCH_FILTER_LABEL;
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
