//! The RBAC bitpool needs, written down once next to the reasons for each rule, for each choice
//! of controller groups. `bitpool rbac` prints it; `config/rbac/*/role.yaml` are its output (a
//! test keeps them in step), and a test runs bitpool under exactly these rules with the
//! OwnerReferencesPermissionEnforcement admission plugin on.

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleRef, Subject,
};
use kube::api::ObjectMeta;

use crate::api::capi::{CLUSTER_GROUP as CLUSTER, GROUP as CAPI_IPAM};
use crate::api::metal3_data::GROUP as INFRASTRUCTURE;
use crate::api::metal3_ipam::GROUP as METAL3_IPAM;
use crate::runtime::Groups;

/// The CAPI pool kinds bitpool serves.
const CAPI_POOLS: &[&str] = &[
    "inclusterippools",
    "globalinclusterippools",
    "inclusterprefixpools",
    "globalinclusterprefixpools",
];

/// Reading a kind the way the watch caches do.
const WATCH: &[&str] = &["get", "list", "watch"];

/// One rule, and why bitpool needs it.
struct Rule {
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
}

fn rule(
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
) -> Rule {
    Rule {
        group,
        resources,
        verbs,
    }
}

/// The cluster-wide rules for `groups`.
fn cluster_rules(groups: Groups) -> Vec<Rule> {
    let mut rules = vec![
        // Claims are served in every namespace; the finalizer and the status are patched.
        // `…/finalizers` because their IPAddress names them as owner with blockOwnerDeletion.
        rule(
            CAPI_IPAM,
            &["ipaddressclaims"],
            &["get", "list", "watch", "patch"],
        ),
        rule(CAPI_IPAM, &["ipaddressclaims/status"], &["patch"]),
        rule(CAPI_IPAM, &["ipaddressclaims/finalizers"], &["update"]),
        rule(
            CAPI_IPAM,
            &["ipaddresses"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        // Pools are read by every group (Metal3Data and the admission webhooks name them).
        rule(CAPI_IPAM, CAPI_POOLS, WATCH),
        // A paused Cluster pauses its claims; the Cluster API version is found from the CRDs.
        rule(CLUSTER, &["clusters"], WATCH),
        rule(
            "apiextensions.k8s.io",
            &["customresourcedefinitions"],
            &["get"],
        ),
        // The ledger namespace is created if missing; a terminating namespace lets its pools go;
        // namespaces' labels decide whom a global pool's `namespaceSelector` serves.
        rule("", &["namespaces"], &["get", "list", "watch", "create"]),
        rule("events.k8s.io", &["events"], &["create", "patch"]),
        // The secure /metrics endpoint asks the API server who calls and whether they may.
        rule("authentication.k8s.io", &["tokenreviews"], &["create"]),
        rule(
            "authorization.k8s.io",
            &["subjectaccessreviews"],
            &["create"],
        ),
    ];
    if groups.capi_ipam {
        let pools = &[
            "inclusterippools",
            "globalinclusterippools",
            "inclusterprefixpools",
            "globalinclusterprefixpools",
        ];
        rules.push(rule(CAPI_IPAM, pools, &["patch"]));
        rules.push(rule(
            CAPI_IPAM,
            &[
                "inclusterippools/status",
                "globalinclusterippools/status",
                "inclusterprefixpools/status",
                "globalinclusterprefixpools/status",
            ],
            &["patch"],
        ));
        rules.push(rule(
            CAPI_IPAM,
            &[
                "inclusterippools/finalizers",
                "globalinclusterippools/finalizers",
                "inclusterprefixpools/finalizers",
                "globalinclusterprefixpools/finalizers",
            ],
            &["update"],
        ));
    }
    if groups.capi_ipam || groups.metal3_pools() {
        // A Cluster that names an endpoint pool: its endpoint claim is made (by the controller,
        // or by the Metal3Cluster webhook) and its `spec.controlPlaneEndpoint` written.
        rules.push(rule(CAPI_IPAM, &["ipaddressclaims"], &["create"]));
        rules.push(rule(CLUSTER, &["clusters"], &["patch"]));
    }
    if groups.metal3_kinds() {
        rules.push(rule(METAL3_IPAM, &["ippools"], WATCH));
        rules.push(rule(
            METAL3_IPAM,
            &["ipaddresses"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ));
        rules.push(rule(
            METAL3_IPAM,
            &["ipclaims"],
            &["get", "list", "watch", "patch"],
        ));
        rules.push(rule(METAL3_IPAM, &["ipclaims/status"], &["patch"]));
    }
    if groups.migration_proxy {
        // Claims of IPClaims proxied to a CAPI pool are IPAddressClaims owned by the IPClaim.
        rules.push(rule(CAPI_IPAM, &["ipaddressclaims"], &["create", "delete"]));
    }
    if groups.metal3_pools() {
        rules.push(rule(METAL3_IPAM, &["ippools"], &["patch"]));
        rules.push(rule(METAL3_IPAM, &["ippools/status"], &["patch"]));
        rules.push(rule(
            METAL3_IPAM,
            &["ippools/finalizers", "ipclaims/finalizers"],
            &["update"],
        ));
    }
    if groups.metal3_data {
        let kinds = &["metal3datatemplates", "metal3datas", "metal3dataclaims"];
        rules.push(rule(
            INFRASTRUCTURE,
            kinds,
            &["get", "list", "watch", "create", "patch", "delete"],
        ));
        rules.push(rule(
            INFRASTRUCTURE,
            &[
                "metal3datatemplates/status",
                "metal3datas/status",
                "metal3dataclaims/status",
            ],
            &["patch"],
        ));
        rules.push(rule(
            INFRASTRUCTURE,
            &[
                "metal3datatemplates/finalizers",
                "metal3datas/finalizers",
                "metal3dataclaims/finalizers",
            ],
            &["update"],
        ));
        // A host's data is rendered from its Metal3Machine, Machine and BareMetalHost.
        rules.push(rule(INFRASTRUCTURE, &["metal3machines"], &["get"]));
        rules.push(rule(CLUSTER, &["machines"], &["get"]));
        rules.push(rule("metal3.io", &["baremetalhosts"], &["get"]));
        // Its IP claims: IPAddressClaims and IPClaims owned by the Metal3Data.
        rules.push(rule(CAPI_IPAM, &["ipaddressclaims"], &["create", "delete"]));
        rules.push(rule(METAL3_IPAM, &["ipclaims"], &["create", "delete"]));
        // The rendered metaData and networkData (deleted with their Metal3Data by the GC).
        rules.push(rule("", &["secrets"], &["get", "create"]));
    }
    rules
}

/// The groups the bare-metal bundle (`bitpool-baremetal`) enables unless `BITPOOL_CONTROLLERS`
/// says otherwise: its roles grant these.
pub const BAREMETAL_DEFAULT: Groups = Groups {
    capi_ipam: true,
    metal3_ipam: true,
    migration_proxy: true,
    metal3_data: false,
};

/// The rules in bitpool's own namespace: the pools' ledgers and the leader lease.
fn namespace_rules() -> Vec<Rule> {
    vec![
        rule(
            "",
            &["configmaps"],
            &["get", "list", "create", "update", "delete"],
        ),
        rule(
            "coordination.k8s.io",
            &["leases"],
            &["get", "list", "watch", "create", "patch"],
        ),
    ]
}

/// Rules of one group and resource set merged, verbs in a fixed order, so that the output is
/// short and stable.
fn policy_rules(rules: Vec<Rule>) -> Vec<PolicyRule> {
    const ORDER: [&str; 7] = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    let mut merged: Vec<(&str, &[&str], Vec<&str>)> = Vec::new();
    for rule in rules {
        match merged
            .iter_mut()
            .find(|(g, r, _)| *g == rule.group && *r == rule.resources)
        {
            Some((_, _, verbs)) => verbs.extend(rule.verbs),
            None => merged.push((rule.group, rule.resources, rule.verbs.to_vec())),
        }
    }
    merged
        .into_iter()
        .map(|(group, resources, verbs)| PolicyRule {
            api_groups: Some(vec![group.to_string()]),
            resources: Some(resources.iter().map(|r| r.to_string()).collect()),
            verbs: ORDER
                .iter()
                .filter(|v| verbs.contains(v))
                .map(|v| v.to_string())
                .collect(),
            ..Default::default()
        })
        .collect()
}

/// The ClusterRole `manager-role` and the Role `ledger-role` (in the `system` namespace,
/// which kustomize renames) for `groups`.
pub fn roles(groups: Groups) -> (ClusterRole, Role) {
    let cluster = ClusterRole {
        metadata: ObjectMeta {
            name: Some("manager-role".into()),
            ..Default::default()
        },
        rules: Some(policy_rules(cluster_rules(groups))),
        ..Default::default()
    };
    let namespaced = Role {
        metadata: ObjectMeta {
            name: Some("ledger-role".into()),
            namespace: Some("system".into()),
            ..Default::default()
        },
        rules: Some(policy_rules(namespace_rules())),
    };
    (cluster, namespaced)
}

/// Each (group, resource, verb) the rules allow, in their order.
fn grants(
    rules: &[Rule],
) -> Vec<(
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
)> {
    let mut grants = Vec::new();
    for rule in rules {
        for r in 0..rule.resources.len() {
            for v in 0..rule.verbs.len() {
                grants.push((rule.group, &rule.resources[r..=r], &rule.verbs[v..=v]));
            }
        }
    }
    grants
}

/// What running `added` beside `base` needs beyond `base`'s roles: the ClusterRole `name` and
/// its binding to bitpool's account. Components ship the roles of the groups they enable; an
/// operator who enables more applies this (see `config/rbac/baremetal-metal3-data`).
pub fn addon(base: Groups, added: Groups, name: &str) -> (ClusterRole, ClusterRoleBinding) {
    let union = Groups {
        capi_ipam: base.capi_ipam || added.capi_ipam,
        metal3_ipam: base.metal3_ipam || added.metal3_ipam,
        migration_proxy: base.migration_proxy || added.migration_proxy,
        metal3_data: base.metal3_data || added.metal3_data,
    };
    let had = grants(&cluster_rules(base));
    let extra: Vec<Rule> = grants(&cluster_rules(union))
        .into_iter()
        .filter(|grant| !had.contains(grant))
        .map(|(group, resources, verbs)| rule(group, resources, verbs))
        .collect();
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        rules: Some(policy_rules(extra)),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{name}binding")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.to_string(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "manager".into(),
            namespace: Some("system".into()),
            ..Default::default()
        }]),
    };
    (role, binding)
}

/// The ClusterRole `bitpool-viewer`: what `bitpool pools|who-has|explain|check` read, and no
/// write. ConfigMaps cluster-wide because the ledgers live beside their pools (RBAC cannot
/// narrow a list to a label); Events for `explain`.
pub fn viewer() -> ClusterRole {
    const READ: &[&str] = &["get", "list"];
    let rules = vec![
        rule(CAPI_IPAM, CAPI_POOLS, READ),
        rule(CAPI_IPAM, &["ipaddressclaims", "ipaddresses"], READ),
        rule(METAL3_IPAM, &["ippools", "ipclaims", "ipaddresses"], READ),
        rule("", &["configmaps"], READ),
        rule("", &["events"], &["list"]),
    ];
    ClusterRole {
        metadata: ObjectMeta {
            name: Some("bitpool-viewer".into()),
            ..Default::default()
        },
        rules: Some(policy_rules(rules)),
        ..Default::default()
    }
}

/// [`viewer`] as YAML, with a header saying where it comes from.
pub fn viewer_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::from(
        "# Generated by `bitpool rbac --viewer`: what `kubectl bitpool` reads. Do not edit.\n",
    );
    out.push_str(&serde_saphyr::to_string(&viewer())?);
    Ok(out)
}

/// [`addon`] as a YAML stream.
pub fn addon_yaml(
    base: Groups,
    added: Groups,
    name: &str,
) -> Result<String, serde_saphyr::SerializeError> {
    let (role, binding) = addon(base, added, name);
    let mut out = String::from(
        "# Generated by `bitpool rbac --adding`: what the added groups call beyond the others. Do not edit.\n",
    );
    out.push_str(&serde_saphyr::to_string(&role)?);
    out.push_str("---\n");
    out.push_str(&serde_saphyr::to_string(&binding)?);
    Ok(out)
}

/// The roles as a YAML stream, with a header saying where they come from.
pub fn to_yaml(groups: Groups) -> Result<String, serde_saphyr::SerializeError> {
    let (cluster, namespaced) = roles(groups);
    let mut out = String::from(
        "# Generated by `bitpool rbac`: what the code calls, and nothing else. Do not edit.\n",
    );
    out.push_str(&serde_saphyr::to_string(&cluster)?);
    out.push_str("---\n");
    out.push_str(&serde_saphyr::to_string(&namespaced)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(groups: Groups, group: &str, resource: &str, verb: &str) -> bool {
        let (cluster, _) = roles(groups);
        cluster.rules.unwrap_or_default().iter().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    }

    /// `kubectl bitpool` reads only: the role it is documented to need grants no write.
    #[test]
    fn the_viewer_role_reads_and_writes_nothing() {
        let rules = viewer().rules.unwrap_or_default();
        let verbs: std::collections::BTreeSet<&str> = rules
            .iter()
            .flat_map(|r| r.verbs.iter().map(String::as_str))
            .collect();
        assert_eq!(verbs, ["get", "list"].into());
        assert!(rules.iter().any(|r| {
            r.resources.iter().flatten().any(|x| x == "configmaps")
                && r.api_groups.iter().flatten().any(String::is_empty)
        }));
    }

    const CAPI_ONLY: Groups = Groups {
        capi_ipam: true,
        metal3_ipam: false,
        migration_proxy: false,
        metal3_data: false,
    };

    #[test]
    fn a_capi_ipam_provider_reads_no_metal3_kind_and_no_secret() {
        assert!(allows(
            CAPI_ONLY,
            CAPI_IPAM,
            "inclusterippools/finalizers",
            "update"
        ));
        assert!(allows(
            CAPI_ONLY,
            CAPI_IPAM,
            "globalinclusterprefixpools/status",
            "patch"
        ));
        assert!(allows(CAPI_ONLY, CAPI_IPAM, "ipaddresses", "create"));
        // Endpoint claims, for Clusters that name an endpoint pool; never a claim deleted.
        assert!(allows(CAPI_ONLY, CAPI_IPAM, "ipaddressclaims", "create"));
        assert!(!allows(CAPI_ONLY, CAPI_IPAM, "ipaddressclaims", "delete"));
        assert!(allows(CAPI_ONLY, CLUSTER, "clusters", "patch"));
        assert!(!allows(CAPI_ONLY, METAL3_IPAM, "ipclaims", "list"));
        assert!(!allows(CAPI_ONLY, "", "secrets", "get"));
        assert!(!allows(CAPI_ONLY, INFRASTRUCTURE, "metal3datas", "list"));
    }

    #[test]
    fn metal3_data_may_create_secrets_but_never_delete_or_list_them() {
        assert!(allows(Groups::ALL, "", "secrets", "create"));
        assert!(!allows(Groups::ALL, "", "secrets", "delete"));
        assert!(!allows(Groups::ALL, "", "secrets", "list"));
        assert!(allows(
            Groups::ALL,
            INFRASTRUCTURE,
            "metal3datas/finalizers",
            "update"
        ));
    }

    /// `config/rbac/*/role.yaml` must be exactly what the code generates (regenerate with the
    /// command in each folder's kustomization.yaml).
    #[test]
    fn shipped_roles_are_the_generated_ones() {
        // Each bundle's roles allow the groups it enables by default, nothing more; what the
        // Metal3Data reconciler adds to the bare-metal bundle is a file of its own.
        let metal3_data = Groups {
            capi_ipam: false,
            metal3_ipam: false,
            migration_proxy: false,
            metal3_data: true,
        };
        let roles = [
            ("capi-ipam", to_yaml(CAPI_ONLY)),
            ("baremetal", to_yaml(BAREMETAL_DEFAULT)),
            (
                "baremetal-metal3-data",
                addon_yaml(BAREMETAL_DEFAULT, metal3_data, "metal3-data-role"),
            ),
        ];
        for (folder, generated) in roles {
            let path = format!(
                "{}/config/rbac/{folder}/role.yaml",
                env!("CARGO_MANIFEST_DIR")
            );
            let shipped = std::fs::read_to_string(&path).unwrap_or_default();
            let generated = generated.expect("the roles serialise");
            assert!(
                shipped == generated,
                "{path} differs from `bitpool rbac`; regenerate it"
            );
        }
    }

    #[test]
    fn the_bare_metal_bundle_reads_no_secret_until_metal3_data_is_added() {
        assert!(!allows(BAREMETAL_DEFAULT, "", "secrets", "get"));
        assert!(!allows(
            BAREMETAL_DEFAULT,
            INFRASTRUCTURE,
            "metal3datas",
            "list"
        ));
        let metal3_data = Groups {
            metal3_data: true,
            ..BAREMETAL_DEFAULT
        };
        let (added, _) = addon(BAREMETAL_DEFAULT, metal3_data, "metal3-data-role");
        let rules = added.rules.unwrap_or_default();
        let grants_secrets = rules.iter().any(|r| {
            r.resources.iter().flatten().any(|x| x == "secrets") && r.verbs == ["get", "create"]
        });
        assert!(grants_secrets, "{rules:?}");
        // Nothing the bundle already has is granted twice.
        let repeated = rules
            .iter()
            .any(|r| r.resources.iter().flatten().any(|x| x == "ipaddressclaims"));
        assert!(!repeated, "{rules:?}");
    }

    #[test]
    fn rules_are_merged_and_verbs_ordered() {
        let (cluster, _) = roles(Groups::ALL);
        let rules = cluster.rules.unwrap_or_default();
        let claims: Vec<_> = rules
            .iter()
            .filter(|r| r.resources.as_deref() == Some(&["ipaddressclaims".to_string()][..]))
            .collect();
        assert_eq!(claims.len(), 1, "{claims:?}");
        assert_eq!(
            claims[0].verbs,
            ["get", "list", "watch", "create", "patch", "delete"]
        );
    }
}
