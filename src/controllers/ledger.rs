//! The per-pool ledger: the record, written with optimistic concurrency, of every address a
//! pool has handed out. It is what makes the API server the judge of "is this address free":
//! every change is a replace carrying the resourceVersion it was computed from, so a stale
//! writer (another bitpool process, or a stale cache) gets 409 Conflict and recomputes.
//!
//! A ConfigMap holds it: `binaryData.allocated` is a roaring bitmap of all allocated addresses
//! (small at any size), `data.pending` the reservations whose IPAddress is not yet confirmed —
//! address → claim UID, name and time — so that a crash between "ledger says taken" and
//! "IPAddress created" resumes with the same address for the same claim.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

use super::error::Error;
use crate::alloc::set::AddressSet;
use crate::alloc::{Family, family};

const ALLOCATED_KEY: &str = "allocated";
const PENDING_KEY: &str = "pending";
const FAMILY_KEY: &str = "family";
const FORMAT_KEY: &str = "format";
const FORMAT: &str = "1";
pub const LEDGER_LABEL: &str = "ipam.bitpool.dev/ledger";

/// An address reserved for a claim whose IPAddress is not confirmed yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub claim_namespace: String,
    pub claim_name: String,
    pub claim_uid: String,
    /// RFC 3339, when the reservation was made.
    pub since: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ledger {
    pub family: Option<Family>,
    pub allocated: AddressSet,
    /// Canonical address text → reservation.
    pub pending: BTreeMap<String, Reservation>,
}

impl Ledger {
    pub fn from_addresses(addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut ledger = Self::default();
        for address in addresses {
            ledger.insert(address);
        }
        ledger
    }

    /// Records `address` as allocated.
    pub fn insert(&mut self, address: IpAddr) -> bool {
        self.family.get_or_insert(Family::of(address));
        self.allocated.insert(family::to_value(address))
    }

    /// Forgets `address` (allocation and any reservation).
    pub fn remove(&mut self, address: IpAddr) -> bool {
        self.pending.remove(&address.to_string());
        self.allocated.remove(family::to_value(address))
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        self.family.is_none_or(|f| f == Family::of(address))
            && self.allocated.contains(family::to_value(address))
    }

    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let family = self.family.unwrap_or(Family::V4);
        self.allocated.iter().map(move |v| family.address(v))
    }

    /// The reservation held for the claim with this UID.
    pub fn reservation_of(&self, claim_uid: &str) -> Option<(IpAddr, &Reservation)> {
        self.pending
            .iter()
            .find(|(_, r)| r.claim_uid == claim_uid)
            .and_then(|(a, r)| a.parse().ok().map(|a| (a, r)))
    }

    pub fn reserve(&mut self, address: IpAddr, reservation: Reservation) {
        self.insert(address);
        self.pending.insert(address.to_string(), reservation);
    }

    /// Clears the reservation of `address` if it is `claim_uid`'s (its IPAddress exists now).
    pub fn confirm(&mut self, address: IpAddr, claim_uid: &str) -> bool {
        let key = address.to_string();
        if self
            .pending
            .get(&key)
            .is_some_and(|r| r.claim_uid == claim_uid)
        {
            self.pending.remove(&key);
            true
        } else {
            false
        }
    }

    pub fn to_config_map(&self, meta: ObjectMeta) -> ConfigMap {
        let mut data = BTreeMap::from([(FORMAT_KEY.to_string(), FORMAT.to_string())]);
        if let Some(family) = self.family {
            data.insert(FAMILY_KEY.into(), family.to_string());
        }
        // A BTreeMap of plain strings always serializes.
        data.insert(
            PENDING_KEY.into(),
            serde_json::to_string(&self.pending).unwrap_or_else(|_| "{}".into()),
        );
        ConfigMap {
            metadata: meta,
            data: Some(data),
            binary_data: Some(BTreeMap::from([(
                ALLOCATED_KEY.into(),
                ByteString(self.allocated.to_bytes()),
            )])),
            ..Default::default()
        }
    }

    pub fn from_config_map(config_map: &ConfigMap) -> Result<Self, String> {
        let data = config_map.data.clone().unwrap_or_default();
        match data.get(FORMAT_KEY).map(String::as_str) {
            Some(FORMAT) => {}
            other => return Err(format!("unknown ledger format {other:?}")),
        }
        let family = match data.get(FAMILY_KEY).map(String::as_str) {
            None => None,
            Some("IPv4") => Some(Family::V4),
            Some("IPv6") => Some(Family::V6),
            Some(other) => return Err(format!("unknown address family {other:?}")),
        };
        let allocated = match config_map
            .binary_data
            .as_ref()
            .and_then(|b| b.get(ALLOCATED_KEY))
        {
            Some(bytes) => AddressSet::from_bytes(&bytes.0).map_err(|e| e.to_string())?,
            None => AddressSet::default(),
        };
        let pending = match data.get(PENDING_KEY) {
            Some(text) => {
                serde_json::from_str(text).map_err(|e| format!("pending reservations: {e}"))?
            }
            None => BTreeMap::new(),
        };
        Ok(Self {
            family,
            allocated,
            pending,
        })
    }
}

/// A ledger as read from the server, with the version a replace must carry.
#[derive(Clone, Debug)]
pub struct Stored {
    pub ledger: Ledger,
    resource_version: Option<String>,
}

impl Stored {
    /// The server's version of this ledger (changes with every write, by anyone).
    pub fn version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

/// Where one pool's ledger lives.
#[derive(Clone)]
pub struct LedgerRef {
    api: Api<ConfigMap>,
    pub namespace: String,
    pub name: String,
    owner: OwnerReference,
    labels: BTreeMap<String, String>,
}

/// A ConfigMap name for the ledger of pool `kind/name` (hashed when too long for a name).
pub fn ledger_name(kind: &str, pool_name: &str) -> String {
    let name = format!("bitpool-ledger-{}-{pool_name}", kind.to_lowercase());
    if name.len() <= 253 {
        return name;
    }
    // FNV-1a: stable across releases, which a ledger name must be.
    let hash = pool_name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{}-{hash:016x}", &name[..200])
}

impl LedgerRef {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: String,
        owner: OwnerReference,
        pool_label: String,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name,
            owner,
            labels: BTreeMap::from([(LEDGER_LABEL.to_string(), pool_label)]),
        }
    }

    fn meta(&self, resource_version: Option<String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels.clone()),
            owner_references: Some(vec![self.owner.clone()]),
            resource_version,
            ..Default::default()
        }
    }

    /// The ledger as the server has it now (never from a cache).
    pub async fn load(&self) -> Result<Option<Stored>, Error> {
        let Some(config_map) = self.api.get_opt(&self.name).await.map_err(Error::Kube)? else {
            return Ok(None);
        };
        let ledger =
            Ledger::from_config_map(&config_map).map_err(|reason| Error::LedgerCorrupt {
                ledger: format!("{}/{}", self.namespace, self.name),
                reason,
            })?;
        Ok(Some(Stored {
            ledger,
            resource_version: config_map.metadata.resource_version,
        }))
    }

    /// Creates the ledger; `None` when another writer created it first (load it again).
    pub async fn create(&self, ledger: &Ledger) -> Result<Option<Stored>, Error> {
        match self
            .api
            .create(
                &PostParams::default(),
                &ledger.to_config_map(self.meta(None)),
            )
            .await
        {
            Ok(created) => Ok(Some(Stored {
                ledger: ledger.clone(),
                resource_version: created.metadata.resource_version,
            })),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// Replaces the ledger if nobody wrote it since `stored` was read; `None` on a conflict.
    pub async fn replace(&self, stored: &Stored, ledger: &Ledger) -> Result<Option<Stored>, Error> {
        let config_map = ledger.to_config_map(self.meta(stored.resource_version.clone()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &config_map)
            .await
        {
            Ok(replaced) => Ok(Some(Stored {
                ledger: ledger.clone(),
                resource_version: replaced.metadata.resource_version,
            })),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(e) => Err(Error::Kube(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn reservation(uid: &str) -> Reservation {
        Reservation {
            claim_namespace: "ns".into(),
            claim_name: format!("claim-{uid}"),
            claim_uid: uid.into(),
            since: "2026-11-30T04:00:00Z".into(),
        }
    }

    #[test]
    fn ledgers_round_trip_through_a_config_map() {
        let mut ledger = Ledger::from_addresses(["10.0.0.1", "10.0.0.2", "10.0.0.9"].map(ip));
        ledger.reserve(ip("10.0.0.3"), reservation("u3"));
        let config_map = ledger.to_config_map(ObjectMeta::default());
        let read = Ledger::from_config_map(&config_map).expect("decodes");
        assert_eq!(read, ledger);
        assert_eq!(
            read.reservation_of("u3").map(|(a, _)| a),
            Some(ip("10.0.0.3"))
        );
        assert_eq!(read.addresses().count(), 4);
        let json = serde_json::to_string(&config_map).expect("serializes");
        assert!(json.len() < 400, "a small ledger stays small: {json}");
    }

    #[test]
    fn confirm_and_remove_touch_only_the_named_reservation() {
        let mut ledger = Ledger::default();
        ledger.reserve(ip("fd00::1"), reservation("a"));
        ledger.reserve(ip("fd00::2"), reservation("b"));
        assert!(
            !ledger.confirm(ip("fd00::1"), "b"),
            "b's confirmation cannot clear a's reservation"
        );
        assert!(ledger.confirm(ip("fd00::1"), "a"));
        assert!(
            ledger.contains(ip("fd00::1")),
            "confirmed addresses stay allocated"
        );
        assert!(ledger.remove(ip("fd00::2")));
        assert!(ledger.pending.is_empty() && !ledger.contains(ip("fd00::2")));
        assert!(
            !ledger.contains(ip("10.0.0.1")),
            "another family is never contained"
        );
    }

    #[test]
    fn corrupt_ledgers_are_reported_not_guessed() {
        let mut config_map = Ledger::default().to_config_map(ObjectMeta::default());
        if let Some(data) = config_map.data.as_mut() {
            data.insert(PENDING_KEY.into(), "{not json".into());
        }
        assert!(
            Ledger::from_config_map(&config_map)
                .unwrap_err()
                .contains("pending")
        );
        assert!(
            Ledger::from_config_map(&ConfigMap::default())
                .unwrap_err()
                .contains("format")
        );
    }

    #[test]
    fn ledger_names_fit_a_kubernetes_name() {
        assert_eq!(
            ledger_name("InClusterIPPool", "a"),
            "bitpool-ledger-inclusterippool-a"
        );
        let long = "x".repeat(253);
        let name = ledger_name("GlobalInClusterIPPool", &long);
        assert!(name.len() <= 253);
        assert_ne!(name, ledger_name("GlobalInClusterIPPool", &"y".repeat(253)));
    }
}
