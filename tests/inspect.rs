//! The operator commands (`bitpool pools|who-has|explain|check`, also `kubectl bitpool …`)
//! against the real control plane: what they say of pools a running bitpool serves, and what
//! `check` finds once the state is broken behind bitpool's back.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

use bitpool::api::capi::{IPAddress, IPAddressSpec, IPPoolReference, LocalObjectName};
use bitpool::api::capi_pools::InClusterIPPool;
use bitpool::api::metal3_ipam::IPClaim;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::build::{
    capi_pool, capi_spec, claim, ipclaim, metal3_pool, metal3_spec, with_gateway,
};
use support::check::address_of;
use support::ops::{bind_cluster_role, service_account, token_kubeconfig};
use support::wait::{wait_claim, wait_ipclaim};
use support::{Bitpool, Env};

/// Runs `program args…` against the test cluster, with `path` first on PATH.
fn run(program: &Path, args: &[&str], path: Option<&Path>) -> Output {
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .env("KUBECONFIG", support::kubeconfig_path());
    if let Some(dir) = path {
        let inherited = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![dir.to_path_buf()];
        dirs.extend(std::env::split_paths(&inherited));
        command.env("PATH", std::env::join_paths(dirs).expect("a PATH"));
    }
    command
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

fn bitpool(args: &[&str]) -> Output {
    run(Path::new(env!("CARGO_BIN_EXE_bitpool")), args, None)
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(output)))
}

/// A pool of three addresses serving three claims with a fourth waiting, and a Metal3 pool
/// serving one IPClaim: what each command says of them, as `bitpool` and as `kubectl bitpool`.
#[tokio::test]
async fn the_operator_commands_answer_from_the_live_cluster() {
    let env = Env::new("inspect").await;
    let ns = env.name().to_string();
    let _bitpool = Bitpool::start(&ns, &[]);
    capi_pool(
        &env,
        "rack",
        with_gateway(capi_spec(&["10.60.0.10-10.60.0.12"], 24), "10.60.0.1"),
    )
    .await;
    metal3_pool(&env, "bmh", metal3_spec("10.61.0.20", "10.61.0.29", 24)).await;
    for name in ["node-1", "node-2", "node-3"] {
        claim(&env, name, "InClusterIPPool", "rack").await;
        wait_claim(&env, name, "Ready", |c| c.status == "True").await;
    }
    claim(&env, "node-4", "InClusterIPPool", "rack").await;
    wait_claim(&env, "node-4", "exhausted", |c| c.reason == "PoolExhausted").await;
    ipclaim(&env, "host-1", "bmh").await;
    wait_ipclaim(&env, "host-1").await;
    let metal3_held = Api::<IPClaim>::namespaced(env.client.clone(), &ns)
        .get("host-1")
        .await
        .ok()
        .and_then(|c| c.status?.address?.name)
        .and_then(|name| name.strip_prefix("m3-").map(|a| a.replace('-', ".")))
        .expect("host-1's address, from its object's name");

    let pools = bitpool(&["pools", "-n", &ns, "-o", "json"]);
    assert_eq!(pools.status.code(), Some(0), "{}", text(&pools));
    let rows = json_of(&pools);
    let row = |name: &str| {
        rows.as_array()
            .and_then(|rows| rows.iter().find(|r| r["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no pool {name}: {rows}"))
    };
    let rack = row("rack");
    assert_eq!(
        (
            &rack["kind"],
            &rack["total"],
            &rack["used"],
            &rack["free"],
            &rack["pendingClaims"],
            &rack["ready"]
        ),
        (
            &json!("InClusterIPPool"),
            &json!("3"),
            &json!("3"),
            &json!("0"),
            &json!(1),
            &json!("True")
        ),
        "{rack}"
    );
    let bmh = row("bmh");
    assert_eq!(
        (&bmh["kind"], &bmh["total"], &bmh["used"]),
        (&json!("IPPool"), &json!("10"), &json!("1")),
        "{bmh}"
    );

    let wide = bitpool(&["pools", "-n", &ns, "--wide"]);
    let table = String::from_utf8_lossy(&wide.stdout);
    assert!(table.starts_with("KIND "), "{}", text(&wide));
    let held = address_of(&env, "node-1").await;
    let metal3_free: Vec<&str> = table.lines().filter(|l| l.contains(" bmh ")).collect();
    assert_eq!(metal3_free.len(), 1, "{table}");
    assert!(
        metal3_free[0].ends_with(" 10.61.0.21-10.61.0.29"),
        "the Metal3 pool's free range, one address taken: {table}"
    );

    // As a kubectl plugin: the binary on PATH as kubectl-bitpool.
    let plugins = tempfile_dir(&ns);
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_bitpool"),
        plugins.join("kubectl-bitpool"),
    )
    .expect("link the plugin");
    let who = run(
        Path::new("kubectl"),
        &["bitpool", "who-has", &held, "-n", &ns],
        Some(&plugins),
    );
    assert_eq!(who.status.code(), Some(0), "{}", text(&who));
    let who_text = String::from_utf8_lossy(&who.stdout);
    assert!(
        who_text.contains("IPAddress/node-1")
            && who_text.contains("IPAddressClaim/node-1")
            && who_text.contains("InClusterIPPool/rack"),
        "{}",
        text(&who)
    );
    let metal3 = bitpool(&["who-has", &metal3_held, "-n", &ns]);
    let metal3_text = String::from_utf8_lossy(&metal3.stdout);
    assert!(
        metal3_text.contains("IPAddress.ipam.metal3.io/")
            && metal3_text.contains("IPClaim/host-1")
            && metal3_text.contains("IPPool/bmh"),
        "{}",
        text(&metal3)
    );
    let whole = bitpool(&["who-has", "10.60.0.0/24", "-n", &ns, "-o", "json"]);
    let holders: BTreeSet<String> = json_of(&whole)
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|h| h["claim"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        holders,
        [
            "IPAddressClaim/node-1",
            "IPAddressClaim/node-2",
            "IPAddressClaim/node-3"
        ]
        .map(String::from)
        .into()
    );
    let nobody = bitpool(&["who-has", "10.60.0.99", "-n", &ns]);
    assert_eq!(
        nobody.status.code(),
        Some(1),
        "nothing holds it: {}",
        text(&nobody)
    );

    let waiting = bitpool(&["explain", "-n", &ns, "node-4"]);
    assert_eq!(
        waiting.status.code(),
        Some(1),
        "not served: {}",
        text(&waiting)
    );
    let paragraph = String::from_utf8_lossy(&waiting.stdout).replace('\n', " ");
    assert!(
        paragraph.contains(&format!(
            "Its pool InClusterIPPool {ns}/rack is exhausted (3 of 3 held)"
        )),
        "{paragraph}"
    );
    let metal3 = bitpool(&["explain", "-n", &ns, "ipclaim/host-1"]);
    assert_eq!(metal3.status.code(), Some(0), "{}", text(&metal3));
    assert!(
        String::from_utf8_lossy(&metal3.stdout)
            .starts_with("It is served: IPAddress.ipam.metal3.io"),
        "{}",
        text(&metal3)
    );
    let missing = bitpool(&["explain", "-n", &ns, "no-such-claim"]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));

    let check = bitpool(&["check", "-n", &ns]);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
    assert_eq!(
        String::from_utf8_lossy(&check.stdout),
        "every invariant holds\n"
    );

    // Bound to nothing but `bitpool rbac --viewer` (get and list), every command still answers.
    let kubeconfig = plugins.join("viewer.kubeconfig");
    as_viewer(&env, &kubeconfig).await;
    let kubeconfig = kubeconfig.to_str().expect("a UTF-8 path");
    for (args, expected) in [
        (vec!["pools", "-n", &ns], 0),
        (vec!["who-has", &held, "-n", &ns], 0),
        (vec!["who-has", &metal3_held, "-n", &ns], 0),
        (vec!["explain", "-n", &ns, "node-4"], 1),
        (vec!["check", "-n", &ns], 0),
    ] {
        let output = bitpool(&[args.as_slice(), &["--kubeconfig", kubeconfig]].concat());
        assert_eq!(
            output.status.code(),
            Some(expected),
            "{args:?} as the viewer: {}",
            text(&output)
        );
    }
}

/// Writes to `kubeconfig` the credentials of a new ServiceAccount of the test bound only to the
/// ClusterRole `bitpool rbac --viewer` prints.
async fn as_viewer(env: &Env, kubeconfig: &Path) {
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    let role = bitpool::rbac::viewer();
    roles
        .patch(
            "bitpool-viewer",
            &PatchParams::apply("bitpool-tests").force(),
            &Patch::Apply(&role),
        )
        .await
        .expect("apply the viewer role");
    let token = service_account(env, "operator").await;
    bind_cluster_role(
        env,
        &format!("{}-viewer", env.name()),
        "bitpool-viewer",
        "operator",
    )
    .await;
    token_kubeconfig(support::kubeconfig_path(), &token, kubeconfig);
}

/// A directory of this test's own for the plugin link.
fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bitpool-plugin-{name}"));
    std::fs::create_dir_all(&dir).expect("create the plugin directory");
    dir
}

/// With bitpool stopped, state broken by hand: an address object deleted behind the ledger's
/// back and another made for no claim on an address already held. `check` names each broken
/// invariant and exits 1; it wrote nothing.
#[tokio::test]
async fn check_names_what_was_broken_behind_bitpools_back() {
    let env = Env::new("inspect-check").await;
    let ns = env.name().to_string();
    let mut bitpool_process = Bitpool::start(&ns, &[]);
    capi_pool(&env, "rack", capi_spec(&["10.62.0.10-10.62.0.19"], 24)).await;
    for name in ["node-1", "node-2"] {
        claim(&env, name, "InClusterIPPool", "rack").await;
        wait_claim(&env, name, "Ready", |c| c.status == "True").await;
    }
    let clean = bitpool(&["check", "-n", &ns, "--recheck", "0s"]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    bitpool_process.kill();

    let addresses: Api<IPAddress> = env.api();
    let unfinalize = Patch::Merge(json!({ "metadata": { "finalizers": null } }));
    addresses
        .patch("node-2", &PatchParams::default(), &unfinalize)
        .await
        .expect("drop the finalizer");
    addresses
        .delete("node-2", &DeleteParams::default())
        .await
        .expect("delete node-2's address");
    let taken = address_of(&env, "node-1").await;
    let ghost = IPAddress::new(
        "ghost",
        IPAddressSpec {
            claim_ref: LocalObjectName {
                name: "nobody".into(),
            },
            pool_ref: IPPoolReference {
                api_group: bitpool::api::capi::GROUP.into(),
                kind: "InClusterIPPool".into(),
                name: "rack".into(),
            },
            address: taken.clone(),
            prefix: 24,
            gateway: None,
        },
    );
    addresses
        .create(
            &PostParams::default(),
            &IPAddress {
                metadata: env.meta("ghost"),
                ..ghost
            },
        )
        .await
        .expect("create the ghost address");
    let pools: Api<InClusterIPPool> = env.api();
    let before = pools
        .get("rack")
        .await
        .expect("the pool")
        .metadata
        .resource_version;

    let broken = bitpool(&["check", "-n", &ns, "-o", "json", "--recheck", "1s"]);
    assert_eq!(broken.status.code(), Some(1), "{}", text(&broken));
    let findings = json_of(&broken);
    let found: BTreeSet<(String, String)> = findings
        .as_array()
        .map(|all| {
            all.iter()
                .map(|f| {
                    (
                        f["rule"].as_str().unwrap_or_default().to_string(),
                        f["subject"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let expected: BTreeSet<(String, String)> = [
        ("HeldTwice", format!("InClusterIPPool {ns}/rack")),
        ("LeakedInLedger", format!("InClusterIPPool {ns}/rack")),
        ("Orphan", format!("IPAddress {ns}/ghost")),
        (
            "ServedWithoutAddress",
            format!("IPAddressClaim {ns}/node-2"),
        ),
    ]
    .into_iter()
    .map(|(rule, subject)| (rule.to_string(), subject))
    .collect();
    assert_eq!(found, expected, "{findings:#}");
    assert!(
        findings
            .to_string()
            .contains(&format!("{taken} is held by")),
        "{findings:#}"
    );
    let after = pools
        .get("rack")
        .await
        .expect("the pool")
        .metadata
        .resource_version;
    assert_eq!(before, after, "check wrote to the pool");

    // What the table in docs/operating.md promises: a bitpool started again repairs all of it.
    let _restarted = Bitpool::start(&ns, &[]);
    let repaired = || async {
        let check = bitpool(&["check", "-n", &ns, "--recheck", "0s"]);
        (check.status.code() == Some(0)).then_some(())
    };
    support::eventually(
        "bitpool repaired what check found",
        support::wait::WAIT,
        repaired,
    )
    .await;
}
