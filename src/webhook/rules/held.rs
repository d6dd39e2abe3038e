//! What a pool's allocated addresses forbid (leaving them outside it, deleting it), and which
//! other pools its addresses meet.

use std::net::IpAddr;

use super::{ALLOW_SHRINK_ANNOTATION, Held};
use crate::alloc::{self, Layout, Numbering};

/// An update must keep every allocated address inside the pool, unless the pool carries
/// [`ALLOW_SHRINK_ANNOTATION`]. Addresses already outside the old pool do not count.
pub fn shrink(held: &[Held], old: Option<&Layout>, new: &Layout) -> Vec<String> {
    shrink_of(
        held,
        old,
        new,
        |h| alloc::parse_address(&h.address),
        |a| a.to_string(),
    )
}

/// [`shrink`] for a pool whose layout numbers something else than addresses: `held` says what
/// an address object holds in the layout's terms, `show` how to name that to people.
pub(super) fn shrink_of(
    held: &[Held],
    old: Option<&Layout>,
    new: &Layout,
    held_as: impl Fn(&Held) -> Option<IpAddr>,
    show: impl Fn(IpAddr) -> String,
) -> Vec<String> {
    let dropped: Vec<String> = held
        .iter()
        .filter_map(|h| Some((held_as(h)?, h)))
        .filter(|(a, _)| old.is_none_or(|old| old.contains(*a)) && !new.contains(*a))
        .map(|(a, h)| match h.claim.as_str() {
            "" => show(a),
            claim => format!("{} (claim {claim})", show(a)),
        })
        .collect();
    if dropped.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "spec: pool addresses do not contain allocated addresses: {}; free them first, or set the annotation {ALLOW_SHRINK_ANNOTATION}: \"true\" to keep them allocated outside the pool",
        list(&dropped)
    )]
}

/// A pool with allocated addresses cannot be deleted (upstream's message, and who holds them).
pub fn delete(held: &[Held]) -> Vec<String> {
    if held.is_empty() {
        return Vec::new();
    }
    let claims: Vec<String> = held
        .iter()
        .filter(|h| !h.claim.is_empty())
        .map(|h| h.claim.clone())
        .collect();
    let held_by = match claims.len() {
        0 => String::new(),
        known if known < held.len() => format!(
            " held by claim(s): {}, and {} more",
            list(&claims),
            held.len() - known
        ),
        _ => format!(" held by claim(s): {}", list(&claims)),
    };
    vec![format!(
        "Pool has IPAddresses allocated. Cannot delete Pool until all IPAddresses have been removed. {} address(es){held_by}",
        held.len()
    )]
}

/// At most ten names, then how many more.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// A prefix pool's layout over the addresses its sub-prefixes cover (for [`overlaps`]).
pub fn prefix_addresses((layout, numbering): &(Layout, Numbering)) -> Layout {
    let mut addresses = layout.clone();
    for segment in &mut addresses.segments {
        (segment.first, segment.last) = numbering.address_bounds(segment.first, segment.last);
    }
    addresses
}

/// Pools (by `Kind namespace/name`) whose addresses meet this one's.
pub fn overlaps(layout: &Layout, others: &[(String, Layout)]) -> Vec<String> {
    others
        .iter()
        .filter(|(_, other)| {
            other.family == layout.family
                && layout.segments.iter().any(|a| {
                    other
                        .segments
                        .iter()
                        .any(|b| a.first <= b.last && b.first <= a.last)
                })
        })
        .map(|(name, _)| format!("spec: the pool's addresses overlap those of {name}"))
        .collect()
}
