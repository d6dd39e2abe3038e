//! The cached objects against the objects they come from.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::ObjectMeta;

use super::*;
use crate::api::capi::{IPAddressClaim, IPAddressSpec, LocalObjectName};
use crate::api::labels;
use crate::api::metal3_ipam::IPClaim;

fn capi_address() -> IPAddress {
    IPAddress {
        metadata: ObjectMeta {
            name: Some("m-1".into()),
            namespace: Some("metal3".into()),
            uid: Some("u-1".into()),
            resource_version: Some("7".into()),
            finalizers: Some(vec!["ipam.cluster.x-k8s.io/ProtectAddress".into()]),
            labels: Some([("cluster.x-k8s.io/cluster-name".into(), "c".into())].into()),
            owner_references: Some(vec![
                OwnerReference {
                    api_version: "ipam.cluster.x-k8s.io/v1beta2".into(),
                    kind: "IPAddressClaim".into(),
                    name: "m-1".into(),
                    uid: "claim-1".into(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                },
                OwnerReference {
                    api_version: "ipam.cluster.x-k8s.io/v1alpha2".into(),
                    kind: "InClusterIPPool".into(),
                    name: "p".into(),
                    uid: "pool-1".into(),
                    controller: None,
                    block_owner_deletion: Some(true),
                },
            ]),
            ..Default::default()
        },
        spec: IPAddressSpec {
            claim_ref: LocalObjectName { name: "m-1".into() },
            pool_ref: IPPoolReference {
                name: "p".into(),
                kind: "InClusterIPPool".into(),
                api_group: "ipam.cluster.x-k8s.io".into(),
            },
            address: "10.0.0.4".into(),
            prefix: 24,
            gateway: Some("10.0.0.1".into()),
        },
    }
}

/// What is read of the object survives the trip into the cache: the metadata a repair
/// compares is the object's own.
#[test]
fn a_cached_address_keeps_what_bitpool_reads() {
    let object = capi_address();
    let cached = AddressObject::of_capi(&object).expect("named and namespaced");
    assert_eq!(cached.meta.object_meta(), object.metadata);
    assert_eq!(&*cached.address, "10.0.0.4");
    assert_eq!(cached.prefix(), Some(24));
    assert_eq!(cached.gateway(), Some("10.0.0.1"));
    assert_eq!(*cached.pool(), object.spec.pool_ref);
    assert!(Arc::ptr_eq(&cached.claim, &cached.meta.name));
    assert!(
        cached
            .meta
            .has_finalizer("ipam.cluster.x-k8s.io/ProtectAddress")
    );
    assert_eq!(
        cached.meta.label("cluster.x-k8s.io/cluster-name"),
        Some("c")
    );
}

/// The pool's reference, its owner entry, the labels, finalizers and network are one copy
/// for every address of the pool; the controller (the claim) is each address's own.
#[test]
fn addresses_of_one_pool_share_its_reference() {
    let (a, mut b) = (capi_address(), capi_address());
    b.metadata.name = Some("m-2".into());
    b.spec.claim_ref.name = "m-2".into();
    (b.metadata.owner_references.as_mut().expect("owners")[0]).name = "m-2".into();
    let (a, b) = (
        AddressObject::of_capi(&a).expect("cached"),
        AddressObject::of_capi(&b).expect("cached"),
    );
    assert!(Arc::ptr_eq(&a.meta.shared, &b.meta.shared));
    assert!(Arc::ptr_eq(&a.network, &b.network));
    let controller = a.meta.controller().expect("a controller");
    assert!(Arc::ptr_eq(&controller.name, &a.meta.name));
    assert!(Arc::ptr_eq(&a.claim, &a.meta.name));
    assert_eq!(&*b.meta.controller().expect("a controller").name, "m-2");
}

/// The owners come back in their order wherever the controller is among them.
#[test]
fn owners_keep_their_order() {
    let object = capi_address();
    let references = object.metadata.owner_references.clone().expect("owners");
    for order in [[0, 1], [1, 0]] {
        let mut object = object.clone();
        object.metadata.owner_references = Some(order.map(|i| references[i].clone()).into());
        let cached = AddressObject::of_capi(&object).expect("cached");
        assert_eq!(
            cached.meta.object_meta(),
            object.metadata,
            "order {order:?}"
        );
    }
    let mut plain = object.clone();
    plain.metadata.owner_references = Some(vec![references[1].clone()]);
    let cached = AddressObject::of_capi(&plain).expect("cached");
    assert!(cached.meta.controller().is_none());
    assert_eq!(cached.meta.object_meta(), plain.metadata);
}

/// A time comes back to the second (all the API server keeps of one); none is none.
#[test]
fn stamps_keep_a_time_to_the_second() {
    use k8s_openapi::jiff::Timestamp;
    for seconds in [0, 1_764_756_000, -86_400, Timestamp::MAX.as_second()] {
        let time = Time(Timestamp::from_second(seconds).expect("a time"));
        assert_eq!(Stamp::of(Some(&time)).time(), Some(time));
    }
    let fraction = Time(Timestamp::new(1_764_756_000, 5).expect("a time"));
    assert_eq!(
        Stamp::of(Some(&fraction))
            .timestamp()
            .map(|t| t.as_second()),
        Some(1_764_756_000)
    );
    assert_eq!(Stamp::of(None).time(), None);
}

/// A resource version comes back as it was written, whatever its form.
#[test]
fn resource_versions_come_back_unchanged() {
    for text in [
        "7",
        "18446744073709551615",
        "007",
        "+7",
        "18446744073709551616",
        "a1",
        "",
    ] {
        assert_eq!(Version::of(text).to_string(), text);
    }
    assert_eq!(Version::of("123").number(), Some(123));
    assert_eq!(Version::of("0123").number(), None);
    assert!(Version::of("").is_empty());
    assert!(!Version::of("0").is_empty());
}

/// A UID comes back as it was written, whatever its form.
#[test]
fn uids_come_back_unchanged() {
    for text in [
        "5f8a1c3e-2b1d-4c6e-9f0a-00000000002a",
        "5F8A1C3E-2B1D-4C6E-9F0A-00000000002A",
        "5f8a1c3e-2b1d-4c6e-9f0a-00000000002",
        "5f8a1c3e2b1d-4c6e-9f0a--00000000002a",
        "u-1",
        "",
    ] {
        assert_eq!(Uid::of(text).to_string(), text);
    }
    assert!(matches!(
        Uid::of("5f8a1c3e-2b1d-4c6e-9f0a-00000000002a"),
        Uid::Uuid(_)
    ));
    assert!(matches!(
        Uid::of("5F8A1C3E-2B1D-4C6E-9F0A-00000000002A"),
        Uid::Other(_)
    ));
}

fn capi_claim() -> IPAddressClaim {
    let condition = |type_: &str, status: &str| Condition {
        type_: type_.into(),
        status: status.into(),
        reason: "AddressAllocated".into(),
        message: "allocated 10.0.0.4".into(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: Some(2),
    };
    IPAddressClaim {
        metadata: ObjectMeta {
            name: Some("m-1".into()),
            namespace: Some("metal3".into()),
            uid: Some("5f8a1c3e-2b1d-4c6e-9f0a-00000000002a".into()),
            generation: Some(2),
            annotations: Some(
                [(
                    metal3_ipam::REQUESTED_ADDRESS_ANNOTATION.to_string(),
                    "10.0.0.4".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: crate::api::capi::IPAddressClaimSpec {
            cluster_name: Some("c".into()),
            pool_ref: capi_address().spec.pool_ref,
        },
        status: Some(crate::api::capi::IPAddressClaimStatus {
            address_ref: Some(LocalObjectName { name: "m-1".into() }),
            conditions: vec![condition("Ready", "True"), condition("Other", "False")],
            ..Default::default()
        }),
    }
}

/// A cached claim keeps what a status patch writes back (every condition, as it was) and
/// what a reconcile reads; its address object's name is its own name, shared.
#[test]
fn a_cached_claim_keeps_what_bitpool_reads_and_writes_back() {
    let object = capi_claim();
    let cached = ClaimObject::of_capi(&object).expect("named and namespaced");
    let status = object.status.as_ref().expect("a status");
    assert_eq!(cached.conditions(), status.conditions);
    assert!(Arc::ptr_eq(
        cached.address.as_ref().expect("an address"),
        &cached.meta.name
    ));
    assert_eq!(cached.generation(), Some(2));
    assert_eq!(cached.spec_cluster_name(), Some("c"));
    assert_eq!(cached.requested_address(), Some("10.0.0.4"));
    assert!(!cached.paused());
    assert_eq!(cached.meta.object_meta().uid, object.metadata.uid);
    let other = ClaimObject::of_capi(&object).expect("cached");
    assert!(Arc::ptr_eq(
        &cached.conditions[0].head,
        &other.conditions[0].head
    ));
}

/// Only the pause annotation's values other than bitpool's own pause a claim for bitpool;
/// a claim without pause, requested address or error keeps no room for them.
#[test]
fn a_claim_is_paused_by_any_pause_value_but_bitpools() {
    let mut object = capi_claim();
    object.metadata.annotations = None;
    let plain = ClaimObject::of_capi(&object).expect("cached");
    assert!(plain.rare.is_none() && !plain.paused());
    for (value, paused) in [
        ("", true),
        ("true", true),
        (labels::HANDED_TO_BITPOOL, false),
    ] {
        object.metadata.annotations =
            Some([(labels::PAUSED.to_string(), value.to_string())].into());
        let cached = ClaimObject::of_capi(&object).expect("cached");
        assert_eq!(cached.paused(), paused, "pause annotation {value:?}");
    }
}

/// A Metal3 claim naming a pool of another namespace is marked so (upstream never serves
/// one), and its error message is kept.
#[test]
fn a_metal3_claim_keeps_its_pool_namespace_and_error() {
    let claim = IPClaim {
        metadata: ObjectMeta {
            name: Some("c".into()),
            namespace: Some("metal3".into()),
            ..Default::default()
        },
        spec: metal3_ipam::IPClaimSpec {
            pool: k8s_openapi::api::core::v1::ObjectReference {
                name: Some("p".into()),
                namespace: Some("other".into()),
                ..Default::default()
            },
        },
        status: Some(metal3_ipam::IPClaimStatus {
            address: None,
            error_message: Some("Exhausted IP Pools".into()),
        }),
    };
    let cached = ClaimObject::of_metal3(&claim).expect("cached");
    assert!(cached.pool_elsewhere());
    assert_eq!(&*cached.pool().name, "p");
    assert_eq!(cached.error_message(), Some("Exhausted IP Pools"));
    let mut here = claim.clone();
    here.spec.pool.namespace = Some("metal3".into());
    assert!(
        !ClaimObject::of_metal3(&here)
            .expect("cached")
            .pool_elsewhere()
    );
}

#[test]
fn an_object_without_a_namespace_is_not_cached() {
    let mut object = capi_address();
    object.metadata.namespace = None;
    assert!(AddressObject::of_capi(&object).is_none());
}
