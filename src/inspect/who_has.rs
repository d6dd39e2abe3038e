//! `bitpool who-has ADDRESS|PREFIX`: which address objects hold an address (or anything in a
//! prefix), for which claim, and what owns that claim: across both APIs and every namespace.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde::Serialize;

use super::snapshot::Snapshot;
use crate::api::labels;
use crate::ipam::key::{PoolKey, PoolKind};

/// What `who-has` is asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query(IpNet);

impl std::str::FromStr for Query {
    type Err = String;

    /// An address (`10.0.4.17`, `fd00::5`) or a prefix (`10.0.4.0/24`).
    fn from_str(text: &str) -> Result<Self, String> {
        if let Ok(net) = text.parse::<IpNet>() {
            return Ok(Self(net));
        }
        text.parse::<IpAddr>()
            .map(|ip| Self(IpNet::from(ip)))
            .map_err(|_| format!("{text:?} is neither an address nor a prefix"))
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.prefix_len() == self.0.max_prefix_len() {
            true => write!(f, "{}", self.0.addr()),
            false => write!(f, "{}", self.0),
        }
    }
}

/// One holder of an address the query names.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holding {
    /// The address, or a prefix pool's sub-prefix, with its length.
    pub address: String,
    /// `IPAddress` (Cluster API) or `IPAddress.ipam.metal3.io`; `ledger` for a reservation whose
    /// object is not created yet.
    pub object: String,
    pub namespace: String,
    pub name: String,
    /// `<kind>/<name>` of the pool it is from.
    pub pool: String,
    /// `<kind>/<name>` of the claim it answers.
    pub claim: String,
    /// `<kind>/<name>` of each owner of that claim (Machine, Metal3Data, BareMetalHost, …).
    pub claim_owners: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Whether the object (or its claim) is being deleted.
    pub deleting: bool,
}

/// Every holder, by address object or pending reservation, of an address in `query`.
pub fn who_has(snapshot: &Snapshot, query: Query) -> Vec<Holding> {
    let mut holdings: Vec<Holding> = capi_holdings(snapshot, query)
        .chain(metal3_holdings(snapshot, query))
        .chain(reserved_holdings(snapshot, query))
        .collect();
    holdings.sort_by_cached_key(|h| {
        (
            address_order(&h.address),
            h.namespace.clone(),
            h.name.clone(),
        )
    });
    holdings
}

/// An address or prefix as text, read back: it sorts in numeric order (IPv4 first), not as
/// text does.
fn address_order(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

/// What an address object holds: its address, or for a prefix pool its whole sub-prefix.
fn held(address: &str, prefix: Option<i32>, pool_kind: Option<PoolKind>) -> Option<IpNet> {
    let ip: IpAddr = address.parse().ok()?;
    match (pool_kind.is_some_and(PoolKind::is_prefix), prefix) {
        (true, Some(length)) => IpNet::new(ip, u8::try_from(length).ok()?)
            .ok()
            .map(|net| net.trunc()),
        _ => Some(IpNet::from(ip)),
    }
}

fn overlaps(a: IpNet, b: IpNet) -> bool {
    a.contains(&b) || b.contains(&a)
}

fn capi_holdings(snapshot: &Snapshot, query: Query) -> impl Iterator<Item = Holding> + '_ {
    snapshot.addresses.iter().filter_map(move |address| {
        let namespace = address.namespace()?;
        let key = PoolKey::of_address(address);
        let net = held(
            &address.spec.address,
            Some(address.spec.prefix),
            key.as_ref().map(|k| k.kind),
        )?;
        if !overlaps(net, query.0) {
            return None;
        }
        let claim = snapshot.claims.iter().find(|c| {
            c.namespace().as_deref() == Some(&namespace)
                && c.name_any() == address.spec.claim_ref.name
        });
        Some(Holding {
            address: shown(net, key.as_ref()),
            object: "IPAddress".into(),
            name: address.name_any(),
            pool: format!(
                "{}/{}",
                address.spec.pool_ref.kind, address.spec.pool_ref.name
            ),
            claim: format!("IPAddressClaim/{}", address.spec.claim_ref.name),
            claim_owners: claim.map(|c| owners(c.meta())).unwrap_or_default(),
            cluster: claim.and_then(|c| {
                c.spec
                    .cluster_name
                    .clone()
                    .filter(|n| !n.is_empty())
                    .or_else(|| cluster_label(c.meta()))
            }),
            deleting: address.meta().deletion_timestamp.is_some()
                || claim.is_some_and(|c| c.meta().deletion_timestamp.is_some()),
            namespace,
        })
    })
}

fn metal3_holdings(snapshot: &Snapshot, query: Query) -> impl Iterator<Item = Holding> + '_ {
    snapshot.metal3_addresses.iter().filter_map(move |address| {
        let namespace = address.namespace()?;
        let net = held(&address.spec.address, None, None)?;
        if !overlaps(net, query.0) {
            return None;
        }
        let claim_name = address.spec.claim.name.clone().unwrap_or_default();
        let claim = snapshot
            .ipclaims
            .iter()
            .find(|c| c.namespace().as_deref() == Some(&namespace) && c.name_any() == claim_name);
        Some(Holding {
            address: net.addr().to_string(),
            object: "IPAddress.ipam.metal3.io".into(),
            name: address.name_any(),
            pool: format!(
                "IPPool/{}",
                address.spec.pool.name.clone().unwrap_or_default()
            ),
            claim: format!("IPClaim/{claim_name}"),
            claim_owners: claim.map(|c| owners(c.meta())).unwrap_or_default(),
            cluster: claim.and_then(|c| cluster_label(c.meta())),
            deleting: address.meta().deletion_timestamp.is_some()
                || claim.is_some_and(|c| c.meta().deletion_timestamp.is_some()),
            namespace,
        })
    })
}

/// Reservations in the ledgers whose address object is not created yet: held all the same.
fn reserved_holdings(snapshot: &Snapshot, query: Query) -> impl Iterator<Item = Holding> + '_ {
    snapshot.pools.iter().flat_map(move |pool| {
        let key = pool.key();
        let objects = snapshot.addresses_of(&key);
        let ledger = snapshot
            .ledger_of(pool)
            .and_then(|l| l.record.as_ref().ok());
        ledger
            .into_iter()
            .flat_map(|ledger| ledger.pending.iter())
            .filter_map(move |(number, reservation)| {
                let number: IpAddr = number.parse().ok()?;
                if objects.iter().any(|o| pool.held(o) == Some(number)) {
                    return None;
                }
                let text = pool.show(number);
                let net = address_order(&text)?;
                overlaps(net, query.0).then(|| Holding {
                    address: text,
                    object: "ledger".into(),
                    namespace: reservation.claim_namespace.clone(),
                    name: String::new(),
                    pool: format!("{}/{}", key.kind, key.name),
                    claim: format!("{}/{}", claim_kind_of(key.kind), reservation.claim_name),
                    claim_owners: Vec::new(),
                    cluster: None,
                    deleting: false,
                })
            })
            .collect::<Vec<_>>()
    })
}

/// The claim kind a reservation in a pool of `kind` is for, as far as the ledger says: a
/// Metal3 pool serves both, and its reservations name the claim without its kind.
fn claim_kind_of(kind: PoolKind) -> &'static str {
    match kind {
        PoolKind::Metal3IPPool => "claim",
        _ => "IPAddressClaim",
    }
}

/// A held network as people read it: an address alone, a sub-prefix with its length.
fn shown(net: IpNet, key: Option<&PoolKey>) -> String {
    match key.is_some_and(|k| k.kind.is_prefix()) {
        true => net.to_string(),
        false => net.addr().to_string(),
    }
}

fn owners(meta: &ObjectMeta) -> Vec<String> {
    meta.owner_references
        .iter()
        .flatten()
        .map(|o| format!("{}/{}", o.kind, o.name))
        .collect()
}

fn cluster_label(meta: &ObjectMeta) -> Option<String> {
    meta.labels.as_ref()?.get(labels::CLUSTER_NAME).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi_pools::{InClusterPrefixPool, InClusterPrefixPoolSpec};
    use crate::inspect::AnyPool;
    use crate::inspect::fixtures::*;

    fn query(text: &str) -> Query {
        text.parse().expect("a query")
    }

    fn held(snapshot: &Snapshot, text: &str) -> Vec<(String, String)> {
        who_has(snapshot, query(text))
            .into_iter()
            .map(|h| (h.address, format!("{}/{}", h.object, h.name)))
            .collect()
    }

    #[test]
    fn an_address_names_its_object_claim_and_the_claims_owners() {
        let mut snapshot = settled();
        snapshot.claims[0].metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: "Metal3Data".into(),
                name: "node-a-data".into(),
                ..Default::default()
            },
        ]);
        snapshot.claims[0].metadata.labels =
            Some([(labels::CLUSTER_NAME.to_string(), "prod".to_string())].into());
        let found = who_has(&snapshot, query("10.0.0.1"));
        assert_eq!(found.len(), 1, "{found:?}");
        let holding = &found[0];
        assert_eq!(
            (
                holding.address.as_str(),
                holding.name.as_str(),
                holding.pool.as_str(),
                holding.claim.as_str()
            ),
            ("10.0.0.1", "a", "InClusterIPPool/p", "IPAddressClaim/a")
        );
        assert_eq!(holding.claim_owners, ["Metal3Data/node-a-data"]);
        assert_eq!(holding.cluster.as_deref(), Some("prod"));
        assert_eq!(held(&snapshot, "10.0.0.3"), vec![]);
    }

    #[test]
    fn a_prefix_names_every_holder_inside_it() {
        let snapshot = settled();
        assert_eq!(
            held(&snapshot, "10.0.0.0/31"),
            [("10.0.0.1".to_string(), "IPAddress/a".to_string())]
        );
        assert_eq!(held(&snapshot, "10.0.0.0/24").len(), 2);
        assert_eq!(held(&snapshot, "10.0.1.0/24"), vec![]);
    }

    /// A prefix pool's object holds its whole sub-prefix: any address inside names it.
    #[test]
    fn an_address_inside_a_held_sub_prefix_names_it() {
        let mut snapshot = settled();
        let mut pool = InClusterPrefixPool::new(
            "racks",
            InClusterPrefixPoolSpec {
                prefixes: vec!["fd00::/60".into()],
                allocation_prefix_length: 64,
                ..Default::default()
            },
        );
        pool.metadata.namespace = Some(NS.into());
        snapshot.pools.push(AnyPool::Prefix(pool));
        let mut rack = address("rack-1", "racks", "rack-1", "fd00:0:0:1::");
        rack.spec.pool_ref.kind = "InClusterPrefixPool".into();
        rack.spec.prefix = 64;
        snapshot.addresses.push(rack);
        assert_eq!(
            held(&snapshot, "fd00:0:0:1::17"),
            [(
                "fd00:0:0:1::/64".to_string(),
                "IPAddress/rack-1".to_string()
            )]
        );
        assert_eq!(held(&snapshot, "fd00:0:0:2::17"), vec![]);
    }

    #[test]
    fn a_reservation_whose_object_is_not_created_yet_holds_its_address() {
        let snapshot = reserved_in_flight();
        let found = who_has(&snapshot, query("10.0.0.3"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].object.as_str(), found[0].claim.as_str()),
            ("ledger", "IPAddressClaim/c")
        );
    }

    #[test]
    fn a_query_is_an_address_or_a_prefix() {
        assert_eq!(query("10.0.4.17").to_string(), "10.0.4.17");
        assert_eq!(query("10.0.4.0/24").to_string(), "10.0.4.0/24");
        assert_eq!(query("fd00::5").to_string(), "fd00::5");
        assert!("rack-7".parse::<Query>().is_err());
    }
}
