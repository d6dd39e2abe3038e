//! The metaData and networkData renderers and the pool-reference rules, without a cluster.
//!
//! Expected documents were written by `sigs.k8s.io/yaml` v1.6.0 from the maps CAPM3's renderer
//! builds for the same template (CAPM3's own "Full example" first), so a difference here is a
//! difference in a host's secret.

use std::collections::BTreeMap;

use bitpool::api::metal3_data::Metal3DataTemplateSpec;
use bitpool::render::{
    self, Host, ObjectFacts, PoolAddress, PoolAddresses, PoolKind, PoolReference, RenderError,
};
use bitpool::webhook::convert::metal3data::{V1BETA1, V1BETA2, convert};

/// A template spec written as CAPM3's documentation writes them (v1beta1), read as bitpool's
/// v1beta2 types through the conversion webhook's code.
fn template(yaml: &str) -> Metal3DataTemplateSpec {
    let spec: serde_json::Value = serde_saphyr::from_str(yaml).expect("test template parses");
    let object = serde_json::json!({
        "apiVersion": V1BETA1, "kind": "Metal3DataTemplate", "metadata": {"name": "t"}, "spec": spec,
    });
    let hub = convert(object, V1BETA2).expect("the template converts");
    serde_json::from_value(hub["spec"].clone()).expect("the converted template parses")
}

fn host() -> Host {
    Host {
        namespace: "metal3".into(),
        index: 2,
        metal3_machine: ObjectFacts {
            name: "m3m-a".into(),
            labels: BTreeMap::from([("role".into(), "worker".into())]),
            annotations: BTreeMap::from([
                ("pool".into(), "metal3/annotated".into()),
                ("mac".into(), "00:5c:52:31:3a:9c".into()),
            ]),
        },
        machine: ObjectFacts {
            name: "machine-a".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([("rack".into(), "r1".into())]),
        },
        bare_metal_host: ObjectFacts {
            name: "node-0".into(),
            ..Default::default()
        },
        nics: Some(vec![
            ("enp1s0".into(), "00:5c:52:31:3a:9c".into()),
            ("eth0".into(), "aa:bb:cc:dd:ee:01".into()),
        ]),
        boot_mac: Some("00:5c:52:31:3a:9c".into()),
    }
}

fn address(address: &str, prefix: i32, gateway: &str, dns: &[&str]) -> PoolAddress {
    PoolAddress {
        address: address.into(),
        prefix,
        gateway: gateway.into(),
        dns_servers: dns.iter().map(|s| s.to_string()).collect(),
    }
}

fn network_data(
    spec: &Metal3DataTemplateSpec,
    pools: &PoolAddresses,
) -> Result<String, RenderError> {
    render::network_data(
        spec.network_data.as_ref().expect("networkData"),
        &host(),
        pools,
    )
}

#[test]
fn capm3_full_example_renders_byte_for_byte() {
    let spec = template(
        r#"
clusterName: c
networkData:
  links:
    ethernets:
    - {type: phy, id: eth0, mtu: 1500, macAddress: {string: "12:34:56:78:9A:BC"}}
  networks:
    ipv4:
    - id: abc
      link: def
      ipAddressFromIPPool: abc
      routes:
      - {network: 10.0.0.0, prefix: 16, gateway: {string: 192.168.1.1}, services: {dns: [8.8.8.8]}}
  services:
    dns: [8.8.8.8, "2001::8888"]
"#,
    );
    let pools = PoolAddresses::from([("abc".into(), address("192.168.0.14", 24, "", &[]))]);
    let expected = "links:
- ethernet_mac_address: 12:34:56:78:9A:BC
  id: eth0
  mtu: 1500
  type: phy
networks:
- id: abc
  ip_address: 192.168.0.14
  link: def
  netmask: 255.255.255.0
  routes:
  - gateway: 192.168.1.1
    netmask: 255.255.0.0
    network: 10.0.0.0
    services:
    - address: 8.8.8.8
      type: dns
  type: ipv4
services:
- address: 8.8.8.8
  type: dns
- address: 2001::8888
  type: dns
";
    assert_eq!(network_data(&spec, &pools).unwrap(), expected);
}

#[test]
fn bonds_vlans_ipv6_dhcp_and_slaac_render_in_capm3_layout() {
    let spec = template(
        r#"
clusterName: c
networkData:
  links:
    bonds:
    - bondMode: 802.3ad
      bondXmitHashPolicy: layer3+4
      id: bond0
      mtu: 9000
      macAddress: {string: "00:11:22:33:44:55"}
      bondLinks: [eth0, eth1]
      parameters: {miimon: 100, lacp_rate: fast, updelay: 0.5}
    ethernets:
    - {type: phy, id: eth0, macAddress: {fromHostInterface: eth0}}
    - {type: phy, id: eth1, name: storage0, macAddress: {string: AA-BB-CC-DD-EE-02}}
    vlans:
    - {vlanID: 100, id: vlan100, vlanLink: bond0, macAddress: {fromAnnotation: {object: metal3machine, annotation: mac}}}
  networks:
    ipv6:
    - id: v6
      link: bond0
      fromPoolRef: {apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: v6pool}
      routes:
      - network: "::"
        prefix: 0
        gateway: {fromPoolRef: {apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: v6pool}}
        services: {dns: ["2001:db8::53"], dnsFromPoolRef: {apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: v6pool}}
    ipv4DHCP:
    - {id: dhcp4, link: eth0}
    ipv6DHCP:
    - {id: dhcp6, link: eth0}
    ipv6SLAAC:
    - id: slaac
      link: vlan100
      routes:
      - {network: "2001:db8:1::", prefix: 120, gateway: {}}
"#,
    );
    let pools = PoolAddresses::from([(
        "v6pool".into(),
        address("2001:db8::10", 64, "2001:db8::1", &["2001:db8::54"]),
    )]);
    let expected = r#"links:
- bond_lacp_rate: fast
  bond_links:
  - eth0
  - eth1
  bond_miimon: 100
  bond_mode: 802.3ad
  bond_updelay: 0.5
  bond_xmit_hash_policy: layer3+4
  ethernet_mac_address: "00:11:22:33:44:55"
  id: bond0
  mtu: 9000
  type: bond
- ethernet_mac_address: aa:bb:cc:dd:ee:01
  id: eth0
  mtu: 1500
  type: phy
- ethernet_mac_address: AA-BB-CC-DD-EE-02
  id: eth1
  mtu: 1500
  name: storage0
  type: phy
- id: vlan100
  mtu: 1500
  type: vlan
  vlan_id: 100
  vlan_link: bond0
  vlan_mac_address: 00:5c:52:31:3a:9c
networks:
- id: v6
  ip_address: 2001:db8::10
  link: bond0
  netmask: 'ffff:ffff:ffff:ffff::'
  routes:
  - gateway: 2001:db8::1
    netmask: '::'
    network: '::'
    services:
    - address: 2001:db8::53
      type: dns
    - address: 2001:db8::54
      type: dns
  type: ipv6
- id: dhcp4
  link: eth0
  routes: []
  type: ipv4_dhcp
- id: dhcp6
  link: eth0
  routes: []
  type: ipv6_dhcp
- id: slaac
  link: vlan100
  routes:
  - gateway: ""
    netmask: ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00
    network: '2001:db8:1::'
    services: []
  type: ipv6_slaac
services: []
"#;
    assert_eq!(network_data(&spec, &pools).unwrap(), expected);
}

#[test]
fn the_worked_example_collapses_four_references_into_one_metal3_pool() {
    let spec = template(
        r#"
clusterName: test1
metaData:
  ipAddressesFromIPPool: [{key: ip, name: bmv4, apiGroup: ipam.metal3.io, kind: IPPool}]
networkData:
  links: {ethernets: [{type: phy, id: enp1s0, mtu: 1500, macAddress: {fromHostInterface: enp1s0}}]}
  networks:
    ipv4:
    - id: bmv4net
      link: enp1s0
      ipAddressFromIPPool: bmv4
      routes: [{network: 0.0.0.0, prefix: 0, gateway: {fromIPPool: bmv4}, services: {dns: [8.8.8.8]}}]
  services: {dnsFromIPPool: bmv4}
"#,
    );
    let pools = render::referenced_pools(&spec, Some(&host())).unwrap();
    assert_eq!(pools.len(), 1);
    assert_eq!(pools["bmv4"].kind(), PoolKind::Metal3);
    let addresses = PoolAddresses::from([(
        "bmv4".into(),
        address("192.168.111.101", 24, "192.168.111.1", &["192.168.111.1"]),
    )]);
    assert_eq!(
        network_data(&spec, &addresses).unwrap(),
        "links:
- ethernet_mac_address: 00:5c:52:31:3a:9c
  id: enp1s0
  mtu: 1500
  type: phy
networks:
- id: bmv4net
  ip_address: 192.168.111.101
  link: enp1s0
  netmask: 255.255.255.0
  routes:
  - gateway: 192.168.111.1
    netmask: 0.0.0.0
    network: 0.0.0.0
    services:
    - address: 8.8.8.8
      type: dns
  type: ipv4
services:
- address: 192.168.111.1
  type: dns
"
    );
    let meta = render::meta_data(spec.meta_data.as_ref().unwrap(), &host(), &addresses).unwrap();
    assert_eq!(
        meta,
        "ip: 192.168.111.101\nproviderid: metal3/node-0/m3m-a\n"
    );
}

#[test]
fn meta_data_renders_every_source_with_later_sources_winning() {
    let spec = template(
        r#"
clusterName: c
metaData:
  strings: [{key: empty, value: ""}, {key: literal, value: "true"}, {key: role, value: overridden-by-nothing}]
  objectNames:
  - {key: m3m, object: metal3machine}
  - {key: machine, object: machine}
  - {key: bmh, object: baremetalhost}
  - {key: hostname, object: baremetalhost}
  indexes: [{key: index, offset: 10, step: 1, prefix: ctrl-, suffix: -x}]
  namespaces: [{key: ns}]
  ipAddressesFromIPPool: [{key: ip, name: bmv4, apiGroup: "", kind: ""}]
  prefixesFromIPPool: [{key: prefix, name: bmv4, apiGroup: ipam.metal3.io, kind: IPPool}]
  gatewaysFromIPPool: [{key: gw, name: bmv4, apiGroup: ipam.metal3.io, kind: IPPool}]
  dnsServersFromIPPool: [{key: dns, name: bmv4, apiGroup: ipam.metal3.io, kind: IPPool}]
  fromHostInterfaces: [{key: mac, interface: enp1s0}]
  fromLabels: [{key: role, object: metal3machine, label: role}]
  fromAnnotations: [{key: rack, object: machine, annotation: rack}]
"#,
    );
    let pools = PoolAddresses::from([(
        "bmv4".into(),
        address(
            "192.168.111.101",
            24,
            "192.168.111.1",
            &["192.168.111.1", "8.8.8.8"],
        ),
    )]);
    let meta = render::meta_data(spec.meta_data.as_ref().unwrap(), &host(), &pools).unwrap();
    // `role` comes from a string and a label: strings are applied last, as in CAPM3.
    assert_eq!(
        meta,
        r#"bmh: node-0
dns: 192.168.111.1,8.8.8.8
empty: ""
gw: 192.168.111.1
hostname: node-0
index: ctrl-12-x
ip: 192.168.111.101
literal: "true"
m3m: m3m-a
mac: 00:5c:52:31:3a:9c
machine: machine-a
ns: metal3
prefix: "24"
providerid: metal3/node-0/m3m-a
rack: r1
role: overridden-by-nothing
"#
    );
}

#[test]
fn rendering_errors_name_what_is_missing() {
    let nic = template(
        "clusterName: c\nnetworkData: {links: {ethernets: [{type: phy, id: eth9, macAddress: {fromHostInterface: eth9}}]}}\n",
    );
    assert_eq!(
        network_data(&nic, &PoolAddresses::new()),
        Err(RenderError::NicNotFound("eth9".into()))
    );
    let mut no_hardware = host();
    no_hardware.nics = None;
    assert_eq!(
        render::network_data(
            nic.network_data.as_ref().unwrap(),
            &no_hardware,
            &PoolAddresses::new()
        ),
        Err(RenderError::NicsNotPopulated)
    );
    let bad_mac = template(
        "clusterName: c\nnetworkData: {links: {ethernets: [{type: phy, id: eth0, macAddress: {string: 'zz:11:22:33:44:55'}}]}}\n",
    );
    assert_eq!(
        network_data(&bad_mac, &PoolAddresses::new()),
        Err(RenderError::BadMac("zz:11:22:33:44:55".into()))
    );
    let illegal = template(
        "clusterName: c\nnetworkData: {links: {bonds: [{bondMode: active-backup, id: b0, macAddress: {}, bondLinks: [eth0], parameters: {mode: x, links: y, miimon: 1}}]}}\n",
    );
    assert_eq!(
        network_data(&illegal, &PoolAddresses::new())
            .unwrap_err()
            .to_string(),
        r#"illegal params "links", "mode" into bond params blob into link id=b0"#
    );
    let missing_pool = template(
        "clusterName: c\nnetworkData: {networks: {ipv4: [{id: net, link: l, ipAddressFromIPPool: gone}]}}\n",
    );
    assert_eq!(
        network_data(&missing_pool, &PoolAddresses::new()),
        Err(RenderError::PoolNotFound("gone".into()))
    );
    let no_pool =
        template("clusterName: c\nnetworkData: {networks: {ipv6: [{id: v6, link: l}]}}\n");
    assert_eq!(
        network_data(&no_pool, &PoolAddresses::new())
            .unwrap_err()
            .to_string(),
        "network v6 names no pool: set fromPoolRef, ipAddressFromIPPool or fromPoolAnnotation"
    );
}

#[test]
fn pool_references_default_to_metal3_and_refuse_one_name_with_two_kinds() {
    let spec = template(
        r#"
clusterName: c
metaData:
  ipAddressesFromIPPool: [{key: a, name: capi, apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool}]
  gatewaysFromIPPool: [{key: b, name: m3, apiGroup: "", kind: ""}]
networkData:
  networks:
    ipv4:
    - {id: n1, link: l, fromPoolRef: {apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: capi}}
    - {id: n2, link: l, fromPoolAnnotation: {object: metal3machine, annotation: pool}, ipAddressFromIPPool: ignored}
    ipv4DHCP:
    - id: d
      link: l
      routes: [{network: 10.0.0.0, gateway: {fromPoolAnnotation: {object: metal3machine, annotation: pool}}}]
"#,
    );
    let pools = render::referenced_pools(&spec, Some(&host())).unwrap();
    assert_eq!(
        pools.keys().collect::<Vec<_>>(),
        ["annotated", "capi", "m3"],
        "the annotation's pool wins over ipAddressFromIPPool; DHCP gateways from annotations count"
    );
    assert_eq!(pools["capi"].kind(), PoolKind::Capi);
    assert_eq!(
        pools["m3"],
        PoolReference::new(Some("ipam.metal3.io"), "IPPool", "m3")
    );
    // Without the host, annotation pools are unknown (release finds their claims by owner).
    let without_host = render::referenced_pools(&spec, None).unwrap();
    assert_eq!(without_host.keys().collect::<Vec<_>>(), ["capi", "m3"]);

    let conflict = template(
        r#"
clusterName: c
metaData:
  ipAddressesFromIPPool: [{key: a, name: shared, apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool}]
networkData:
  services: {dnsFromIPPool: shared}
"#,
    );
    let error = render::referenced_pools(&conflict, None).unwrap_err();
    assert!(matches!(error, RenderError::ConflictingPoolReferences(_)));
    assert!(
        error
            .to_string()
            .contains("multiple references with the same name but different resource types")
    );

    let mut unannotated = host();
    unannotated.metal3_machine.annotations.clear();
    assert_eq!(
        render::referenced_pools(&spec, Some(&unannotated))
            .unwrap_err()
            .to_string(),
        "annotation pool not found or empty on metal3machine"
    );
}

#[test]
fn netmasks_match_go_for_both_families() {
    let cases = [
        (0, true, "0.0.0.0"),
        (8, true, "255.0.0.0"),
        (23, true, "255.255.254.0"),
        (32, true, "255.255.255.255"),
        (0, false, "::"),
        (48, false, "ffff:ffff:ffff::"),
        (127, false, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"),
    ];
    for (prefix, ipv4, mask) in cases {
        assert_eq!(
            render::netmask(prefix, ipv4).as_deref(),
            Some(mask),
            "/{prefix}"
        );
    }
    assert_eq!(render::netmask(33, true), None);
    assert_eq!(render::netmask(-1, false), None);
}
