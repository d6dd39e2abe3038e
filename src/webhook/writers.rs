//! Who may write the address objects of a pool bitpool allocates from. Such an object is the
//! record that an address is taken: one a tenant makes by hand in its own namespace, naming a
//! pool every tenant shares, would take an address no claim was given or claim another tenant's.
//! So an address object is created only by bitpool or by someone who may change the pool itself
//! (`patch` on it: its owners, an administrator, `clusterctl move`), as the API server's
//! SubjectAccessReview says. Decisions are remembered for a minute ([`crate::net::decisions`]),
//! so bitpool's own creates cost one review per pool per minute.

use std::time::Instant;

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::ipam::key::PoolKey;
use crate::net::decisions::Remembered;

/// Decisions by writer and pool.
#[derive(Default)]
pub struct Writers(Remembered<String, bool>);

/// The review that asks whether `user` may patch `pool`.
fn review(user: &UserInfo, pool: &PoolKey) -> SubjectAccessReview {
    let (group, resource) = (pool.kind.group(), pool.kind.plural());
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.into()),
                resource: Some(resource.into()),
                verb: Some("patch".into()),
                name: Some(pool.name.clone()),
                namespace: pool.namespace.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The text a decision is remembered by: the writer as the API server authenticated it, and
/// the pool.
fn key(user: &UserInfo, pool: &PoolKey) -> String {
    format!(
        "{}\u{0}{}\u{0}{}\u{0}{}",
        user.username.as_deref().unwrap_or_default(),
        user.groups.as_deref().unwrap_or_default().join(","),
        pool.describe(),
        serde_json::to_string(&user.extra).unwrap_or_default()
    )
}

impl Writers {
    /// Whether `user` may write the address objects of `pool` (a kind bitpool serves).
    pub async fn may_write(
        &self,
        client: &Client,
        user: &UserInfo,
        pool: &PoolKey,
    ) -> Result<bool, kube::Error> {
        let key = key(user, pool);
        let now = Instant::now();
        if let Some(allowed) = self.0.get(&key, now) {
            return Ok(allowed);
        }
        let review = review(user, pool);
        let api: Api<SubjectAccessReview> = Api::all(client.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        self.0.put(key, now, allowed);
        Ok(allowed)
    }
}

/// Why a write of an address object is refused.
pub fn refusal(kind: &str, object: &str, pool: &PoolKey) -> String {
    format!(
        "{kind} {object} names {}, which bitpool allocates from: its address objects are made by bitpool (or by those who may change the pool), so that nobody takes or moves an address no claim was given; create a claim for the address instead",
        pool.describe()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{capi, metal3_ipam};
    use crate::ipam::key::PoolKind;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: Some(name.into()),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            ..Default::default()
        }
    }

    fn pool(kind: PoolKind, namespace: Option<&str>) -> PoolKey {
        PoolKey {
            kind,
            namespace: namespace.map(str::to_string),
            name: "shared".into(),
        }
    }

    #[test]
    fn the_review_asks_to_patch_the_pool_as_the_writer() {
        let asked = review(
            &user("alice", &["tenants"]),
            &pool(PoolKind::GlobalInClusterIPPool, None),
        );
        let spec = asked.spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.groups, Some(vec!["tenants".to_string()]));
        let attributes = spec.resource_attributes.expect("resource attributes");
        assert_eq!(attributes.verb.as_deref(), Some("patch"));
        assert_eq!(attributes.group.as_deref(), Some(capi::GROUP));
        assert_eq!(
            attributes.resource.as_deref(),
            Some("globalinclusterippools")
        );
        assert_eq!(attributes.name.as_deref(), Some("shared"));
        assert_eq!(attributes.namespace, None);
        let metal3 = review(
            &user("bob", &[]),
            &pool(PoolKind::Metal3IPPool, Some("site")),
        )
        .spec
        .resource_attributes
        .expect("resource attributes");
        assert_eq!(metal3.group.as_deref(), Some(metal3_ipam::GROUP));
        assert_eq!(metal3.namespace.as_deref(), Some("site"));
    }

    #[test]
    fn decisions_are_remembered_per_writer_groups_and_pool() {
        let base = key(
            &user("alice", &["a"]),
            &pool(PoolKind::InClusterIPPool, Some("x")),
        );
        assert_ne!(
            base,
            key(
                &user("alice", &["b"]),
                &pool(PoolKind::InClusterIPPool, Some("x"))
            )
        );
        assert_ne!(
            base,
            key(
                &user("alice", &["a"]),
                &pool(PoolKind::InClusterIPPool, Some("y"))
            )
        );
        assert_eq!(
            base,
            key(
                &user("alice", &["a"]),
                &pool(PoolKind::InClusterIPPool, Some("x"))
            )
        );
    }
}
