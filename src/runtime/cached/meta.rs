//! The metadata of a cached object: what bitpool reads of it, what the objects of a namespace
//! and kind have alike shared.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::ObjectMeta;

use crate::runtime::intern::{self, Interner};

/// Owner kinds, one copy each.
static OWNER_KINDS: LazyLock<Interner<OwnerKind>> = LazyLock::new(Interner::new);
/// Metadata that objects have alike, one copy each.
static SHARED_META: LazyLock<Interner<SharedMeta>> = LazyLock::new(Interner::new);

/// An object's UID: 16 bytes for the UUIDs the API server makes, the text otherwise.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Uid {
    Uuid([u8; 16]),
    Other(Box<str>),
}

impl Uid {
    /// The UID `text` names, kept as 16 bytes where it is a UUID.
    pub fn of(text: &str) -> Self {
        Self::parse(text).map_or_else(|| Self::Other(text.into()), Self::Uuid)
    }

    /// The canonical form only (lowercase, hyphenated), so that the text comes back unchanged.
    fn parse(text: &str) -> Option<[u8; 16]> {
        let bytes = text.as_bytes();
        if bytes.len() != 36 || [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
            return None;
        }
        let digits: Vec<u8> = bytes.iter().copied().filter(|b| *b != b'-').collect();
        let nibble = |b: u8| match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            _ => None,
        };
        let mut uuid = [0u8; 16];
        for (i, pair) in digits.chunks(2).enumerate() {
            *uuid.get_mut(i)? = nibble(pair[0])? << 4 | nibble(*pair.get(1)?)?;
        }
        (digits.len() == 32).then_some(uuid)
    }

    /// Whether no UID is set.
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Other(text) if text.is_empty())
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Other(text) => f.write_str(text),
            // Written whole: reconciles turn every claim's UID of a pool into text.
            Self::Uuid(bytes) => {
                let text = hyphenated(bytes);
                f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
            }
        }
    }
}

/// The canonical text of a UUID: lowercase hex, hyphens after the 4th, 6th, 8th and 10th byte.
fn hyphenated(bytes: &[u8; 16]) -> [u8; 36] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [b'-'; 36];
    let mut at = 0;
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            at += 1;
        }
        text[at] = HEX[usize::from(byte >> 4)];
        text[at + 1] = HEX[usize::from(byte & 0x0f)];
        at += 2;
    }
    text
}

impl std::fmt::Debug for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// What an owner reference names: the API and kind of the owner, shared by every reference to
/// an owner of that kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OwnerKind {
    pub api_version: Arc<str>,
    pub kind: Arc<str>,
}

/// An owner reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    of: Arc<OwnerKind>,
    pub name: Arc<str>,
    pub uid: Uid,
    pub controller: Option<bool>,
    pub block_owner_deletion: Option<bool>,
}

impl Owner {
    /// `reference` as cached; `object` is the owned object's name, which a controller's name
    /// often repeats (a claim and its address object).
    fn of(reference: &OwnerReference, object: &Arc<str>) -> Self {
        // A controller's name is its own (or the object's); other owners are shared.
        let name = match reference.controller == Some(true) {
            true if reference.name == **object => object.clone(),
            true => Arc::from(reference.name.as_str()),
            false => intern::string(&reference.name),
        };
        let of = OwnerKind {
            api_version: intern::string(&reference.api_version),
            kind: intern::string(&reference.kind),
        };
        Self {
            of: OWNER_KINDS.share(of),
            name,
            uid: Uid::of(&reference.uid),
            controller: reference.controller,
            block_owner_deletion: reference.block_owner_deletion,
        }
    }

    /// The owner's `apiVersion`.
    pub fn api_version(&self) -> &str {
        &self.of.api_version
    }

    /// The owner's kind.
    pub fn kind(&self) -> &str {
        &self.of.kind
    }

    /// Whether it is the owned object's controller.
    pub fn is_controller(&self) -> bool {
        self.controller == Some(true)
    }

    /// The owner reference as the API writes it.
    pub fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version().to_string(),
            kind: self.kind().to_string(),
            name: self.name.to_string(),
            uid: self.uid.to_string(),
            controller: self.controller,
            block_owner_deletion: self.block_owner_deletion,
        }
    }
}

/// An object's `resourceVersion`: a number for the versions etcd gives, the text otherwise
/// (the API calls it opaque; held apart, so that the common case takes 16 bytes).
#[derive(Clone, PartialEq, Eq)]
pub enum Version {
    Number(u64),
    Other(Arc<String>),
}

impl Version {
    /// The version `text` names, kept as a number where its decimal form comes back unchanged.
    pub fn of(text: &str) -> Self {
        match text.parse::<u64>() {
            Ok(number) if number.to_string() == text => Self::Number(number),
            _ => Self::Other(Arc::new(text.to_string())),
        }
    }

    /// The version as a number, where it is one.
    pub fn number(&self) -> Option<u64> {
        match self {
            Self::Number(number) => Some(*number),
            Self::Other(_) => None,
        }
    }

    /// Whether no version is set.
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Other(text) if text.is_empty())
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(number) => write!(f, "{number}"),
            Self::Other(text) => f.write_str(text),
        }
    }
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// A point in time as the API server keeps one (`metav1.Time`, whole seconds), in 8 bytes:
/// seconds since the epoch, [`Stamp::NONE`] for none. A fraction of a second, which the server
/// never sends, is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp(i64);

impl Stamp {
    /// No time.
    pub const NONE: Self = Self(i64::MIN);

    /// `time`, to the second.
    pub fn of(time: Option<&Time>) -> Self {
        time.map_or(Self::NONE, |time| Self(time.0.as_second()))
    }

    /// The time, if there is one.
    pub fn timestamp(self) -> Option<k8s_openapi::jiff::Timestamp> {
        (self != Self::NONE)
            .then(|| k8s_openapi::jiff::Timestamp::from_second(self.0).ok())
            .flatten()
    }

    /// The time as Kubernetes spells it.
    pub fn time(self) -> Option<Time> {
        self.timestamp().map(Time)
    }
}

/// The parts of an object's metadata that many objects have alike (the objects of one
/// namespace, kind and cluster): one shared copy for all of them.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct SharedMeta {
    namespace: Arc<str>,
    finalizers: Box<[Arc<str>]>,
    /// Every label, in the object's order.
    labels: Box<[intern::Label]>,
    /// The owners but the controller (such as the pool that owns every address of the pool).
    owners: Box<[Owner]>,
    /// Where the controller, which is each object's own, is among the owners.
    controller_at: u8,
}

/// The metadata bitpool reads of a cached object.
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    pub name: Arc<str>,
    pub uid: Uid,
    /// For writes that must not overwrite a newer object.
    pub resource_version: Version,
    created: Stamp,
    /// Apart: few cached objects are being deleted.
    deleted: Option<Box<Time>>,
    pub(super) shared: Arc<SharedMeta>,
    /// Its controller owner, which is its own (the claim of an address object).
    controller: Option<Owner>,
}

impl Meta {
    /// `None` for an object without a name or namespace (only a namespaced kind is cached here).
    pub fn of(meta: &ObjectMeta) -> Option<Self> {
        let name: Arc<str> = Arc::from(meta.name.as_deref()?);
        let mut owners: Vec<Owner> = (meta.owner_references.iter().flatten())
            .map(|o| Owner::of(o, &name))
            .collect();
        // The first controller (the API server allows one); a position past 255 is unlikely
        // enough to keep it with the shared owners instead.
        let at = (owners.iter().position(Owner::is_controller))
            .and_then(|at| u8::try_from(at).ok().map(|byte| (at, byte)));
        let (controller, controller_at) = match at {
            Some((at, byte)) => (Some(owners.remove(at)), byte),
            None => (None, 0),
        };
        let shared = SharedMeta {
            namespace: intern::string(meta.namespace.as_deref()?),
            finalizers: (meta.finalizers.iter().flatten())
                .map(|f| intern::string(f))
                .collect(),
            labels: (meta.labels.iter().flatten())
                .map(|(k, v)| (intern::string(k), intern::string(v)))
                .collect(),
            owners: owners.into(),
            controller_at,
        };
        Some(Self {
            uid: Uid::of(meta.uid.as_deref().unwrap_or_default()),
            resource_version: Version::of(meta.resource_version.as_deref().unwrap_or_default()),
            created: Stamp::of(meta.creation_timestamp.as_ref()),
            deleted: meta.deletion_timestamp.clone().map(Box::new),
            shared: SHARED_META.share(shared),
            controller,
            name,
        })
    }

    /// Its namespace.
    pub fn namespace(&self) -> &Arc<str> {
        &self.shared.namespace
    }

    /// When it was made.
    pub fn created(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.created.timestamp()
    }

    /// Since when it is being deleted, if it is.
    pub fn deleted(&self) -> Option<&Time> {
        self.deleted.as_deref()
    }

    /// Whether it is being deleted.
    pub fn is_deleted(&self) -> bool {
        self.deleted.is_some()
    }

    /// Its finalizers, in order.
    pub fn finalizers(&self) -> &[Arc<str>] {
        &self.shared.finalizers
    }

    /// Whether the object carries `finalizer`.
    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers().iter().any(|f| &**f == finalizer)
    }

    /// Its labels, in order.
    pub fn labels(&self) -> &[intern::Label] {
        &self.shared.labels
    }

    /// The object's label `key`, if it has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels()
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    /// Its owner references, in order.
    pub fn owners(&self) -> impl Iterator<Item = &Owner> + '_ {
        let others = &self.shared.owners;
        let at = usize::from(self.shared.controller_at).min(others.len());
        (others[..at].iter())
            .chain(self.controller())
            .chain(others[at..].iter())
    }

    /// Its controller owner, if it has one.
    pub fn controller(&self) -> Option<&Owner> {
        self.controller.as_ref()
    }

    /// The metadata as Kubernetes spells it (built anew: for comparisons off the hot path).
    pub fn object_meta(&self) -> ObjectMeta {
        let some_vec = |v: Vec<String>| (!v.is_empty()).then_some(v);
        let owners: Vec<OwnerReference> = self.owners().map(Owner::reference).collect();
        ObjectMeta {
            namespace: Some(self.namespace().to_string()),
            name: Some(self.name.to_string()),
            uid: (!self.uid.is_empty()).then(|| self.uid.to_string()),
            resource_version: (!self.resource_version.is_empty())
                .then(|| self.resource_version.to_string()),
            creation_timestamp: self.created.time(),
            deletion_timestamp: self.deleted().cloned(),
            finalizers: some_vec(self.finalizers().iter().map(|f| f.to_string()).collect()),
            owner_references: (!owners.is_empty()).then_some(owners),
            labels: (!self.labels().is_empty()).then(|| {
                self.labels()
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            }),
            ..Default::default()
        }
    }
}
