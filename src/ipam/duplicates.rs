//! Addresses a pool's live objects hold for more than one claim. bitpool never makes one, but
//! a hand-made object, a restored backup or a request that outlived every bound can: such an
//! address is said out loud (the pool's condition, an Event, a metric, the log) and stays held
//! until one holder is left, so that no third claim gets it.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// An address with the objects holding it (as people read them, sorted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedAddress {
    pub address: IpAddr,
    pub holders: Vec<String>,
}

/// The addresses held more than once, by address, from each claim's live object (what it
/// holds, and the object as people read it).
pub fn shared(held: impl IntoIterator<Item = (IpAddr, String)>) -> Vec<SharedAddress> {
    let mut by_address: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for (address, holder) in held {
        by_address.entry(address).or_default().push(holder);
    }
    by_address
        .into_iter()
        .filter(|(_, holders)| holders.len() > 1)
        .map(|(address, mut holders)| {
            holders.sort();
            SharedAddress { address, holders }
        })
        .collect()
}

/// What the pool says about its shared addresses; `show` writes an address as people read it.
pub fn message(shared: &[SharedAddress], show: impl Fn(IpAddr) -> String) -> String {
    let named: Vec<String> = shared
        .iter()
        .map(|s| format!("{} by {}", show(s.address), s.holders.join(" and ")))
        .collect();
    format!(
        "{} address(es) are held by more than one claim: {}; each stays allocated until one holder is left: delete the object that should not hold it",
        shared.len(),
        crate::runtime::objects::first_few(&named, "; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn only_addresses_held_twice_are_shared() {
        let held = [
            (ip("10.0.0.2"), "IPAddress b/x".to_string()),
            (ip("10.0.0.1"), "IPAddress a/x".to_string()),
            (ip("10.0.0.2"), "IPAddress a/y".to_string()),
            (ip("10.0.0.3"), "IPAddress a/z".to_string()),
        ];
        assert_eq!(
            shared(held),
            vec![SharedAddress {
                address: ip("10.0.0.2"),
                holders: vec!["IPAddress a/y".into(), "IPAddress b/x".into()],
            }]
        );
        assert!(shared(Vec::new()).is_empty());
    }

    #[test]
    fn the_message_names_the_first_and_counts_the_rest() {
        let shared: Vec<SharedAddress> = (1..=7)
            .map(|i| SharedAddress {
                address: ip(&format!("10.0.0.{i}")),
                holders: vec![format!("IPAddress a/{i}"), format!("IPAddress b/{i}")],
            })
            .collect();
        let message = message(&shared, |a| a.to_string());
        assert!(
            message.starts_with(
                "7 address(es) are held by more than one claim: 10.0.0.1 by IPAddress a/1 and IPAddress b/1; "
            ),
            "{message}"
        );
        assert!(message.contains("10.0.0.5 by"), "{message}");
        assert!(!message.contains("10.0.0.6 by"), "{message}");
        assert!(message.contains(" and 2 more; "), "{message}");
    }
}
