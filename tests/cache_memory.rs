//! How many bytes the watch caches hold per object, counted by the allocator: a cached object
//! that grows past its bound fails here, long before a hundred thousand of them would pass the
//! memory limit (BENCHMARKS.md has the process's peak RSS). No cluster: the objects are decoded
//! from the JSON the API server sends, as the watch decodes them. One test in this binary: the
//! count is the whole process's, and a second test running beside it would be counted too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use bitpool::api::capi::IPAddress;
use bitpool::api::metal3_ipam::Metal3IPAddress;
use bitpool::runtime::cached::AddressObject;
use bitpool::runtime::index::Watched;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Counts the bytes live on the heap.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Objects per measurement: enough that the maps' growth steps average out.
const OBJECTS: usize = 20_000;

/// The metadata an object of `kind` has as Cluster API and CAPM3 leave it, with managed fields.
/// `prefix` (8 hex digits) starts the UIDs the API server would have given.
fn metadata(prefix: &str, i: usize, owners: Value) -> Value {
    json!({
        "name": format!("test1-workers-{i:06}-provisioning"),
        "namespace": "metal3",
        "uid": format!("{prefix}-2b1d-4c6e-9f0a-{i:012}"),
        "resourceVersion": format!("{}", 1_000_000 + i),
        "generation": 1,
        "creationTimestamp": "2026-12-03T10:00:00Z",
        "labels": {"cluster.x-k8s.io/cluster-name": "test1"},
        "finalizers": ["ipam.cluster.x-k8s.io/ProtectAddress"],
        "ownerReferences": owners,
        "managedFields": [{
            "manager": "bitpool", "operation": "Apply", "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "time": "2026-12-03T10:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:address": {}, "f:prefix": {}, "f:gateway": {}, "f:claimRef": {}}}
        }]
    })
}

fn capi_address(i: usize) -> Value {
    let owners = json!([
        {"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
         "name": format!("test1-workers-{i:06}-provisioning"),
         "uid": format!("5f8a1c3e-2b1d-4c6e-9f0a-{i:012}"), "controller": true, "blockOwnerDeletion": true},
        {"apiVersion": "ipam.cluster.x-k8s.io/v1alpha2", "kind": "InClusterIPPool",
         "name": "provisioning", "uid": "8f8a1c3e-2b1d-4c6e-9f0a-000000000001", "blockOwnerDeletion": true}
    ]);
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
        "metadata": metadata("6f8a1c3e", i, owners),
        "spec": {
            "address": format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
            "prefix": 8, "gateway": "10.0.0.1",
            "claimRef": {"name": format!("test1-workers-{i:06}-provisioning")},
            "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "provisioning"}
        }
    })
}

fn metal3_address(i: usize) -> Value {
    let owners = json!([
        {"apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPClaim",
         "name": format!("test1-workers-{i:06}-provisioning"),
         "uid": format!("5f8a1c3e-2b1d-4c6e-9f0a-{i:012}"), "controller": true, "blockOwnerDeletion": true},
        {"apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPPool",
         "name": "provisioning", "uid": "8f8a1c3e-2b1d-4c6e-9f0a-000000000001", "blockOwnerDeletion": true}
    ]);
    let address = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
    let mut metadata = metadata("7f8a1c3e", i, owners);
    metadata["name"] = json!(format!("provisioning-{}", address.replace('.', "-")));
    metadata["labels"]["ippool.infrastructure.cluster.x-k8s.io/name"] = json!("provisioning");
    json!({
        "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPAddress",
        "metadata": metadata,
        "spec": {
            "address": address, "prefix": 8, "gateway": "10.0.0.1", "dnsServers": ["10.0.0.2"],
            "claim": {"name": format!("test1-workers-{i:06}-provisioning"), "namespace": "metal3"},
            "pool": {"name": "provisioning", "namespace": "metal3"}
        }
    })
}

/// Bytes the cache holds per object once `OBJECTS` of them, made by `make`, are loaded.
fn cached_bytes<K>(make: fn(usize) -> Value, convert: fn(&K) -> Option<AddressObject>) -> usize
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let bodies: Vec<String> = (0..OBJECTS).map(|i| make(i).to_string()).collect();
    let cache = Watched::new(convert);
    let before = LIVE.load(Ordering::SeqCst);
    cache.load(
        bodies
            .iter()
            .map(|body| serde_json::from_str::<K>(body).expect("a valid object")),
    );
    let held = LIVE.load(Ordering::SeqCst) - before;
    assert_eq!(cache.index.len(), OBJECTS, "every object is cached");
    held.max(0) as usize / OBJECTS
}

/// Bytes per object the same objects took in a kube reflector store, managed fields dropped:
/// how bitpool cached them before it had types of its own.
fn reflector_bytes<K>(make: fn(usize) -> Value) -> usize
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
{
    let bodies: Vec<String> = (0..OBJECTS).map(|i| make(i).to_string()).collect();
    let (store, mut writer) = kube::runtime::reflector::store::<K>();
    let before = LIVE.load(Ordering::SeqCst);
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
    for body in &bodies {
        let mut object = serde_json::from_str::<K>(body).expect("a valid object");
        object.meta_mut().managed_fields = None;
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
    let held = LIVE.load(Ordering::SeqCst) - before;
    assert_eq!(store.state().len(), OBJECTS, "every object is stored");
    held.max(0) as usize / OBJECTS
}

/// Bound on a cached address object of either API. The object kube decodes takes about
/// 2,000 bytes (1,400 without managed fields); the cached one keeps what bitpool reads.
const ADDRESS_BOUND: usize = 560;

#[test]
fn a_cached_address_object_stays_within_its_bound() {
    let capi = cached_bytes::<IPAddress>(capi_address, AddressObject::of_capi);
    let metal3 = cached_bytes::<Metal3IPAddress>(metal3_address, AddressObject::of_metal3);
    let (capi_before, metal3_before) = (
        reflector_bytes::<IPAddress>(capi_address),
        reflector_bytes::<Metal3IPAddress>(metal3_address),
    );
    println!(
        "bytes per cached address object: CAPI {capi} (reflector store: {capi_before}), Metal3 {metal3} (reflector store: {metal3_before})"
    );
    assert!(
        capi * 3 <= capi_before && metal3 * 3 <= metal3_before,
        "the cache holds at most a third of what a reflector store would"
    );
    assert!(
        capi <= ADDRESS_BOUND,
        "a cached CAPI IPAddress takes {capi} bytes, over its bound of {ADDRESS_BOUND}"
    );
    assert!(
        metal3 <= ADDRESS_BOUND,
        "a cached Metal3 IPAddress takes {metal3} bytes, over its bound of {ADDRESS_BOUND}"
    );
}
