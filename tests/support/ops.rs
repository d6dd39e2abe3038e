//! The operational endpoints of a `bitpool run`, read as a prober or a scraper would: with curl.

use super::process::free_port;

/// Free ports for one process' health and diagnostics servers, and the flags that use them.
pub struct Endpoints {
    pub health: u16,
    pub diagnostics: u16,
}

impl Endpoints {
    pub fn new() -> Self {
        Self {
            health: free_port(),
            diagnostics: free_port(),
        }
    }

    /// `--health-addr` and `--diagnostics-address` on 127.0.0.1 (plus `--insecure-diagnostics`
    /// when `secure` is false).
    pub fn args(&self, secure: bool) -> Vec<String> {
        let mut args = vec![
            format!("--health-addr=127.0.0.1:{}", self.health),
            format!("--diagnostics-address=127.0.0.1:{}", self.diagnostics),
        ];
        if !secure {
            args.push("--insecure-diagnostics".into());
        }
        args
    }

    pub async fn readyz(&self) -> (u16, String) {
        get(&format!("http://127.0.0.1:{}/readyz", self.health), None).await
    }

    pub async fn metrics(&self) -> String {
        let (status, body) = get(
            &format!("http://127.0.0.1:{}/metrics", self.diagnostics),
            None,
        )
        .await;
        assert_eq!(status, 200, "GET /metrics: {body}");
        body
    }

    pub async fn secure_metrics(&self, token: Option<&str>) -> (u16, String) {
        let url = format!("https://127.0.0.1:{}/metrics", self.diagnostics);
        get(&url, token).await
    }
}

/// GET `url` (any certificate accepted: the diagnostics certificate signs itself); status and
/// body, status 0 when nothing answered.
pub async fn get(url: &str, token: Option<&str>) -> (u16, String) {
    let mut curl = tokio::process::Command::new("curl");
    curl.args(["-sk", "--max-time", "5", "-w", "\n%{http_code}", url]);
    if let Some(token) = token {
        curl.arg("-H").arg(format!("Authorization: Bearer {token}"));
    }
    let Ok(output) = curl.output().await else {
        return (0, "curl did not run".into());
    };
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// The value of the sample `series` (name and labels, exactly as exported), if present.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split(' ').next()?.parse().ok()
    })
}

/// A token of the ServiceAccount `namespace`/`account`, as its pod would get one.
pub async fn token(client: &kube::Client, namespace: &str, account: &str) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), namespace);
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": { "audiences": [], "expirationSeconds": 3600 }
    }))
    .expect("a TokenRequest");
    accounts
        .create_token_request(account, &Default::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {namespace}/{account}: {e}"))
        .status
        .map(|s| s.token)
        .expect("the token")
}

/// A new ServiceAccount `name` in the test's namespace, and a token of it.
pub async fn service_account(env: &super::Env, name: &str) -> String {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))
            .expect("a ServiceAccount");
    env.api::<ServiceAccount>()
        .create(&Default::default(), &account)
        .await
        .unwrap_or_else(|e| panic!("create the ServiceAccount {name}: {e}"));
    token(&env.client, env.name(), name).await
}

/// Binds the ClusterRole `role` to the test namespace's ServiceAccount `account`, as `binding`.
pub async fn bind_cluster_role(env: &super::Env, binding: &str, role: &str, account: &str) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let object: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": binding },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
        "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": env.name() }]
    }))
    .expect("a ClusterRoleBinding");
    kube::Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(&Default::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("bind {role} to {account}: {e}"));
}

/// A kubeconfig at `out` that authenticates with `token` to the cluster of the kubeconfig
/// `admin` (its server and certificate authority), as a ServiceAccount's pod would.
pub fn token_kubeconfig(admin: &std::path::Path, token: &str, out: &std::path::Path) {
    let admin = std::fs::read_to_string(admin).expect("the admin kubeconfig");
    let field = |name: &str| {
        admin
            .lines()
            .find_map(|l| l.trim().strip_prefix(name).map(str::to_string))
            .unwrap_or_else(|| panic!("no {name} in the admin kubeconfig"))
    };
    let (server, ca) = (field("server: "), field("certificate-authority: "));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: plane\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: account\n  user:\n    token: {token}\ncontexts:\n- name: account\n  context: {{cluster: plane, user: account}}\ncurrent-context: account\n"
    );
    std::fs::write(out, text).expect("write the token kubeconfig");
}
