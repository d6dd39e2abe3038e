//! The two pool dialects as plain data, and how each becomes a [`Layout`]: the pool's addresses
//! as disjoint segments in the order they are handed out, with the prefix, gateway and DNS
//! servers that go with each.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::error::SpecError;
use super::family::{self, EntryError, Family, Range, parse_address};

/// How the next address is picked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// The first free address in pool order (upstream's behaviour).
    #[default]
    Sequential,
    /// Uniform over the free addresses.
    Random,
}

/// An InClusterIPPool or GlobalInClusterIPPool spec.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CapiPool {
    /// Single IPs, ranges `a-b`, or CIDRs.
    pub addresses: Vec<String>,
    pub prefix: i64,
    pub gateway: Option<String>,
    pub excluded_addresses: Vec<String>,
    /// Hand out the network address (and on IPv4 the broadcast address) too.
    pub allocate_reserved: bool,
    /// Claim name → address.
    pub pre_allocations: BTreeMap<String, String>,
    pub strategy: Strategy,
    pub dns_servers: Vec<String>,
    /// Further subnets, each with its own prefix, gateway and DNS servers (`addresses`,
    /// `prefix`, `gateway` and `dnsServers` above are the first).
    pub subnets: Vec<CapiSubnet>,
}

/// One of a CAPI pool's further subnets (`spec.subnets[i]`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CapiSubnet {
    pub addresses: Vec<String>,
    pub prefix: i64,
    pub gateway: Option<String>,
    /// Empty: the pool's.
    pub dns_servers: Vec<String>,
}

/// A Metal3 IPPool spec.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metal3Pool {
    pub entries: Vec<Metal3Entry>,
    pub prefix: Option<i64>,
    pub gateway: Option<String>,
    pub dns_servers: Vec<String>,
    pub pre_allocations: BTreeMap<String, String>,
    pub strategy: Strategy,
}

/// One `pools[]` entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metal3Entry {
    pub start: Option<String>,
    pub end: Option<String>,
    pub subnet: Option<String>,
    pub prefix: Option<i64>,
    pub gateway: Option<String>,
    pub dns_servers: Vec<String>,
}

/// What an address is handed out with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseParams {
    pub prefix: u8,
    pub gateway: Option<IpAddr>,
    pub dns_servers: Vec<IpAddr>,
}

/// Which order "sequential" follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Lowest address first (in-cluster provider: entries are sorted and merged).
    Address,
    /// `pools[]` in declaration order, each entry ascending (Metal3).
    Declaration,
}

/// A range of a pool's space, first and last address as numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub first: u128,
    pub last: u128,
    /// Index into [`Layout::params`].
    pub params: usize,
}

impl Segment {
    /// Saturates only for the whole IPv6 space (2^128 addresses).
    pub fn size(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }
}

/// A validated pool: everything an address space is built from.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub family: Family,
    pub order: Order,
    pub strategy: Strategy,
    /// Disjoint, in the order sequential allocation visits them.
    pub segments: Vec<Segment>,
    pub params: Vec<LeaseParams>,
    /// Claim name → address, each inside a segment.
    pub pre_allocations: BTreeMap<String, u128>,
    /// Claim name → a preallocated address outside every segment (Metal3 pools only: upstream
    /// reports it on the claim, "Pre-allocated IP out of bounds", instead of refusing the pool).
    pub pre_allocations_outside: BTreeMap<String, u128>,
}

impl Layout {
    /// Whether `address` is one the pool hands out (in a segment, of the pool's family).
    pub fn contains(&self, address: IpAddr) -> bool {
        let value = family::to_value(address);
        Family::of(address) == self.family
            && self
                .segments
                .iter()
                .any(|s| s.first <= value && value <= s.last)
    }
}

/// What a preallocation outside the pool does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Outside {
    /// The spec is invalid.
    Refuse,
    /// The claim it names is refused; the rest of the pool works.
    KeepForClaim,
}

/// Sorted, merged inclusive ranges.
pub(super) fn normalize(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (first, last) in ranges {
        match merged.last_mut() {
            Some((_, prev_last)) if prev_last.checked_add(1).is_none_or(|next| first <= next) => {
                *prev_last = (*prev_last).max(last)
            }
            _ => merged.push((first, last)),
        }
    }
    merged
}

/// `set` without `remove`; both sorted and merged.
pub(super) fn subtract(set: &[(u128, u128)], remove: &[(u128, u128)]) -> Vec<(u128, u128)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(first, last) in set {
        let mut cursor = first;
        let mut open = true;
        while j < remove.len() && remove[j].1 < cursor {
            j += 1;
        }
        let mut k = j;
        while open && k < remove.len() && remove[k].0 <= last {
            let (r_first, r_last) = remove[k];
            if r_first > cursor {
                out.push((cursor, r_first - 1));
            }
            match r_last.checked_add(1) {
                Some(next) if r_last < last => cursor = next.max(cursor),
                _ => open = false,
            }
            k += 1;
        }
        if open {
            out.push((cursor, last));
        }
    }
    out
}

#[derive(Default)]
pub(super) struct FamilyCheck {
    pub(super) family: Option<Family>,
}

impl FamilyCheck {
    pub(super) fn check(
        &mut self,
        field: &str,
        value: &str,
        found: Family,
    ) -> Result<(), SpecError> {
        match self.family {
            Some(pool) if pool != found => Err(SpecError::MixedFamilies {
                field: field.to_string(),
                value: value.to_string(),
                found,
                pool,
            }),
            _ => {
                self.family = Some(found);
                Ok(())
            }
        }
    }

    /// The entries of the list field `field` (`field[0]`, `field[1]`, …) as ranges, each checked
    /// against the family of those before.
    fn ranges(&mut self, field: &str, texts: &[String]) -> Result<Vec<(u128, u128)>, SpecError> {
        let mut ranges = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let field = format!("{field}[{i}]");
            let range = entry(field.clone(), text)?;
            self.check(&field, text, range.family)?;
            ranges.push((range.first, range.last));
        }
        Ok(ranges)
    }
}

pub(super) fn entry(field: String, text: &str) -> Result<Range, SpecError> {
    family::parse_entry(text).map_err(|e| {
        let value = text.to_string();
        match e {
            EntryError::Reversed => SpecError::ReversedRange { field, value },
            EntryError::Unparseable | EntryError::MixedRange => {
                SpecError::Unparseable { field, value }
            }
        }
    })
}

pub(super) fn address(
    field: &str,
    text: &str,
    families: &mut FamilyCheck,
) -> Result<IpAddr, SpecError> {
    let parsed = family::parse_address(text).ok_or_else(|| SpecError::InvalidAddress {
        field: field.to_string(),
        value: text.to_string(),
    })?;
    families.check(field, text, Family::of(parsed))?;
    Ok(parsed)
}

/// Entry `i`'s first and last address (`None` when its end lies before its start) and the
/// family: `start`–`end`, `start` to the end of `subnet`, `subnet` alone from its second
/// address, or an open-ended `start`.
fn entry_range(
    i: usize,
    e: &Metal3Entry,
    subnet: Option<(u128, u128)>,
    families: &mut FamilyCheck,
) -> Result<(Option<(u128, u128)>, Family), SpecError> {
    let mut bound = |name: &str, text: &Option<String>| -> Result<Option<u128>, SpecError> {
        text.as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| address(&format!("pools[{i}].{name}"), t, families).map(family::to_value))
            .transpose()
    };
    let start = bound("start", &e.start)?;
    let end = bound("end", &e.end)?;
    let family = families
        .family
        .ok_or(SpecError::EntryWithoutStart { index: i })?;
    let first = match (start, subnet) {
        (Some(start), _) => start,
        // The subnet's first address is its network address; upstream starts after it.
        (None, Some((network, _))) => network.saturating_add(1),
        (None, None) => return Err(SpecError::EntryWithoutStart { index: i }),
    };
    let last = match (end, subnet) {
        (Some(end), _) => end,
        (None, Some((_, last))) => last,
        (None, None) => family.max(),
    };
    if last < first && (start.is_some() && end.is_some()) {
        return Err(SpecError::ReversedRange {
            field: format!("pools[{i}]"),
            value: format!("{}-{}", family.address(first), family.address(last)),
        });
    }
    Ok(((first <= last).then_some((first, last)), family))
}

/// Segments in declaration order: each entry's addresses that no earlier entry listed and no
/// gateway is, tagged with the entry's index (for its lease parameters).
fn declared_segments(
    entry_ranges: Vec<Option<(u128, u128)>>,
    gateways: impl Iterator<Item = u128>,
) -> Vec<Segment> {
    let gateways = normalize(gateways.map(|g| (g, g)).collect());
    let mut claimed: Vec<(u128, u128)> = Vec::new();
    let mut segments = Vec::new();
    for (i, range) in entry_ranges.into_iter().enumerate() {
        let Some(range) = range else { continue };
        let mut taken = claimed.clone();
        taken.extend_from_slice(&gateways);
        for (first, last) in subtract(&[range], &normalize(taken)) {
            segments.push(Segment {
                first,
                last,
                params: i,
            });
        }
        claimed.push(range);
        claimed = normalize(claimed);
    }
    segments
}

fn addresses(
    field: &str,
    texts: &[String],
    families: &mut FamilyCheck,
) -> Result<Vec<IpAddr>, SpecError> {
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| address(&format!("{field}[{i}]"), text, families))
        .collect()
}

fn prefix(field: &str, value: i64, family: Family) -> Result<u8, SpecError> {
    u8::try_from(value)
        .ok()
        .filter(|p| *p <= family.bits())
        .ok_or_else(|| SpecError::InvalidPrefix {
            field: field.to_string(),
            prefix: value,
            family,
        })
}

/// Preallocations inside the pool, and (with [`Outside::KeepForClaim`]) those outside it.
pub(super) type PreAllocations = (BTreeMap<String, u128>, BTreeMap<String, u128>);

/// Validates preallocations: parseable, of the pool's family, one claim each, and inside a
/// segment (or, per `outside`, set apart for their claim).
fn pre_allocations(
    texts: &BTreeMap<String, String>,
    families: &mut FamilyCheck,
    segments: &[Segment],
    outside: Outside,
) -> Result<PreAllocations, SpecError> {
    place_pre_allocations(texts, segments, outside, |claim, text| {
        let parsed = address(&format!("preAllocations[{claim}]"), text, families)?;
        Ok((family::to_value(parsed), parsed))
    })
}

/// Places each claim's preallocation, read by `parse` as a value and the address that names it
/// in errors: one claim per value, each inside a segment (or, per `outside`, set apart).
pub(super) fn place_pre_allocations(
    texts: &BTreeMap<String, String>,
    segments: &[Segment],
    outside: Outside,
    mut parse: impl FnMut(&str, &str) -> Result<(u128, IpAddr), SpecError>,
) -> Result<PreAllocations, SpecError> {
    let mut holders: BTreeMap<u128, &str> = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut out_of_bounds = BTreeMap::new();
    for (claim, text) in texts {
        let (value, named) = parse(claim, text)?;
        if !segments.iter().any(|s| s.first <= value && value <= s.last) {
            if outside == Outside::KeepForClaim {
                out_of_bounds.insert(claim.clone(), value);
                continue;
            }
            return Err(SpecError::PreAllocationOutsidePool {
                claim: claim.clone(),
                address: named,
            });
        }
        if let Some(first) = holders.insert(value, claim) {
            return Err(SpecError::PreAllocationTwice {
                address: named,
                first: first.to_string(),
                second: claim.clone(),
            });
        }
        out.insert(claim.clone(), value);
    }
    Ok((out, out_of_bounds))
}

/// One subnet of a CAPI pool, validated: where its fields are (`""` or `subnets[i].`), its
/// bounds `<lowest address>/<prefix>`, its addresses, and what its addresses are handed out with.
struct SubnetLayout {
    field: String,
    bounds: (u128, u128),
    ranges: Vec<(u128, u128)>,
    params: LeaseParams,
}

impl SubnetLayout {
    fn describe(&self, family: Family) -> String {
        format!("{}/{}", family.address(self.bounds.0), self.params.prefix)
    }
}

/// A subnet as written, with its fields' path (`""` for the pool's own fields).
struct SubnetSpec<'a> {
    field: String,
    addresses: &'a [String],
    prefix: i64,
    gateway: Option<&'a str>,
    dns_servers: &'a [String],
}

impl CapiPool {
    /// The subnet `<lowest address>/<prefix>` when the gateway lies outside it: valid, as
    /// upstream has it, but worth a warning. `None` for a gateway inside, none, or a spec whose
    /// layout fails anyway.
    pub fn gateway_outside_subnet(&self) -> Option<String> {
        let gateway = parse_address(self.gateway.as_deref()?)?;
        let family = Family::of(gateway);
        let lowest = self
            .addresses
            .iter()
            .map(|text| family::parse_entry(text).ok())
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .filter(|range| range.family == family)
            .map(|range| range.first)
            .min()?;
        let prefix = prefix("prefix", self.prefix, family).ok()?;
        let (first, last) = family.subnet_bounds(lowest, prefix);
        let value = family::to_value(gateway);
        (value < first || value > last).then(|| format!("{}/{prefix}", family.address(first)))
    }

    /// The in-cluster provider's rules, per subnet: a subnet is `<lowest address>/<prefix>` and
    /// holds all of its list's addresses; its network address (and on IPv4 its broadcast
    /// address) is kept out unless `allocateReservedIPAddresses`. Across the pool: subnets do not
    /// overlap, `excludedAddresses` and every gateway are kept out, and addresses are handed
    /// out lowest first, whichever subnet they are in.
    pub fn layout(&self) -> Result<Layout, SpecError> {
        let mut families = FamilyCheck { family: None };
        let mut subnets = Vec::with_capacity(1 + self.subnets.len());
        for subnet in self.subnet_specs() {
            subnets.push(subnet_layout(&subnet, &mut families)?);
        }
        let family = families.family.ok_or(SpecError::NoAddresses)?;
        no_overlap(&subnets, family)?;
        let mut removed = families.ranges("excludedAddresses", &self.excluded_addresses)?;
        let pool_dns = addresses("dnsServers", &self.dns_servers, &mut families)?;
        for subnet in subnets
            .iter_mut()
            .filter(|s| s.params.dns_servers.is_empty())
        {
            subnet.params.dns_servers = pool_dns.clone();
        }
        for subnet in &subnets {
            removed.extend(subnet.params.gateway.map(|g| {
                let value = family::to_value(g);
                (value, value)
            }));
        }
        let mut segments = Vec::new();
        for (i, subnet) in subnets.iter().enumerate() {
            let mut kept_out = removed.clone();
            if !self.allocate_reserved {
                kept_out.push((subnet.bounds.0, subnet.bounds.0));
                if family == Family::V4 {
                    kept_out.push((subnet.bounds.1, subnet.bounds.1));
                }
            }
            let kept = subtract(&subnet.ranges, &normalize(kept_out));
            segments.extend(kept.into_iter().map(|(first, last)| Segment {
                first,
                last,
                params: i,
            }));
        }
        segments.sort_unstable_by_key(|s| s.first);
        let (pre_allocations, pre_allocations_outside) = pre_allocations(
            &self.pre_allocations,
            &mut families,
            &segments,
            Outside::Refuse,
        )?;
        Ok(Layout {
            family,
            order: Order::Address,
            strategy: self.strategy,
            segments,
            params: subnets.into_iter().map(|s| s.params).collect(),
            pre_allocations,
            pre_allocations_outside,
        })
    }

    /// The pool's own subnet, then `subnets` in order.
    fn subnet_specs(&self) -> impl Iterator<Item = SubnetSpec<'_>> {
        let own = SubnetSpec {
            field: String::new(),
            addresses: &self.addresses,
            prefix: self.prefix,
            gateway: self.gateway.as_deref(),
            dns_servers: &[],
        };
        let more = self.subnets.iter().enumerate().map(|(i, s)| SubnetSpec {
            field: format!("subnets[{i}]."),
            addresses: &s.addresses,
            prefix: s.prefix,
            gateway: s.gateway.as_deref(),
            dns_servers: &s.dns_servers,
        });
        std::iter::once(own).chain(more)
    }
}

/// A subnet's layout: every entry inside `<lowest address>/<prefix>`, its gateway parsed
/// (inside the subnet, for `subnets[i]`; the pool's own may lie anywhere, as upstream has it),
/// and its own DNS servers (the pool's are filled in where it has none).
fn subnet_layout(
    subnet: &SubnetSpec,
    families: &mut FamilyCheck,
) -> Result<SubnetLayout, SpecError> {
    let field = |name: &str| format!("{}{name}", subnet.field);
    // One range per entry, in the order written (the field names the entry).
    let written_ranges = families.ranges(&field("addresses"), subnet.addresses)?;
    let ranges = normalize(written_ranges.clone());
    let (Some(family), Some(lowest)) = (families.family, ranges.first()) else {
        return Err(match subnet.field.as_str() {
            "" => SpecError::NoAddresses,
            _ => SpecError::NoAddressesIn {
                field: field("addresses"),
            },
        });
    };
    let length = prefix(&field("prefix"), subnet.prefix, family)?;
    let bounds = family.subnet_bounds(lowest.0, length);
    let written = format!("{}/{length}", family.address(bounds.0));
    let outside = written_ranges
        .iter()
        .position(|(first, last)| *first < bounds.0 || *last > bounds.1);
    if let Some(i) = outside {
        return Err(SpecError::OutsideSubnet {
            field: field(&format!("addresses[{i}]")),
            value: subnet.addresses[i].clone(),
            subnet: written,
        });
    }
    let gateway = subnet
        .gateway
        .filter(|g| !g.is_empty())
        .map(|g| address(&field("gateway"), g, families))
        .transpose()?;
    if let Some(gateway) = gateway.filter(|_| !subnet.field.is_empty()) {
        let value = family::to_value(gateway);
        let link_local = matches!(gateway, IpAddr::V6(v6) if v6.is_unicast_link_local());
        if (value < bounds.0 || value > bounds.1) && !link_local {
            return Err(SpecError::GatewayOutsideSubnet {
                field: field("gateway"),
                value: gateway,
                subnet: written,
            });
        }
    }
    let dns = addresses(&field("dnsServers"), subnet.dns_servers, families)?;
    Ok(SubnetLayout {
        field: subnet.field.trim_end_matches('.').to_string(),
        bounds,
        ranges,
        params: LeaseParams {
            prefix: length,
            gateway,
            dns_servers: dns,
        },
    })
}

/// Two subnets of one pool whose bounds meet: refused, naming the later one.
fn no_overlap(subnets: &[SubnetLayout], family: Family) -> Result<(), SpecError> {
    for (i, later) in subnets.iter().enumerate() {
        let met = subnets[..i].iter().find(|earlier| {
            earlier.bounds.0 <= later.bounds.1 && later.bounds.0 <= earlier.bounds.1
        });
        if let Some(earlier) = met {
            let other = match earlier.field.as_str() {
                "" => "addresses".to_string(),
                field => field.to_string(),
            };
            return Err(SpecError::SubnetsOverlap {
                field: later.field.clone(),
                subnet: later.describe(family),
                other,
                other_subnet: earlier.describe(family),
            });
        }
    }
    Ok(())
}

impl Metal3Pool {
    /// Metal3's rules: entries in declaration order (`start`–`end`; `start` to the end of
    /// `subnet`; `subnet` alone from its second address; an open-ended `start`), each entry's
    /// own prefix, gateway and DNS servers overriding the pool's. Unlike upstream, gateways are
    /// never handed out, and an address listed by two entries belongs to the first.
    pub fn layout(&self) -> Result<Layout, SpecError> {
        let mut families = FamilyCheck { family: None };
        let pool_gateway = self
            .gateway
            .as_deref()
            .filter(|g| !g.is_empty())
            .map(|g| address("gateway", g, &mut families))
            .transpose()?;
        let pool_dns = addresses("dnsServers", &self.dns_servers, &mut families)?;
        let mut entry_ranges = Vec::new();
        let mut params = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let (range, entry_params) =
                self.entry_layout(i, e, &mut families, pool_gateway, &pool_dns)?;
            entry_ranges.push(range);
            params.push(entry_params);
        }
        let family = families.family.ok_or(SpecError::NoAddresses)?;
        let gateways = pool_gateway
            .into_iter()
            .chain(params.iter().filter_map(|p| p.gateway))
            .map(family::to_value);
        let segments = declared_segments(entry_ranges, gateways);
        if segments.is_empty() {
            return Err(SpecError::NoAddresses);
        }
        let (pre_allocations, pre_allocations_outside) = pre_allocations(
            &self.pre_allocations,
            &mut families,
            &segments,
            Outside::KeepForClaim,
        )?;
        Ok(Layout {
            family,
            order: Order::Declaration,
            strategy: self.strategy,
            segments,
            params,
            pre_allocations,
            pre_allocations_outside,
        })
    }

    /// Entry `i`'s addresses (`None` when it holds none) and its lease parameters: its own
    /// prefix, gateway and DNS servers, else the pool's (the prefix, else its subnet's length).
    fn entry_layout(
        &self,
        i: usize,
        e: &Metal3Entry,
        families: &mut FamilyCheck,
        pool_gateway: Option<IpAddr>,
        pool_dns: &[IpAddr],
    ) -> Result<(Option<(u128, u128)>, LeaseParams), SpecError> {
        let field = |name: &str| format!("pools[{i}].{name}");
        let subnet = match e.subnet.as_deref().filter(|s| !s.is_empty()) {
            Some(text) => {
                let (found, value, length) =
                    family::parse_subnet(text).ok_or_else(|| SpecError::Unparseable {
                        field: field("subnet"),
                        value: text.to_string(),
                    })?;
                families.check(&field("subnet"), text, found)?;
                Some((found.subnet_bounds(value, length), length))
            }
            None => None,
        };
        let (range, family) = entry_range(i, e, subnet.map(|(bounds, _)| bounds), families)?;
        let gateway = match e.gateway.as_deref().filter(|g| !g.is_empty()) {
            Some(text) => Some(address(&field("gateway"), text, families)?),
            None => pool_gateway,
        };
        let dns = addresses(&field("dnsServers"), &e.dns_servers, families)?;
        let entry_prefix = e
            .prefix
            .filter(|p| *p != 0)
            .or(self.prefix.filter(|p| *p != 0))
            .unwrap_or_else(|| subnet.map_or(0, |(_, length)| i64::from(length)));
        let prefix_field = match e.prefix.filter(|p| *p != 0) {
            Some(_) => field("prefix"),
            None => "prefix".to_string(),
        };
        let params = LeaseParams {
            prefix: prefix(&prefix_field, entry_prefix, family)?,
            gateway,
            dns_servers: if dns.is_empty() {
                pool_dns.to_vec()
            } else {
                dns
            },
        };
        Ok((range, params))
    }
}

#[cfg(test)]
mod tests;
