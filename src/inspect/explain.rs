//! `bitpool explain CLAIM`: why a claim is or is not served, in one paragraph that says what to
//! do, from the claim, its pool, the pool's ledger and the claim's recent Events.

use kube::ResourceExt;
use serde::Serialize;

use super::snapshot::{AnyPool, Snapshot};
use crate::api::labels;
use crate::ipam::kinds::{AnyClaim, ClaimKind};

/// Which claim to explain: `ipaddressclaim/NAME`, `ipclaim/NAME`, or a bare `NAME` (either
/// kind, Cluster API's first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimName {
    pub kind: Option<ClaimKind>,
    pub name: String,
}

impl std::str::FromStr for ClaimName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let Some((kind, name)) = text.split_once('/') else {
            return Ok(Self {
                kind: None,
                name: text.to_string(),
            });
        };
        let kind = match kind.to_ascii_lowercase().as_str() {
            "ipaddressclaim" | "ipaddressclaims" | "ipaddressclaim.ipam.cluster.x-k8s.io" => {
                ClaimKind::Capi
            }
            "ipclaim" | "ipclaims" | "ipclaim.ipam.metal3.io" => ClaimKind::Metal3,
            other => {
                return Err(format!(
                    "{other:?} is not a claim kind: use ipaddressclaim/NAME or ipclaim/NAME"
                ));
            }
        };
        Ok(Self {
            kind: Some(kind),
            name: name.to_string(),
        })
    }
}

/// One Event about a claim, as much of it as an explanation quotes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventNote {
    pub type_: String,
    pub reason: String,
    pub message: String,
}

/// A claim's explanation.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `<Kind> <namespace>/<name>`.
    pub claim: String,
    pub served: bool,
    /// The sentences of the paragraph, each a fact or what to do about it.
    pub sentences: Vec<String>,
}

impl Explanation {
    /// The sentences as one paragraph.
    pub fn paragraph(&self) -> String {
        self.sentences.join(" ")
    }
}

/// The claim `name` in `namespace` as the snapshot holds it.
pub fn find_claim(snapshot: &Snapshot, namespace: &str, name: &ClaimName) -> Option<AnyClaim> {
    let in_namespace =
        |ns: Option<String>, n: String| ns.as_deref() == Some(namespace) && n == name.name;
    let capi = || {
        snapshot
            .claims
            .iter()
            .find(|c| in_namespace(c.namespace(), c.name_any()))
            .and_then(AnyClaim::capi)
    };
    let metal3 = || {
        snapshot
            .ipclaims
            .iter()
            .find(|c| in_namespace(c.namespace(), c.name_any()))
            .and_then(AnyClaim::metal3)
    };
    match name.kind {
        Some(ClaimKind::Capi) => capi(),
        Some(ClaimKind::Metal3) => metal3(),
        None => capi().or_else(metal3),
    }
}

/// Why `claim` is or is not served. `events` are the claim's recent Events, newest last.
pub fn explain(snapshot: &Snapshot, claim: &AnyClaim, events: &[EventNote]) -> Explanation {
    let mut said = Vec::new();
    let served = served_by(snapshot, claim);
    if let Some(deleted) = claim.meta.deleted() {
        said.push(format!(
            "{} is being deleted (since {}); bitpool releases its address and removes its finalizer {}.",
            claim.describe(),
            deleted.0,
            "once its pool's reuse grace period (if any) has passed"
        ));
    }
    match &served {
        Some(held) => said.push(format!("It is served: {held}.")),
        None if claim.deleting() => {}
        None => said.push(format!("{} holds no address.", claim.describe())),
    }
    if served.is_none() && !claim.deleting() {
        pool_sentences(snapshot, claim, &mut said);
        claim_sentences(claim, &mut said);
    }
    for event in events.iter().filter(|e| e.type_ == "Warning").rev().take(3) {
        said.push(format!(
            "Recent warning ({}): {}",
            event.reason, event.message
        ));
    }
    if served.is_none() && !claim.deleting() && said.len() == 1 {
        said.push(
            "Nothing on the claim or its pool says why: bitpool has not reconciled it yet. Check that bitpool is running with the controllers of this claim kind, and that its watch filter (if set) selects the claim."
                .to_string(),
        );
    }
    Explanation {
        claim: claim.describe(),
        served: served.is_some(),
        sentences: said,
    }
}

/// `<object> holds <address>`, when an address object answers the claim.
fn served_by(snapshot: &Snapshot, claim: &AnyClaim) -> Option<String> {
    let named = claim.status_address_name()?;
    let object = snapshot.all_addresses().into_iter().find(|a| {
        a.claim_kind() == claim.kind()
            && a.namespace() == &**claim.meta.namespace()
            && a.name() == named
    })?;
    let prefix = object.prefix().map(|p| format!("/{p}")).unwrap_or_default();
    let gateway = object
        .gateway()
        .map(|g| format!(", gateway {g}"))
        .unwrap_or_default();
    Some(format!(
        "{} holds {}{prefix}{gateway}",
        object.describe(),
        object.address
    ))
}

/// What the claim's pool says: missing, not bitpool's, deleting, paused, invalid, fenced,
/// exhausted.
fn pool_sentences(snapshot: &Snapshot, claim: &AnyClaim, said: &mut Vec<String>) {
    let Some(key) = claim.pool_key() else {
        said.push(format!(
            "It names pool {} {:?} of group {:?}, which is not a kind bitpool serves: another IPAM provider must serve it, or the claim's pool reference is wrong.",
            claim.pool().kind, claim.pool().name, claim.pool().api_group
        ));
        return;
    };
    let Some(pool) = snapshot.pool(&key) else {
        said.push(format!(
            "Its pool {} does not exist{}: create it, or correct the claim's pool reference.",
            key.describe(),
            match key.namespace.is_some() {
                true => " in the claim's namespace",
                false => "",
            }
        ));
        return;
    };
    if pool.deleting() {
        said.push(format!(
            "Its pool {} is being deleted and hands out nothing.",
            key.describe()
        ));
    }
    if pool.paused() {
        said.push(format!(
            "Its pool {} is paused: remove its {} annotation for it to hand out addresses.",
            key.describe(),
            labels::PAUSED
        ));
    }
    if let Some(ready) = pool.condition("Ready").filter(|c| c.status != "True") {
        said.push(sentence(format!(
            "Its pool {} is not Ready ({}): {}",
            key.describe(),
            ready.reason,
            ready.message
        )));
    }
    fence_sentence(snapshot, pool, said);
    // The same exact count as `bitpool pools`: address objects and the ledger's record.
    let counts = super::pools::occupied(snapshot, pool).map(|space| space.counts());
    if let Some(counts) = counts.filter(|c| c.free == 0) {
        said.push(format!(
            "Its pool {} is exhausted ({} of {} held): add addresses to the pool or release some; the claim is served as soon as one is free.",
            key.describe(),
            counts.used,
            counts.total
        ));
    }
}

/// A ledger rebuilt after its record was lost hands out nothing for a while.
fn fence_sentence(snapshot: &Snapshot, pool: &AnyPool, said: &mut Vec<String>) {
    let Some(Ok(ledger)) = snapshot.ledger_of(pool).map(|l| &l.record) else {
        return;
    };
    if let Some(until) = ledger.fenced_until(&snapshot.read_at) {
        said.push(format!(
            "Its pool's ledger was rebuilt from the live address objects ({}) and hands out no new address until {until}, so that an address another process reserved in the lost record is never handed out twice; wait.",
            ledger.rebuilt_because.as_deref().unwrap_or("its record was lost")
        ));
    }
}

/// What the claim itself says: its pause annotation, its Ready condition, its error message.
fn claim_sentences(claim: &AnyClaim, said: &mut Vec<String>) {
    if claim.rare.as_ref().is_some_and(|r| r.pause.is_some()) {
        said.push(format!(
            "The claim itself is paused: remove its {} annotation.",
            labels::PAUSED
        ));
    }
    if let Some(requested) = claim.requested() {
        said.push(format!(
            "It asks for {requested} (its ipAddress annotation)."
        ));
    }
    let ready = claim.conditions.iter().find(|c| &*c.head.type_ == "Ready");
    if let Some(ready) = ready.filter(|c| &*c.head.status != "True") {
        said.push(sentence(format!(
            "Its Ready condition is {} ({}): {}",
            ready.head.status, ready.head.reason, ready.message
        )));
    }
    if let Some(message) = claim.rare.as_ref().and_then(|r| r.error_message.as_deref()) {
        said.push(sentence(format!("Its status.errorMessage says: {message}")));
    }
}

/// `text` ending as a sentence does: conditions and Events quoted in a paragraph may not.
fn sentence(mut text: String) -> String {
    if !text.ends_with(['.', '!', '?']) {
        text.push('.');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::fixtures::*;

    fn explained(snapshot: &Snapshot, name: &str) -> Explanation {
        let name: ClaimName = name.parse().expect("a claim name");
        let claim = find_claim(snapshot, NS, &name).expect("the claim");
        explain(snapshot, &claim, &[])
    }

    #[test]
    fn a_served_claim_names_its_object_and_address() {
        let explanation = explained(&settled(), "ipaddressclaim/a");
        assert!(explanation.served);
        assert_eq!(
            explanation.paragraph(),
            "It is served: IPAddress tenant/a holds 10.0.0.1/24."
        );
    }

    #[test]
    fn a_claim_of_a_missing_pool_says_to_create_it_or_fix_the_reference() {
        let mut snapshot = settled();
        snapshot.claims.push(claim("c", "nowhere"));
        let explanation = explained(&snapshot, "c");
        assert!(!explanation.served);
        assert!(
            explanation.paragraph().contains(
                "Its pool InClusterIPPool tenant/nowhere does not exist in the claim's namespace: create it"
            ),
            "{}",
            explanation.paragraph()
        );
    }

    #[test]
    fn a_paused_or_exhausted_pool_says_so() {
        let mut snapshot = settled();
        snapshot.pools = vec![capi_pool("p", &["10.0.0.1-10.0.0.2"], 24)];
        snapshot.claims.push(claim("c", "p"));
        let text = explained(&snapshot, "c").paragraph();
        assert!(text.contains("is exhausted (2 of 2 held)"), "{text}");
        snapshot.pools[0]
            .meta_mut()
            .annotations
            .get_or_insert_default()
            .insert(labels::PAUSED.into(), "true".into());
        let text = explained(&snapshot, "c").paragraph();
        assert!(
            text.contains("is paused: remove its cluster.x-k8s.io/paused annotation"),
            "{text}"
        );
    }

    #[test]
    fn a_fenced_ledger_says_until_when() {
        let mut snapshot = settled();
        snapshot.claims.push(claim("c", "p"));
        for stored in snapshot.ledgers.values_mut() {
            if let Ok(record) = &mut stored.record {
                record.fence(
                    "2026-12-04T11:59:50Z",
                    "the ledger ConfigMap was deleted".into(),
                );
            }
        }
        let text = explained(&snapshot, "c").paragraph();
        assert!(
            text.contains("(the ledger ConfigMap was deleted) and hands out no new address until 2026-12-04T12:00:"),
            "{text}"
        );
    }

    #[test]
    fn nothing_known_says_bitpool_has_not_seen_the_claim() {
        let mut snapshot = settled();
        snapshot.claims.push(claim("c", "p"));
        let text = explained(&snapshot, "c").paragraph();
        assert!(text.contains("bitpool has not reconciled it yet"), "{text}");
    }

    #[test]
    fn claim_names_take_a_kind_or_not() {
        assert_eq!(
            "ipclaim/x".parse::<ClaimName>(),
            Ok(ClaimName {
                kind: Some(ClaimKind::Metal3),
                name: "x".into()
            })
        );
        assert_eq!(
            "x".parse::<ClaimName>(),
            Ok(ClaimName {
                kind: None,
                name: "x".into()
            })
        );
        assert!("machine/x".parse::<ClaimName>().is_err());
    }
}
