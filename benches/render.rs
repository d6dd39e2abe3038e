//! Rendering one host's metaData and networkData (`cargo bench --bench render`): the pure work of
//! a Metal3Data reconcile, for a typical template and a large one.

use std::collections::BTreeMap;

use bitpool::api::metal3_data::Metal3DataTemplateSpec;
use bitpool::render::{self, Host, ObjectFacts, PoolAddress, PoolAddresses};
use criterion::{Criterion, criterion_group, criterion_main};

fn host() -> Host {
    Host {
        namespace: "metal3".into(),
        index: 7,
        metal3_machine: ObjectFacts {
            name: "m3m-7".into(),
            ..Default::default()
        },
        machine: ObjectFacts {
            name: "machine-7".into(),
            ..Default::default()
        },
        bare_metal_host: ObjectFacts {
            name: "node-7".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        },
        nics: Some(
            (0..4)
                .map(|i| (format!("eth{i}"), format!("00:5c:52:31:3a:0{i}")))
                .collect(),
        ),
        boot_mac: None,
    }
}

/// A bond of two NICs with a VLAN, IPv4 and IPv6 networks with routes, DNS: what a production
/// template looks like.
const TYPICAL: &str = r#"
clusterName: c
metaData:
  objectNames: [{key: name, object: machine}]
  indexes: [{key: index, offset: 10, prefix: node-}]
  ipAddressesFromPool: [{key: ip, name: v4, apiGroup: "", kind: ""}]
networkData:
  links:
    ethernets:
    - {type: phy, id: eth0, macAddress: {fromHostInterface: eth0}}
    - {type: phy, id: eth1, macAddress: {fromHostInterface: eth1}}
    bonds:
    - {bondMode: 802.3ad, id: bond0, macAddress: {fromHostInterface: eth0}, bondLinks: [eth0, eth1], parameters: [{name: miimon, value: 100}]}
    vlans:
    - {vlanID: 100, id: vlan100, vlanLink: bond0, macAddress: {fromHostInterface: eth0}}
  networks:
    ipv4:
    - id: v4
      link: vlan100
      ipAddressFromIPPool: v4
      routes: [{network: 0.0.0.0, prefix: 0, gateway: {fromIPPool: v4}, services: {dns: [8.8.8.8]}}]
    ipv6:
    - id: v6
      link: vlan100
      fromPoolRef: {apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: v6}
      routes: [{network: "::", prefix: 0, gateway: {fromPoolRef: {apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: v6}}}]
  services: {dnsFromIPPool: v4}
"#;

fn pools() -> PoolAddresses {
    PoolAddresses::from([
        (
            "v4".to_string(),
            PoolAddress {
                address: "192.168.111.107".into(),
                prefix: 24,
                gateway: "192.168.111.1".into(),
                dns_servers: vec!["192.168.111.1".into()],
            },
        ),
        (
            "v6".to_string(),
            PoolAddress {
                address: "2001:db8::107".into(),
                prefix: 64,
                gateway: "2001:db8::1".into(),
                dns_servers: vec![],
            },
        ),
    ])
}

fn bench(c: &mut Criterion) {
    let typical: Metal3DataTemplateSpec =
        serde_saphyr::from_str(TYPICAL).expect("the bench template parses");
    let (host, pools) = (host(), pools());
    let network = typical.network_data.clone().expect("networkData");
    let meta = typical.meta_data.clone().expect("metaData");
    c.bench_function("render/typical/networkData", |b| {
        b.iter(|| render::network_data(&network, &host, &pools).expect("renders"))
    });
    c.bench_function("render/typical/metaData", |b| {
        b.iter(|| render::meta_data(&meta, &host, &pools).expect("renders"))
    });
    c.bench_function("render/typical/referenced_pools", |b| {
        b.iter(|| render::referenced_pools(&typical, Some(&host)).expect("resolves"))
    });

    // 200 metaData strings with long values: the writer's sorting and folding at scale.
    let mut large = meta.clone();
    large.strings = (0..200)
        .map(|i| bitpool::api::metal3_data::MetaDataString {
            key: format!("key-{i}"),
            value: format!("value {i} ").repeat(12),
        })
        .collect();
    c.bench_function("render/large/metaData", |b| {
        b.iter(|| render::meta_data(&large, &host, &pools).expect("renders"))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
