//! What a Cluster's endpoint needs next, from what is observed (pure).

/// A Cluster's `spec.controlPlaneEndpoint`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub host: Option<String>,
    pub port: Option<i32>,
}

impl Endpoint {
    fn host(&self) -> Option<&str> {
        self.host.as_deref().filter(|h| !h.is_empty())
    }

    fn port(&self) -> Option<i32> {
        self.port.filter(|p| *p != 0)
    }
}

/// The Cluster's endpoint claim, as the caches show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimState {
    /// Not made yet.
    Absent,
    /// Made by someone else: a claim of that name the Cluster does not own.
    Foreign,
    /// Made, no address yet: why, as its `Ready` condition says (if it says).
    Pending(Option<String>),
    /// Made and answered with this address.
    Allocated(String),
}

/// The next step for a Cluster that names an endpoint pool. An endpoint set by hand wins: it is
/// never overwritten, and a host name (not an address) is left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do: deleting, already filled from the claim, or a host name.
    Nothing,
    /// Claim an address for the endpoint: the one it already has (`Some`: an endpoint set by hand
    /// to an address is held, so that no machine gets it), or any.
    Claim(Option<String>),
    /// Wait for the claim's address; the reason, if the claim gives one, is reported.
    Wait(Option<String>),
    /// Write the endpoint (SSA of `host` and `port` alone).
    Fill { host: String, port: i32 },
    /// The endpoint was set to another address after the claim was made: it is left alone and
    /// reported.
    Differs { host: String, claimed: String },
    /// A claim of the endpoint claim's name belongs to another object: reported, never touched.
    Foreign,
}

/// The step for a Cluster whose endpoint is `endpoint` and whose claim is `claim`.
pub fn plan(deleting: bool, endpoint: &Endpoint, claim: &ClaimState, default_port: i32) -> Step {
    if deleting {
        return Step::Nothing;
    }
    match (endpoint.host(), claim) {
        (_, ClaimState::Foreign) => Step::Foreign,
        (Some(host), ClaimState::Absent) => match host.parse::<std::net::IpAddr>() {
            Ok(address) => Step::Claim(Some(address.to_string())),
            Err(_) => Step::Nothing,
        },
        (None, ClaimState::Absent) => Step::Claim(None),
        (_, ClaimState::Pending(why)) => Step::Wait(why.clone()),
        (None, ClaimState::Allocated(address)) => Step::Fill {
            host: address.clone(),
            port: endpoint.port().unwrap_or(default_port),
        },
        (Some(host), ClaimState::Allocated(address)) if host == address => match endpoint.port() {
            Some(_) => Step::Nothing,
            None => Step::Fill {
                host: address.clone(),
                port: default_port,
            },
        },
        (Some(host), ClaimState::Allocated(address)) => Step::Differs {
            host: host.to_string(),
            claimed: address.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(host: &str, port: i32) -> Endpoint {
        Endpoint {
            host: Some(host.to_string()),
            port: Some(port),
        }
    }

    #[test]
    fn an_endpoint_is_claimed_then_filled_where_empty_and_never_overwritten() {
        let allocated = ClaimState::Allocated("10.0.0.5".into());
        let pending = ClaimState::Pending(Some("pool vips is exhausted".into()));
        let fill = |port| Step::Fill {
            host: "10.0.0.5".into(),
            port,
        };
        let cases: &[(&str, bool, Endpoint, ClaimState, Step)] = &[
            (
                "new cluster",
                false,
                Endpoint::default(),
                ClaimState::Absent,
                Step::Claim(None),
            ),
            (
                "empty host is no host",
                false,
                endpoint("", 0),
                ClaimState::Absent,
                Step::Claim(None),
            ),
            (
                "waiting for the address",
                false,
                Endpoint::default(),
                pending.clone(),
                Step::Wait(Some("pool vips is exhausted".into())),
            ),
            (
                "allocated: filled, default port",
                false,
                Endpoint::default(),
                allocated.clone(),
                fill(6443),
            ),
            (
                "allocated: the cluster's own port kept",
                false,
                endpoint("", 8443),
                allocated.clone(),
                fill(8443),
            ),
            (
                "filled already",
                false,
                endpoint("10.0.0.5", 6443),
                allocated.clone(),
                Step::Nothing,
            ),
            (
                "host from the claim, port missing",
                false,
                endpoint("10.0.0.5", 0),
                allocated.clone(),
                fill(6443),
            ),
            (
                "set by hand to an address: that address is held",
                false,
                endpoint("192.0.2.1", 6443),
                ClaimState::Absent,
                Step::Claim(Some("192.0.2.1".into())),
            ),
            (
                "set by hand to a name",
                false,
                endpoint("api.example.com", 6443),
                ClaimState::Absent,
                Step::Nothing,
            ),
            (
                "set by hand while the claim waits",
                false,
                endpoint("192.0.2.1", 6443),
                pending,
                Step::Wait(Some("pool vips is exhausted".into())),
            ),
            (
                "changed after the claim",
                false,
                endpoint("192.0.2.1", 6443),
                allocated.clone(),
                Step::Differs {
                    host: "192.0.2.1".into(),
                    claimed: "10.0.0.5".into(),
                },
            ),
            (
                "another object's claim",
                false,
                Endpoint::default(),
                ClaimState::Foreign,
                Step::Foreign,
            ),
            (
                "deleting",
                true,
                Endpoint::default(),
                ClaimState::Absent,
                Step::Nothing,
            ),
        ];
        for (case, deleting, endpoint, claim, expected) in cases {
            assert_eq!(&plan(*deleting, endpoint, claim, 6443), expected, "{case}");
        }
    }
}
