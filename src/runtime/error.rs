//! Errors of the reconcilers, split into transient ones (the cluster will get better by itself:
//! retry soon) and permanent ones (a person must change something: back off, and let a watch
//! event of the object wake it at once).

use std::fmt;
use std::time::Duration;

use kube::Resource;
use kube::api::Api;

use crate::client::deadline::DeadlineExceeded;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server, named with the object it was about.
    #[error("{verb} {object}: {source}")]
    Api {
        verb: Verb,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("the ledger namespace {0} does not exist; creating it")]
    LedgerNamespaceMissing(String),
    #[error("ledger {ledger} kept changing under {attempts} attempts")]
    LedgerContention { ledger: String, attempts: usize },
    #[error("ledger {ledger} changed since this process last read or wrote it")]
    LedgerOutdated { ledger: String },
    #[error("{0} has no namespace")]
    MissingNamespace(String),
}

/// What a failed call asked of the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Create,
    Replace,
    Patch,
    PatchStatus,
    Delete,
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Create => "create",
            Verb::Replace => "replace",
            Verb::Patch => "patch",
            Verb::PatchStatus => "patch the status of",
            Verb::Delete => "delete",
        })
    }
}

/// How an object is named in an error: its resource as the API serves it (the last part of the
/// `Api`'s path, so that dynamic kinds are named too), then `namespace/name`, or `name` for a
/// cluster-scoped one; a list (an empty name) names the namespace.
pub fn object_of<K: Resource>(api: &Api<K>, name: &str) -> String {
    let url = api.resource_url();
    let resource = url.rsplit('/').next().unwrap_or(url);
    match (api.namespace(), name) {
        (Some(namespace), "") => format!("{resource} in {namespace}"),
        (None, "") => resource.to_string(),
        (Some(namespace), name) => format!("{resource} {namespace}/{name}"),
        (None, name) => format!("{resource} {name}"),
    }
}

/// Names the call and its object in a failed API call's error.
pub trait Call<T> {
    fn call<K: Resource>(self, verb: Verb, api: &Api<K>, name: &str) -> Result<T, Error>;

    /// For a call not made through one `Api` (a list across kinds, a raw request).
    fn call_on(self, verb: Verb, object: impl Into<String>) -> Result<T, Error>;
}

impl<T> Call<T> for Result<T, kube::Error> {
    fn call<K: Resource>(self, verb: Verb, api: &Api<K>, name: &str) -> Result<T, Error> {
        self.map_err(|source| Error::api(verb, object_of(api, name), source))
    }

    fn call_on(self, verb: Verb, object: impl Into<String>) -> Result<T, Error> {
        self.map_err(|source| Error::api(verb, object, source))
    }
}

/// How an error is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Conflicts, timeouts, throttling, server errors, lost connections: soon.
    Transient,
    /// Forbidden, invalid, not found: exponential backoff up to a cap.
    Permanent,
    /// Nothing but a change of the object can help.
    OnChange,
}

impl Error {
    /// A failed API call: `verb` on `object`.
    pub fn api(verb: Verb, object: impl Into<String>, source: kube::Error) -> Self {
        Error::Api {
            verb,
            object: object.into(),
            source,
        }
    }

    /// The API server's answer, when the error is one.
    pub fn status(&self) -> Option<&kube::core::Status> {
        match self {
            Error::Api {
                source: kube::Error::Api(status),
                ..
            } => Some(status),
            _ => None,
        }
    }

    /// Stable, bounded label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        if let Some(s) = self.status() {
            return match s {
                s if s.is_forbidden() => "forbidden",
                s if s.is_not_found() => "not_found",
                s if s.is_conflict() || s.is_already_exists() => "conflict",
                s if s.is_invalid() || s.code == 400 => "invalid",
                s if s.code == 429 => "throttled",
                s if (500..=599).contains(&s.code) => "server_error",
                _ => "api_error",
            };
        }
        match self {
            Error::Api {
                source: kube::Error::Service(e),
                ..
            } if e.is::<DeadlineExceeded>() => "deadline",
            Error::Api { .. } => "connection",
            Error::LedgerNamespaceMissing(_) => "ledger_namespace_missing",
            Error::LedgerContention { .. } => "ledger_contention",
            Error::LedgerOutdated { .. } => "ledger_outdated",
            Error::MissingNamespace(_) => "missing_namespace",
        }
    }

    /// How soon the failed reconcile is retried.
    pub fn retry(&self) -> Retry {
        if let Some(s) = self.status() {
            let soon = s.is_conflict()
                || s.is_already_exists()
                || s.code == 429
                || (500..=599).contains(&s.code);
            return match soon {
                true => Retry::Transient,
                false => Retry::Permanent,
            };
        }
        match self {
            Error::Api { .. }
            | Error::LedgerContention { .. }
            | Error::LedgerOutdated { .. }
            | Error::LedgerNamespaceMissing(_) => Retry::Transient,
            Error::MissingNamespace(_) => Retry::OnChange,
        }
    }
}

/// The delay before the `failures`-th consecutive retry (1-based) of an error retried `retry`.
pub fn backoff(retry: Retry, failures: u32) -> Option<Duration> {
    let (first, cap) = match retry {
        Retry::Transient => (Duration::from_millis(250), Duration::from_secs(10)),
        Retry::Permanent => (Duration::from_secs(2), Duration::from_secs(300)),
        Retry::OnChange => return None,
    };
    let doublings = failures.saturating_sub(1).min(16);
    Some(first.saturating_mul(1 << doublings).min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> Error {
        let status = kube::core::Status::failure("test", reason).with_code(code);
        Error::api(
            Verb::Replace,
            "configmaps ns/name",
            kube::Error::Api(Box::new(status)),
        )
    }

    #[test]
    fn errors_that_wait_for_a_person_back_off_and_transient_ones_retry_soon() {
        assert_eq!(api(409, "Conflict").retry(), Retry::Transient);
        assert_eq!(api(409, "AlreadyExists").retry(), Retry::Transient);
        assert_eq!(api(503, "ServiceUnavailable").retry(), Retry::Transient);
        assert_eq!(api(403, "Forbidden").retry(), Retry::Permanent);
        assert_eq!(api(422, "Invalid").retry(), Retry::Permanent);
        assert_eq!(api(404, "NotFound").kind(), "not_found");
        assert_eq!(Error::MissingNamespace("x".into()).retry(), Retry::OnChange);
        let permanent: Vec<_> = (1..=10)
            .map(|n| backoff(Retry::Permanent, n).expect("retried"))
            .collect();
        assert_eq!(permanent[0], Duration::from_secs(2));
        assert_eq!(permanent[1], Duration::from_secs(4));
        assert!(permanent.windows(2).all(|w| w[0] <= w[1]), "never shrinks");
        assert_eq!(permanent[9], Duration::from_secs(300), "capped");
        assert_eq!(
            backoff(Retry::Transient, 1),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            backoff(Retry::Transient, 100),
            Some(Duration::from_secs(10))
        );
        assert_eq!(backoff(Retry::OnChange, 3), None);
    }

    #[test]
    fn a_failed_call_names_the_call_and_the_object() {
        let text = api(409, "Conflict").to_string();
        assert!(text.starts_with("replace configmaps ns/name: "), "{text}");
    }

    #[tokio::test]
    async fn objects_are_named_by_their_resource() {
        let url = "http://127.0.0.1:1".parse().expect("a URL");
        let client = kube::Client::try_from(kube::Config::new(url)).expect("a client");
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), "bitpool-system");
        assert_eq!(object_of(&config_maps, "x"), "configmaps bitpool-system/x");
        assert_eq!(object_of(&config_maps, ""), "configmaps in bitpool-system");
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
        assert_eq!(object_of(&namespaces, "x"), "namespaces x");
    }
}
