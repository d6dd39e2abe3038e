//! Who may claim from a cluster-scoped pool: its optional `namespaceSelector`, a label selector
//! over Namespaces. Pure: the engine and the admission webhook ask it with the claim's
//! namespace's labels.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

/// The namespaces a pool serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tenancy {
    /// No selector, or an empty one: every namespace, as upstream.
    Everyone,
    Selected(Selector),
}

impl Tenancy {
    /// The tenancy `selector` describes, or why it is not a selector (naming the field).
    pub fn of(selector: Option<&LabelSelector>) -> Result<Self, String> {
        let Some(selector) = selector else {
            return Ok(Self::Everyone);
        };
        let parsed = Selector::try_from(selector.clone())
            .map_err(|e| format!("spec.namespaceSelector: {e}"))?;
        Ok(match parsed.selects_all() {
            true => Self::Everyone,
            false => Self::Selected(parsed),
        })
    }

    /// Whether a claim of a namespace labelled `labels` may take an address.
    pub fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Everyone => true,
            Self::Selected(selector) => selector.matches(labels),
        }
    }

    /// The selector as people write it (`tenant=a,tier in (gold)`), for messages.
    pub fn describe(&self) -> String {
        match self {
            Self::Everyone => "every namespace".into(),
            Self::Selected(selector) => selector.to_string(),
        }
    }
}

/// How far a cluster-scoped pool's `namespaceSelector` reaches, for its `NamespacesSelected`
/// condition and the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// No selector (or none that parses): no condition.
    Everyone,
    /// This process sees one namespace only, so it cannot count the others: the condition is
    /// left as it is.
    Unknown,
    /// The selector as people read it, and how many namespaces it selects now.
    Selects { selector: String, namespaces: usize },
}

impl Tenancy {
    /// How many of `namespaces` (each given by its labels) this tenancy selects.
    pub fn reach<'a>(
        &self,
        namespaces: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
    ) -> Reach {
        match self {
            Self::Everyone => Reach::Everyone,
            Self::Selected(_) => Reach::Selects {
                selector: self.describe(),
                namespaces: namespaces.into_iter().filter(|l| self.admits(l)).count(),
            },
        }
    }
}

/// The labels of `namespace` (none: empty), as [`Tenancy::admits`] and [`Tenancy::reach`] take them.
pub fn labels(namespace: &Namespace) -> &BTreeMap<String, String> {
    static NONE: BTreeMap<String, String> = BTreeMap::new();
    namespace.metadata.labels.as_ref().unwrap_or(&NONE)
}

/// What a pool whose selector selects no namespace means for its users.
pub fn selects_nothing(selector: &str) -> String {
    format!(
        "spec.namespaceSelector ({selector}) selects no namespace: the pool serves no claim until a namespace has matching labels"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn requirement(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn the_reach_counts_the_namespaces_a_selector_selects() {
        let namespaces = [
            labels(&[("tenant", "a")]),
            labels(&[("tenant", "b")]),
            labels(&[]),
        ];
        let selector = LabelSelector {
            match_labels: Some(labels(&[("tenant", "a")])),
            ..Default::default()
        };
        let selected = Tenancy::of(Some(&selector)).expect("a selector");
        assert_eq!(
            selected.reach(&namespaces),
            Reach::Selects {
                selector: "tenant=a".into(),
                namespaces: 1
            }
        );
        let nobody = LabelSelector {
            match_labels: Some(labels(&[("tenant", "c")])),
            ..Default::default()
        };
        let nobody = Tenancy::of(Some(&nobody)).expect("a selector");
        assert_eq!(
            nobody.reach(&namespaces),
            Reach::Selects {
                selector: "tenant=c".into(),
                namespaces: 0
            }
        );
        assert_eq!(Tenancy::Everyone.reach(&namespaces), Reach::Everyone);
    }

    #[test]
    fn no_selector_or_an_empty_one_admits_every_namespace() {
        for selector in [None, Some(LabelSelector::default())] {
            let tenancy = Tenancy::of(selector.as_ref()).expect("valid");
            assert_eq!(tenancy, Tenancy::Everyone);
            assert!(tenancy.admits(&labels(&[])));
        }
    }

    #[test]
    fn labels_and_expressions_must_all_hold() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("tenant", "a")])),
            match_expressions: Some(vec![
                requirement("tier", "In", Some(&["gold", "silver"])),
                requirement("frozen", "DoesNotExist", None),
            ]),
        };
        let tenancy = Tenancy::of(Some(&selector)).expect("valid");
        assert!(tenancy.admits(&labels(&[("tenant", "a"), ("tier", "gold")])));
        assert!(!tenancy.admits(&labels(&[("tenant", "b"), ("tier", "gold")])));
        assert!(!tenancy.admits(&labels(&[("tenant", "a"), ("tier", "bronze")])));
        assert!(!tenancy.admits(&labels(&[
            ("tenant", "a"),
            ("tier", "gold"),
            ("frozen", "")
        ])));
        assert!(!tenancy.admits(&labels(&[])));
    }

    #[test]
    fn an_invalid_selector_names_the_field() {
        let selector = LabelSelector {
            match_expressions: Some(vec![requirement("tier", "In", None)]),
            ..Default::default()
        };
        let error = Tenancy::of(Some(&selector)).expect_err("In without values");
        assert!(error.starts_with("spec.namespaceSelector: "), "{error}");
        let selector = LabelSelector {
            match_expressions: Some(vec![requirement("tier", "Near", Some(&["x"]))]),
            ..Default::default()
        };
        assert!(Tenancy::of(Some(&selector)).is_err());
    }
}
