//! The record itself: the addresses a pool has handed out, its reservations and fence, and
//! how it is written in its ConfigMap.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::alloc::set::AddressSet;
use crate::alloc::{Family, family};
use crate::client::clock;

const IPV4_KEY: &str = "ipv4";
const IPV6_KEY: &str = "ipv6";
const PENDING_KEY: &str = "pending";
const REBUILT_KEY: &str = "rebuiltAt";
const REBUILT_BECAUSE_KEY: &str = "rebuiltBecause";
const WRITTEN_TO_KEY: &str = "writtenTo";
const FORMAT_KEY: &str = "format";
const FORMAT: &str = "2";
/// Format 1 (one bitmap and its family) is still read.
const V1_FORMAT: &str = "1";
const V1_ALLOCATED_KEY: &str = "allocated";
const V1_FAMILY_KEY: &str = "family";
/// Label on every ledger; its value is the pool kind, lower case (always a valid label value).
pub const LEDGER_LABEL: &str = "ipam.bitpool.dev/ledger";
/// Annotation on a ledger naming its pool (`<kind>/<namespace>/<name>`, no length limit).
pub const POOL_ANNOTATION: &str = "ipam.bitpool.dev/pool";
/// Annotation on a ledger with its pool's UID: a ledger of an earlier pool of the same name is
/// not this pool's record.
pub const POOL_UID_ANNOTATION: &str = "ipam.bitpool.dev/pool-uid";

/// How long after committing a reservation a process may still create its address object. The
/// create is not sent after it, and is abandoned at its end by the client (queueing included)
/// and by the API server (told what is left of it as the request's `timeout`): see
/// [`crate::client::deadline`]. A later create is left to the next reconcile, which commits
/// again first.
pub const CREATE_WINDOW: Duration = Duration::from_secs(15);
/// How long a request may travel between leaving bitpool and reaching the API server. This is
/// the one bound bitpool cannot enforce from its side (a connection cut off may deliver what it
/// had sent once it recovers); the README says so.
pub const TRANSIT_ALLOWANCE: Duration = Duration::from_secs(20);
/// The latest, after a reservation was committed (on the API server's clock, as measured within
/// [`clock::ALLOWANCE`]), that its address object's create can still land.
pub const IN_FLIGHT_BOUND: Duration = Duration::from_secs(
    CREATE_WINDOW.as_secs() + TRANSIT_ALLOWANCE.as_secs() + clock::ALLOWANCE.as_secs(),
);
/// How long a ledger rebuilt from the live address objects hands out no new address. Another
/// process may have reserved an address in the lost record and be about to create its object:
/// that create lands within [`IN_FLIGHT_BOUND`] of the reservation, which was made before the
/// record was lost. After the fence a fresh list of the address objects is adopted, so such an
/// address is never handed out again.
pub const REBUILD_FENCE: Duration = IN_FLIGHT_BOUND;
/// The most data a ledger's reservations may take (their JSON in `data.pending`): whatever the
/// length of the claims' names, reservations stay far below the API server's limit for a
/// ConfigMap (1 MiB, data and binary data together) beside the bitmaps. Claims beyond it wait for
/// the next batch; with typical names it holds about 1,500 reservations, three batches.
pub const MAX_PENDING_BYTES: usize = 256 * 1024;
/// The most the bitmaps may take before a pool hands out no new address: the ConfigMap's 1 MiB
/// less the reservations' room, and a margin far above what one batch of new addresses can add
/// (500 addresses, each at worst a container of its own: about 20 KB). Only addresses scattered
/// over a vast space come near it — requested ones across an IPv6 pool of many /64s, say —
/// since random allocation stays dense.
pub const MAX_BITMAP_BYTES: usize = 640 * 1024;
/// The longest text of an address (IPv6, eight groups of four), for reservations not yet made.
const LONGEST_ADDRESS: usize = 39;

/// An address reserved for a claim whose address object is not confirmed yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub claim_namespace: String,
    pub claim_name: String,
    pub claim_uid: String,
    /// RFC 3339, when the reservation was made.
    pub since: String,
}

impl Reservation {
    /// The bytes this reservation of `address` takes in `data.pending` (names, UIDs and
    /// timestamps are plain ASCII: JSON escapes nothing in them).
    pub fn encoded_len(&self, address: &str) -> usize {
        self.len_with(address.len())
    }

    fn len_with(&self, address_len: usize) -> usize {
        // "<address>":{"claimNamespace":"…","claimName":"…","claimUid":"…","since":"…"},
        const FRAME: usize = 65;
        FRAME
            + address_len
            + self.claim_namespace.len()
            + self.claim_name.len()
            + self.claim_uid.len()
            + self.since.len()
    }
}

/// The room left for reservations in a ledger, of [`MAX_PENDING_BYTES`].
#[derive(Clone, Copy, Debug)]
pub struct PendingRoom(usize);

impl PendingRoom {
    /// The room `ledger`'s reservations leave.
    pub fn of(ledger: &Ledger) -> Self {
        let used: usize = ledger
            .pending
            .iter()
            .map(|(address, r)| r.encoded_len(address))
            .sum();
        Self(MAX_PENDING_BYTES.saturating_sub(used))
    }

    /// Whether `reservation` fits, whatever its address.
    pub fn fits(&self, reservation: &Reservation) -> bool {
        reservation.len_with(LONGEST_ADDRESS) <= self.0
    }

    /// Takes the room `reservation` needs, if it fits.
    pub fn take(&mut self, reservation: &Reservation) -> bool {
        let fits = self.fits(reservation);
        if fits {
            self.0 -= reservation.len_with(LONGEST_ADDRESS);
        }
        fits
    }
}

/// A pool's record: its allocated addresses by family, its reservations, and its fence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ledger {
    pub v4: AddressSet,
    pub v6: AddressSet,
    /// Canonical address text → reservation.
    pub pending: BTreeMap<String, Reservation>,
    /// RFC 3339: when the ledger was rebuilt from the live address objects after its record was
    /// lost (missing, unreadable, or missing a live address). No new address until
    /// [`REBUILD_FENCE`] after it.
    pub rebuilt_at: Option<String>,
    /// Why it was rebuilt, for the pool's condition.
    pub rebuilt_because: Option<String>,
    /// The UID of the ConfigMap this record was last judged whole in (`data.writtenTo`).
    pub written_to: Option<String>,
    /// The UID of the ConfigMap it was read from (not stored in it).
    pub uid: Option<String>,
}

impl Ledger {
    /// A ledger holding `addresses`, with no reservation.
    pub fn from_addresses(addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut ledger = Self::default();
        for address in addresses {
            ledger.insert(address);
        }
        ledger
    }

    fn set(&self, family: Family) -> &AddressSet {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    fn set_mut(&mut self, family: Family) -> &mut AddressSet {
        match family {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }

    /// Records `address` as allocated.
    pub fn insert(&mut self, address: IpAddr) -> bool {
        self.set_mut(Family::of(address))
            .insert(family::to_value(address))
    }

    /// Forgets `address` (allocation and any reservation).
    pub fn remove(&mut self, address: IpAddr) -> bool {
        self.pending.remove(&address.to_string());
        self.set_mut(Family::of(address))
            .remove(family::to_value(address))
    }

    /// Whether `address` is allocated.
    pub fn contains(&self, address: IpAddr) -> bool {
        self.set(Family::of(address))
            .contains(family::to_value(address))
    }

    /// What the bitmaps take in the stored ledger.
    pub fn bitmap_bytes(&self) -> usize {
        self.v4.encoded_len() + self.v6.encoded_len()
    }

    /// How many addresses are allocated, of both families.
    pub fn len(&self) -> u128 {
        self.v4.len() + self.v6.len()
    }

    /// Whether no address is allocated.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// Every allocated address, IPv4 first.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let v4 = self.v4.iter().map(|v| Family::V4.address(v));
        let v6 = self.v6.iter().map(|v| Family::V6.address(v));
        v4.chain(v6)
    }

    /// The reservation held for the claim with this UID.
    pub fn reservation_of<'a>(&'a self, claim_uid: &'a str) -> Option<(IpAddr, &'a Reservation)> {
        self.reservations_of(claim_uid).next()
    }

    /// Every reservation held for the claim with this UID (more than one only after a fault).
    pub fn reservations_of<'a>(
        &'a self,
        claim_uid: &'a str,
    ) -> impl Iterator<Item = (IpAddr, &'a Reservation)> + 'a {
        self.pending
            .iter()
            .filter(move |(_, r)| r.claim_uid == claim_uid)
            .filter_map(|(a, r)| a.parse().ok().map(|a| (a, r)))
    }

    /// Reserves `address` for the claim of `reservation`.
    pub fn reserve(&mut self, address: IpAddr, reservation: Reservation) {
        self.insert(address);
        self.pending.insert(address.to_string(), reservation);
    }

    /// Clears the reservation of `address` if it is `claim_uid`'s (its address object exists).
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

    /// Whether this record was judged whole in the very ConfigMap it was read from. Every
    /// address bitpool hands out is reserved in the record before its object is created, so in
    /// a whole record an address object it does not list was not made by bitpool. A record
    /// restored from a backup (a new ConfigMap), or one written before bitpool kept this mark,
    /// is not known to be whole: an unlisted object there may be a create of the lost part.
    pub fn whole(&self) -> bool {
        self.uid.is_some() && self.written_to == self.uid
    }

    /// Whether this record is whole and no rebuild fence is on it: then it alone says what is
    /// taken.
    pub fn whole_and_unfenced(&self) -> bool {
        self.whole() && self.rebuilt_at.is_none()
    }

    /// Starts the rebuild fence at `now`.
    pub fn fence(&mut self, now: &str, because: String) {
        self.rebuilt_at = Some(now.to_string());
        self.rebuilt_because = Some(because);
    }

    /// Whether the ledger is in its rebuild fence at `now` (both RFC 3339), and until when.
    pub fn fenced_until(&self, now: &str) -> Option<String> {
        let rebuilt: k8s_openapi::jiff::Timestamp = self.rebuilt_at.as_deref()?.parse().ok()?;
        let now: k8s_openapi::jiff::Timestamp = now.parse().ok()?;
        let until = rebuilt.checked_add(REBUILD_FENCE).ok()?;
        (now < until).then(|| until.to_string())
    }

    /// The ledger as its ConfigMap holds it, with `meta`.
    pub fn to_config_map(&self, meta: ObjectMeta) -> ConfigMap {
        let mut data = BTreeMap::from([(FORMAT_KEY.to_string(), FORMAT.to_string())]);
        // A BTreeMap of plain strings always serializes.
        data.insert(
            PENDING_KEY.into(),
            serde_json::to_string(&self.pending).unwrap_or_else(|_| "{}".into()),
        );
        if let Some(rebuilt) = &self.rebuilt_at {
            data.insert(REBUILT_KEY.into(), rebuilt.clone());
        }
        if let Some(because) = &self.rebuilt_because {
            data.insert(REBUILT_BECAUSE_KEY.into(), because.clone());
        }
        if let Some(uid) = &self.written_to {
            data.insert(WRITTEN_TO_KEY.into(), uid.clone());
        }
        ConfigMap {
            metadata: meta,
            data: Some(data),
            binary_data: Some(BTreeMap::from([
                (IPV4_KEY.into(), ByteString(self.v4.to_bytes())),
                (IPV6_KEY.into(), ByteString(self.v6.to_bytes())),
            ])),
            ..Default::default()
        }
    }

    /// The ledger a ConfigMap holds, or why it holds none this release can read.
    pub fn from_config_map(config_map: &ConfigMap) -> Result<Self, String> {
        let data = config_map.data.clone().unwrap_or_default();
        let binary = config_map.binary_data.clone().unwrap_or_default();
        let decode = |key: &str| -> Result<AddressSet, String> {
            match binary.get(key) {
                Some(bytes) => AddressSet::from_bytes(&bytes.0).map_err(|e| format!("{key}: {e}")),
                None => Ok(AddressSet::default()),
            }
        };
        let mut ledger = Self::default();
        match data.get(FORMAT_KEY).map(String::as_str) {
            Some(FORMAT) => {
                ledger.v4 = decode(IPV4_KEY)?;
                ledger.v6 = decode(IPV6_KEY)?;
            }
            Some(V1_FORMAT) => {
                let allocated = decode(V1_ALLOCATED_KEY)?;
                match data.get(V1_FAMILY_KEY).map(String::as_str) {
                    Some("IPv6") => ledger.v6 = allocated,
                    Some("IPv4") => ledger.v4 = allocated,
                    None if allocated.is_empty() => {}
                    other => return Err(format!("unknown address family {other:?}")),
                }
            }
            other => return Err(format!("unknown ledger format {other:?}")),
        }
        if let Some(text) = data.get(PENDING_KEY) {
            ledger.pending =
                serde_json::from_str(text).map_err(|e| format!("pending reservations: {e}"))?;
        }
        for (address, reservation) in &ledger.pending {
            let parsed: IpAddr = address
                .parse()
                .map_err(|_| format!("pending reservations: {address:?} is not an address"))?;
            if !ledger.contains(parsed) {
                return Err(format!(
                    "pending reservations: {address} (claim {}/{}) is not allocated",
                    reservation.claim_namespace, reservation.claim_name
                ));
            }
        }
        ledger.rebuilt_at = data.get(REBUILT_KEY).cloned();
        ledger.rebuilt_because = data.get(REBUILT_BECAUSE_KEY).cloned();
        ledger.written_to = data.get(WRITTEN_TO_KEY).cloned();
        ledger.uid = config_map.metadata.uid.clone();
        Ok(ledger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    /// The bytes of a ConfigMap that its size limit counts: data and binary data.
    fn data_size(config_map: &ConfigMap) -> usize {
        let data = config_map.data.iter().flatten();
        let binary = config_map.binary_data.iter().flatten();
        data.map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + binary.map(|(k, v)| k.len() + v.0.len()).sum::<usize>()
    }

    #[test]
    fn reservation_sizes_are_what_the_ledger_writes() {
        for (address, name) in [("10.0.0.1", "a"), ("2001:db8::1", &*"n".repeat(253))] {
            let r = Reservation {
                claim_name: name.to_string(),
                ..reservation("0d4c3a2e-5b8f-4c1e-9a7d-3f2b1c0e9d8a")
            };
            let json =
                serde_json::to_string(&BTreeMap::from([(address, r.clone())])).expect("serializes");
            // One entry: its bytes, the braces around the map, no comma after it.
            assert_eq!(json.len(), r.encoded_len(address) + 2 - 1, "{json}");
        }
    }

    /// The worst case a ledger can be in stays well under the API server's 1 MiB limit for a
    /// ConfigMap: 100,000 addresses scattered by the random strategy over an IPv6 /64 (the
    /// bitmap's worst), and reservations filling their room with the longest names there are.
    #[test]
    fn the_worst_ledger_fits_in_a_config_map() {
        use crate::alloc::{AddressSpace, CapiPool, Strategy};
        use rand::SeedableRng;
        let mut space = AddressSpace::capi(&CapiPool {
            addresses: vec!["2001:db8::/64".into()],
            prefix: 64,
            strategy: Strategy::Random,
            ..Default::default()
        })
        .expect("valid");
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        let mut ledger = Ledger::default();
        for i in 0..100_000 {
            let lease = space
                .allocate(&i.to_string(), None, &mut rng)
                .expect("free");
            ledger.insert(lease.address);
        }
        let longest = Reservation {
            claim_namespace: "n".repeat(63),
            claim_name: "c".repeat(253),
            claim_uid: "0d4c3a2e-5b8f-4c1e-9a7d-3f2b1c0e9d8a".into(),
            since: "2026-12-01T10:00:00.123456789Z".into(),
        };
        let mut room = PendingRoom::of(&ledger);
        let mut next = 0u128;
        while room.take(&longest) {
            next += 1;
            ledger.reserve(
                IpAddr::V6((0x2001_0db8_0000_0001_ffff_ffff_0000_0000 + next).into()),
                longest.clone(),
            );
        }
        let size = data_size(&ledger.to_config_map(ObjectMeta::default()));
        eprintln!(
            "the worst ledger: {size} bytes ({} of bitmaps, {} reservations)",
            ledger.v6.to_bytes().len(),
            ledger.pending.len()
        );
        assert!(size < 768 * 1024, "the worst ledger takes {size} bytes");
        // Why random allocation keeps to a window: the same number scattered over the whole
        // /64 would not fit at all.
        use rand::Rng;
        let mut scattered = AddressSet::default();
        for _ in 0..100_000 {
            scattered.insert((0x2001_0db8_u128 << 96) | u128::from(rng.random::<u64>()));
        }
        let scattered = scattered.to_bytes().len();
        eprintln!("100,000 addresses scattered over a /64: {scattered} bytes");
        assert!(scattered > 1024 * 1024);
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
        let mut ledger = Ledger::from_addresses(["10.0.0.1", "10.0.0.2", "fd00::9"].map(ip));
        ledger.reserve(ip("10.0.0.3"), reservation("u3"));
        ledger.rebuilt_at = Some("2026-11-30T04:00:00Z".into());
        ledger.rebuilt_because = Some("it was deleted".into());
        let config_map = ledger.to_config_map(ObjectMeta::default());
        let read = Ledger::from_config_map(&config_map).expect("decodes");
        assert_eq!(read, ledger);
        assert_eq!(
            read.reservation_of("u3").map(|(a, _)| a),
            Some(ip("10.0.0.3"))
        );
        assert_eq!(read.addresses().count(), 4);
        let json = serde_json::to_string(&config_map).expect("serializes");
        assert!(json.len() < 500, "a small ledger stays small: {json}");
    }

    #[test]
    fn families_never_mix() {
        // ::10.0.0.1 and 10.0.0.1 are the same integer; they are different addresses.
        let mut ledger = Ledger::from_addresses([ip("10.0.0.1")]);
        assert!(!ledger.contains(ip("::10.0.0.1")));
        assert!(ledger.insert(ip("::10.0.0.1")));
        assert!(ledger.remove(ip("10.0.0.1")));
        assert!(ledger.contains(ip("::10.0.0.1")) && !ledger.contains(ip("10.0.0.1")));
    }

    #[test]
    fn format_1_ledgers_are_read() {
        let mut data = BTreeMap::from([
            (FORMAT_KEY.to_string(), V1_FORMAT.to_string()),
            (V1_FAMILY_KEY.to_string(), "IPv6".to_string()),
        ]);
        data.insert(PENDING_KEY.into(), "{}".into());
        let mut set = AddressSet::default();
        set.insert(family::to_value(ip("fd00::1")));
        let config_map = ConfigMap {
            data: Some(data),
            binary_data: Some(BTreeMap::from([(
                V1_ALLOCATED_KEY.to_string(),
                ByteString(set.to_bytes()),
            )])),
            ..Default::default()
        };
        let ledger = Ledger::from_config_map(&config_map).expect("format 1 decodes");
        assert!(ledger.contains(ip("fd00::1")) && ledger.v4.is_empty());
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
        let mut garbage = Ledger::default().to_config_map(ObjectMeta::default());
        if let Some(binary) = garbage.binary_data.as_mut() {
            binary.insert(IPV4_KEY.into(), ByteString(vec![1, 2, 3]));
        }
        assert!(
            Ledger::from_config_map(&garbage)
                .unwrap_err()
                .contains("ipv4")
        );
        // A reservation of an address the bitmap lacks is a hand edit, not a record.
        let mut ledger = Ledger::default();
        ledger.pending.insert("10.0.0.5".into(), reservation("x"));
        let edited = ledger.to_config_map(ObjectMeta::default());
        assert!(
            Ledger::from_config_map(&edited)
                .unwrap_err()
                .contains("not allocated")
        );
    }

    #[test]
    fn the_fence_lasts_its_duration() {
        let ledger = Ledger {
            rebuilt_at: Some("2026-11-30T04:00:00Z".into()),
            ..Default::default()
        };
        // The window, the transit allowance and the clock allowance: 15 + 20 + 2 s.
        assert_eq!(
            ledger.fenced_until("2026-11-30T04:00:10Z").as_deref(),
            Some("2026-11-30T04:00:37Z")
        );
        assert_eq!(ledger.fenced_until("2026-11-30T04:00:37Z"), None);
        // A fence that seems to start in the future (a clock ahead wrote it) ends no earlier.
        assert!(ledger.fenced_until("2026-11-30T03:58:00Z").is_some());
        assert_eq!(Ledger::default().fenced_until("2026-11-30T04:00:10Z"), None);
    }
}
