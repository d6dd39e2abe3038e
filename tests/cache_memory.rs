//! How many bytes the watch caches hold per object, counted by the allocator: a cached object
//! that grows past its bound fails here, long before a hundred thousand of them would pass the
//! memory limit (BENCHMARKS.md has the process's peak RSS). No cluster: the objects are decoded
//! from the JSON the API server sends, as the watch decodes them. One test in this binary: the
//! count is the whole process's, and a second test running beside it would be counted too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use bitpool::api::capi::{IPAddress, IPAddressClaim};
use bitpool::api::metal3_ipam::{IPClaim, Metal3IPAddress};
use bitpool::runtime::cached::{AddressObject, ClaimObject};
use bitpool::runtime::index::Cached;
use bitpool::runtime::watched::Watched;
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

/// A claim's status as bitpool writes it at v1beta2: its address, the Ready condition, and the
/// v1beta1 shape of it under `deprecated`.
fn claim_status(i: usize) -> Value {
    json!({
        "addressRef": {"name": format!("test1-workers-{i:06}-provisioning")},
        "conditions": [{"type": "Ready", "status": "True", "reason": "AddressAllocated",
                        "message": format!("allocated 10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
                        "lastTransitionTime": "2026-12-03T10:00:01Z", "observedGeneration": 1}],
        "deprecated": {"v1beta1": {"conditions": [{"type": "Ready", "status": "True",
                        "lastTransitionTime": "2026-12-03T10:00:01Z"}]}}
    })
}

/// A claim as CAPM3 makes it for a Metal3Data: owned by the Metal3Data, with the finalizers of
/// the Metal3Data and of the provider.
fn claim_metadata(prefix: &str, i: usize, finalizer: &str) -> Value {
    let owners = json!([
        {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Data",
         "name": format!("test1-workers-template-{i}"),
         "uid": format!("9f8a1c3e-2b1d-4c6e-9f0a-{i:012}"), "controller": true, "blockOwnerDeletion": true}
    ]);
    let mut metadata = metadata(prefix, i, owners);
    metadata["finalizers"] = json!(["metal3data.infrastructure.cluster.x-k8s.io", finalizer]);
    metadata
}

fn capi_claim(i: usize) -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim",
        "metadata": claim_metadata("5f8a1c3e", i, "ipam.cluster.x-k8s.io/ReleaseAddress"),
        "spec": {
            "clusterName": "test1",
            "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "provisioning"}
        },
        "status": claim_status(i)
    })
}

fn metal3_claim(i: usize) -> Value {
    json!({
        "apiVersion": "ipam.metal3.io/v1alpha1", "kind": "IPClaim",
        "metadata": claim_metadata("4f8a1c3e", i, "ipclaim.ipam.metal3.io"),
        "spec": {"pool": {"name": "provisioning", "namespace": "metal3"}},
        "status": {"address": {"name": format!("provisioning-10-{}-{}-{}", i >> 16, (i >> 8) & 255, i & 255),
                               "namespace": "metal3"}}
    })
}

/// Bytes the cache holds per object once `OBJECTS` of them, made by `make`, are loaded.
fn cached_bytes<K, T: Cached>(make: fn(usize) -> Value, convert: fn(&K) -> Option<T>) -> usize
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
/// 2,000 bytes (1,400 without managed fields); the cached one keeps what bitpool reads, and
/// shares with the other addresses of its pool what they have alike.
const ADDRESS_BOUND: usize = 340;
/// Bound on a cached claim of either API (issue 54's 400 bytes); a CAPI claim keeps its
/// conditions whole (a status patch writes the list whole).
const CLAIM_BOUND: usize = 400;

struct Measured {
    what: &'static str,
    cached: usize,
    reflector: usize,
    bound: usize,
}

#[test]
fn cached_objects_stay_within_their_bounds() {
    let measured = [
        Measured {
            what: "CAPI IPAddress",
            cached: cached_bytes::<IPAddress, _>(capi_address, AddressObject::of_capi),
            reflector: reflector_bytes::<IPAddress>(capi_address),
            bound: ADDRESS_BOUND,
        },
        Measured {
            what: "Metal3 IPAddress",
            cached: cached_bytes::<Metal3IPAddress, _>(metal3_address, AddressObject::of_metal3),
            reflector: reflector_bytes::<Metal3IPAddress>(metal3_address),
            bound: ADDRESS_BOUND,
        },
        Measured {
            what: "IPAddressClaim",
            cached: cached_bytes::<IPAddressClaim, _>(capi_claim, ClaimObject::of_capi),
            reflector: reflector_bytes::<IPAddressClaim>(capi_claim),
            bound: CLAIM_BOUND,
        },
        Measured {
            what: "Metal3 IPClaim",
            cached: cached_bytes::<IPClaim, _>(metal3_claim, ClaimObject::of_metal3),
            reflector: reflector_bytes::<IPClaim>(metal3_claim),
            bound: CLAIM_BOUND,
        },
    ];
    for m in &measured {
        println!(
            "bytes per cached {}: {} (reflector store: {})",
            m.what, m.cached, m.reflector
        );
    }
    for m in &measured {
        assert!(
            m.cached * 5 <= m.reflector,
            "a cached {} takes {} bytes, more than a fifth of the {} a reflector store would",
            m.what,
            m.cached,
            m.reflector
        );
        assert!(
            m.cached <= m.bound,
            "a cached {} takes {} bytes, over its bound of {}",
            m.what,
            m.cached,
            m.bound
        );
    }
}
