//! The project's scripts as a new user meets them: the control-plane script stops with a message
//! naming what is missing, instead of failing somewhere later; the quick start (`hack/demo.sh`,
//! the README's first command) shows every claim with the address it holds.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;
use support::plane::Dedicated;
use support::process::free_port;

#[test]
fn a_missing_prerequisite_is_named() {
    let cache = support::root().join("target/test-logs/empty-cache");
    let _ = std::fs::remove_dir_all(&cache);
    // No Go, no openssl, no curl: only the shell (coreutils are not even on PATH).
    let output = std::process::Command::new("/bin/bash")
        .arg(support::root().join("hack/control-plane.sh"))
        .arg("build")
        .env_clear()
        .env("PATH", "/nonexistent")
        .env("HOME", "/nonexistent")
        .env("BITPOOL_CACHE_DIR", &cache)
        .output()
        .expect("run hack/control-plane.sh");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "it must stop: {stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(
        line.contains("missing prerequisite: Go 1.26 or newer")
            && line.contains("openssl")
            && line.contains("curl"),
        "one line naming what to install: {stderr}"
    );
}

/// The demo on a plane without Cluster API core, as a first try on a bare machine is: it names
/// each CRD it installs once, and its claims table shows each claim's address (not the name of
/// the address object, which is the claim's own) as the sample pools hand them out.
#[test]
fn the_demo_shows_the_address_each_claim_holds() {
    let plane = Dedicated::start("demo");
    let output = std::process::Command::new(support::root().join("hack/demo.sh"))
        .env("KUBECONFIG", &plane.kubeconfig)
        .env("BITPOOL_BIN", env!("CARGO_BIN_EXE_bitpool"))
        .env("BITPOOL_HEALTH_ADDR", format!("127.0.0.1:{}", free_port()))
        .env(
            "BITPOOL_DIAGNOSTICS_ADDRESS",
            format!("127.0.0.1:{}", free_port()),
        )
        .env_remove("BITPOOL_DEMO_KEEP")
        .output()
        .expect("run hack/demo.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the demo failed:\n{stdout}\n{stderr}"
    );

    let established: Vec<&str> = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("established "))
        .collect();
    let distinct: HashSet<&str> = established.iter().copied().collect();
    assert_eq!(
        established.len(),
        distinct.len(),
        "a CRD named twice:\n{stderr}"
    );
    for crd in [
        "inclusterippools.ipam.cluster.x-k8s.io",
        "ipaddressclaims.ipam.cluster.x-k8s.io",
        "ipaddresses.ipam.cluster.x-k8s.io",
    ] {
        assert!(distinct.contains(crd), "{crd} not installed:\n{stderr}");
    }

    let claims = claims_table(&stdout);
    let address = |claim: &str| -> IpNet {
        let row = claims
            .get(claim)
            .unwrap_or_else(|| panic!("{claim} missing from the claims table:\n{stdout}"));
        assert_eq!(row.ready, "True", "{claim} not ready:\n{stdout}");
        row.address.parse().unwrap_or_else(|_| {
            panic!("{claim} shows {:?}, not an address:\n{stdout}", row.address)
        })
    };
    let net = |text: &str| -> IpNet { text.parse().expect("a network") };
    assert_eq!(address("node-pinned"), net("192.168.50.10/24"));
    assert_eq!(address("node-requested"), net("192.168.50.12/24"));
    let workers = net("192.168.50.0/28");
    let taken: HashSet<IpAddr> = [
        "192.168.50.0",
        "192.168.50.1",
        "192.168.50.2",
        "192.168.50.15",
    ]
    .iter()
    .map(|a| a.parse().expect("an address"))
    .collect();
    let free_picks = [address("node-a"), address("node-b")];
    for pick in free_picks {
        assert_eq!(pick.prefix_len(), 24, "{stdout}");
        assert!(
            workers.contains(&pick.addr()),
            "{pick} outside the pool:\n{stdout}"
        );
        assert!(
            !taken.contains(&pick.addr()),
            "{pick} is not to be handed out:\n{stdout}"
        );
    }
    assert_ne!(free_picks[0], free_picks[1], "{stdout}");
    let rack = address("rack-1");
    assert_eq!(rack.prefix_len(), 64, "{stdout}");
    assert!(net("fd00:50::/60").contains(&rack.addr()), "{stdout}");
    assert!(
        !net("fd00:50::/64").contains(&rack.addr()),
        "an excluded prefix:\n{stdout}"
    );
}

struct ClaimRow {
    ready: String,
    address: String,
}

/// The demo's claims table, by claim: the rows after its `CLAIM READY REASON ADDRESS` header,
/// up to the blank line that ends it.
fn claims_table(stdout: &str) -> BTreeMap<String, ClaimRow> {
    stdout
        .lines()
        .skip_while(|line| !line.starts_with("CLAIM "))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // CLAIM READY REASON ADDRESS GATEWAY (a prefix pool's claim may have no gateway).
            match fields.as_slice() {
                [claim, ready, _reason, address, ..] => Some((
                    claim.to_string(),
                    ClaimRow {
                        ready: ready.to_string(),
                        address: address.to_string(),
                    },
                )),
                _ => None,
            }
        })
        .collect()
}
