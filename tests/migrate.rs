//! `bitpool migrate` end to end: a Metal3 IPPool with 50 allocations becomes an InClusterIPPool,
//! and claims re-created against it under the same names get the same addresses.

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

#[tokio::test]
async fn a_metal3_pool_with_50_allocations_migrates_without_changing_an_address() {
    let client = support::client().await;
    support::install_all_crds(&client).await;
    let ns = TestNamespace::new(&client, "migrate").await;
    let name = ns.name.as_str();

    let pool = IPPool {
        metadata: ObjectMeta {
            name: Some("bmv4".into()),
            namespace: Some(name.into()),
            ..Default::default()
        },
        spec: IPPoolSpec {
            name_prefix: "test1-bmv4".into(),
            pools: vec![
                Metal3PoolRange {
                    start: Some("192.168.111.100".into()),
                    end: Some("192.168.111.149".into()),
                    ..Default::default()
                },
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
    Api::<IPPool>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &pool)
        .await
        .expect("create IPPool");
    // 50 allocations as metal3 ip-address-manager made them: `<bmh>-<pool>` claim names, and
    // addresses scattered over both entries (not the ones a fresh pool would hand out first).
    let metal3_addresses: Api<Metal3IPAddress> = Api::namespaced(client.clone(), name);
    let mut expected = BTreeMap::new();
    for i in 0..50u32 {
        let address = if i % 2 == 0 {
            format!("192.168.111.{}", 149 - i)
        } else {
            format!("192.168.111.{}", 161 + i / 2)
        };
        let claim = format!("node-{i}-bmv4");
        let object = Metal3IPAddress {
            metadata: ObjectMeta {
                name: Some(format!("test1-bmv4-{}", address.replace('.', "-"))),
                namespace: Some(name.into()),
                ..Default::default()
            },
            spec: Metal3IPAddressSpec {
                claim: ObjectReference {
                    name: Some(claim.clone()),
                    namespace: Some(name.into()),
                    ..Default::default()
                },
                pool: ObjectReference {
                    name: Some("bmv4".into()),
                    namespace: Some(name.into()),
                    ..Default::default()
                },
                address: address.clone(),
                prefix: Some(24),
                gateway: Some("192.168.111.1".into()),
                dns_servers: vec!["192.168.111.1".into()],
            },
        };
        metal3_addresses
            .create(&PostParams::default(), &object)
            .await
            .expect("create Metal3 IPAddress");
        expected.insert(claim, address);
    }

    let check = bitpool_cli(&["migrate", "--namespace", name, "--check"]);
    let report = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "check failed: {report}");
    assert!(
        report.contains("50 allocation(s), every address kept"),
        "{report}"
    );

    let printed = bitpool_cli(&["migrate", "--namespace", name]);
    let yaml = String::from_utf8_lossy(&printed.stdout);
    assert!(
        printed.status.success() && yaml.contains("kind: InClusterIPPool"),
        "{yaml}"
    );
    assert!(yaml.contains("node-0-bmv4: \"192.168.111.149\""), "{yaml}");

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
            "bmv4",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {WATCH_FILTER_LABEL: name}}})),
        )
        .await
        .expect("label the new pool");

    let _bitpool = Bitpool::start(name, &[]);
    let claims: Api<IPAddressClaim> = Api::namespaced(client.clone(), name);
    // Claims re-created against the new pool, newest host first, so that a plain lowest-first
    // allocation would give different addresses than the preallocations do.
    for claim in expected.keys().rev() {
        let object = IPAddressClaim {
            metadata: ObjectMeta {
                name: Some(claim.clone()),
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
                    name: "bmv4".into(),
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
    let got: BTreeMap<String, String> =
        eventually("50 IPAddresses", Duration::from_secs(90), || async {
            let list = addresses.list(&Default::default()).await.ok()?;
            (list.items.len() == 50).then(|| {
                list.items
                    .into_iter()
                    .map(|a| (a.spec.claim_ref.name, a.spec.address))
                    .collect()
            })
        })
        .await;
    assert_eq!(
        got, expected,
        "every claim got the address it had before the migration"
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
