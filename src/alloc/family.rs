//! Addresses as integers, and the textual forms pools are written in.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address family. Every address is held as a `u128`; IPv4 uses the low 32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The family of `address`.
    pub fn of(address: IpAddr) -> Self {
        match address {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The length of an address in bits: 32 or 128.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The highest address of the family.
    pub fn max(self) -> u128 {
        match self {
            Family::V4 => u32::MAX as u128,
            Family::V6 => u128::MAX,
        }
    }

    /// The address of this family whose value is `value`.
    pub fn address(self, value: u128) -> IpAddr {
        match self {
            // Values of an IPv4 space never exceed u32::MAX (they are built from IPv4 addresses).
            Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
        }
    }

    /// The first and last address of `value/prefix`.
    pub fn subnet_bounds(self, value: u128, prefix: u8) -> (u128, u128) {
        let host_bits = u32::from(self.bits() - prefix.min(self.bits()));
        let host_mask = if host_bits == 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let first = value & !host_mask & self.max();
        (first, first | (host_mask & self.max()))
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// An address as a number, its family left out (see [`Family::address`]).
pub fn to_value(address: IpAddr) -> u128 {
    match address {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// Parses one address. Comparison is by value, so `fd00::0005` and `fd00::5` are one address.
pub fn parse_address(text: &str) -> Option<IpAddr> {
    text.trim().parse().ok()
}

/// An inclusive range of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub family: Family,
    pub first: u128,
    pub last: u128,
}

/// Why an `addresses` entry could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryError {
    /// Neither an IP, a range `a-b`, nor a CIDR.
    Unparseable,
    /// `a-b` with `b` before `a`.
    Reversed,
    /// `a-b` with `a` and `b` of different families.
    MixedRange,
}

/// Parses an in-cluster-provider pool entry: a single IP, a range `a-b`, or a CIDR whose host
/// bits are ignored (`192.168.1.1/24` is the whole /24).
pub fn parse_entry(text: &str) -> Result<Range, EntryError> {
    let text = text.trim();
    if let Some((first, last)) = text.split_once('-') {
        let (first, last) = match (parse_address(first), parse_address(last)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(EntryError::Unparseable),
        };
        if Family::of(first) != Family::of(last) {
            return Err(EntryError::MixedRange);
        }
        let (first_value, last_value) = (to_value(first), to_value(last));
        if last_value < first_value {
            return Err(EntryError::Reversed);
        }
        return Ok(Range {
            family: Family::of(first),
            first: first_value,
            last: last_value,
        });
    }
    if let Some((address, prefix)) = text.split_once('/') {
        let address = parse_address(address).ok_or(EntryError::Unparseable)?;
        let family = Family::of(address);
        let prefix: u8 = prefix.trim().parse().map_err(|_| EntryError::Unparseable)?;
        if prefix > family.bits() {
            return Err(EntryError::Unparseable);
        }
        let (first, last) = family.subnet_bounds(to_value(address), prefix);
        return Ok(Range {
            family,
            first,
            last,
        });
    }
    let address = parse_address(text).ok_or(EntryError::Unparseable)?;
    let value = to_value(address);
    Ok(Range {
        family: Family::of(address),
        first: value,
        last: value,
    })
}

/// Parses `address/prefix` (a Metal3 `subnet`) into its address, family and prefix length.
pub fn parse_subnet(text: &str) -> Option<(Family, u128, u8)> {
    let (address, prefix) = text.trim().split_once('/')?;
    let address = parse_address(address)?;
    let family = Family::of(address);
    let prefix: u8 = prefix.trim().parse().ok()?;
    (prefix <= family.bits()).then_some((family, to_value(address), prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> u128 {
        to_value(s.parse().expect("test address"))
    }

    type Bounds = Result<(u128, u128), EntryError>;

    #[test]
    fn entries_parse_as_the_in_cluster_provider_reads_them() {
        let cases: &[(&str, Bounds)] = &[
            ("10.0.0.1", Ok((v4("10.0.0.1"), v4("10.0.0.1")))),
            ("10.0.0.1-10.0.0.9", Ok((v4("10.0.0.1"), v4("10.0.0.9")))),
            (
                " 10.0.0.1 - 10.0.0.9 ",
                Ok((v4("10.0.0.1"), v4("10.0.0.9"))),
            ),
            (
                "192.168.1.1/24",
                Ok((v4("192.168.1.0"), v4("192.168.1.255"))),
            ),
            ("10.0.0.5/32", Ok((v4("10.0.0.5"), v4("10.0.0.5")))),
            ("0.0.0.0/0", Ok((0, u32::MAX as u128))),
            ("10.0.0.9-10.0.0.1", Err(EntryError::Reversed)),
            ("10.0.0.1-fd00::1", Err(EntryError::MixedRange)),
            ("10.0.0.1/33", Err(EntryError::Unparseable)),
            ("10.0.0", Err(EntryError::Unparseable)),
            ("", Err(EntryError::Unparseable)),
            ("10.0.0.1-", Err(EntryError::Unparseable)),
            ("banana", Err(EntryError::Unparseable)),
        ];
        for (text, expected) in cases {
            let got = parse_entry(text).map(|r| (r.first, r.last));
            assert_eq!(&got, expected, "{text:?}");
        }
    }

    #[test]
    fn ipv6_entries_and_canonical_forms() {
        let range = parse_entry("fd00::/64").expect("valid");
        assert_eq!(range.family, Family::V6);
        assert_eq!(range.last - range.first, u64::MAX as u128);
        assert_eq!(parse_entry("fd00::0005"), parse_entry("fd00::5"));
        let all = parse_entry("::/0").expect("valid");
        assert_eq!((all.first, all.last), (0, u128::MAX));
    }

    #[test]
    fn subnet_bounds_mask_host_bits() {
        assert_eq!(
            Family::V4.subnet_bounds(v4("10.1.2.3"), 16),
            (v4("10.1.0.0"), v4("10.1.255.255"))
        );
        assert_eq!(
            Family::V4.subnet_bounds(v4("10.1.2.3"), 0),
            (0, u32::MAX as u128)
        );
        assert_eq!(Family::V6.subnet_bounds(5, 128), (5, 5));
        assert_eq!(Family::V6.subnet_bounds(5, 0), (0, u128::MAX));
    }
}
