//! Watched objects decoded without `metadata.managedFields`. No reconcile reads them, yet
//! decoded they are most of an object's allocations (each entry's `fieldsV1` becomes a JSON
//! tree), made for every watch event and list item and dropped at once: a profile of a mass
//! deletion found them the largest single share of bitpool's CPU. They are skipped while the
//! JSON is read instead.

use std::borrow::Cow;
use std::fmt;

use kube::Resource;
use kube::api::ObjectMeta;
use serde::de::value::{BorrowedStrDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// `K` as a watch decodes it for a cache: whole, but for its managed fields.
#[derive(Clone, Debug)]
pub struct Lean<K>(pub K);

impl<K: Resource<DynamicType = ()>> Resource for Lean<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

impl<'de, K: de::Deserialize<'de>> de::Deserialize<'de> for Lean<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Filtered {
            inner: deserializer,
            level: Level::Object,
        })
        .map(Lean)
    }
}

/// Where in the object a map is: the object itself (whose `metadata` is filtered) or its
/// metadata (whose `managedFields` are skipped).
#[derive(Clone, Copy)]
enum Level {
    Object,
    Metadata,
}

/// A deserializer of a JSON object whose keys pass through [`Keys`]. Both levels are objects,
/// so every request is answered as a map.
struct Filtered<D> {
    inner: D,
    level: Level,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Filtered<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(Fields {
            inner: visitor,
            level: self.level,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

struct Fields<V> {
    inner: V,
    level: Level,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Fields<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(Keys {
            inner: map,
            level: self.level,
            metadata_next: false,
        })
    }
}

/// The entries of one level: `managedFields` skipped in the metadata, the metadata's value
/// filtered in the object, everything else passed on as read.
struct Keys<A> {
    inner: A,
    level: Level,
    metadata_next: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Keys<A> {
    type Error = A::Error;

    fn next_key_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        loop {
            let Some(key) = self.inner.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            match self.level {
                Level::Metadata if key.is("managedFields") => {
                    self.inner.next_value::<IgnoredAny>()?;
                    continue;
                }
                Level::Object => self.metadata_next = key.is("metadata"),
                Level::Metadata => {}
            }
            return match key {
                Key::Borrowed(text) => seed.deserialize(BorrowedStrDeserializer::new(text)),
                Key::Owned(text) => seed.deserialize(StringDeserializer::new(text)),
            }
            .map(Some);
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        if std::mem::take(&mut self.metadata_next) {
            self.inner.next_value_seed(Metadata(seed))
        } else {
            self.inner.next_value_seed(seed)
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// The metadata's value, read through [`Filtered`].
struct Metadata<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Metadata<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Filtered {
            inner: deserializer,
            level: Level::Metadata,
        })
    }
}

/// A key as read: borrowed from the input unless it had to be unescaped.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn is(&self, name: &str) -> bool {
        match self {
            Key::Borrowed(text) => *text == name,
            Key::Owned(text) => text == name,
        }
    }
}

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(text))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(text.to_string()))
            }
            fn visit_string<E: de::Error>(self, text: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(text))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::capi::IPAddress;
    use kube::core::{ObjectList, WatchEvent};

    fn address(managed_fields: bool, escaped_key: bool) -> String {
        let managed = r#""managedFields": [{"manager": "bitpool", "operation": "Apply",
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "time": "2026-12-04T10:00:00Z",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:address": {}, "f:prefix": {}},
            "f:metadata": {"f:finalizers": {"v:\"a\"": {}}}}}],"#;
        let name_key = if escaped_key {
            r#""n\u0061me""#
        } else {
            r#""name""#
        };
        format!(
            r#"{{"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
            "metadata": {{{name_key}: "a-1", "namespace": "ns", {} "uid": "u-1",
              "labels": {{"managedFields": "a label, kept"}},
              "finalizers": ["ipam.cluster.x-k8s.io/ProtectAddress"]}},
            "spec": {{"address": "10.0.0.4", "prefix": 24, "gateway": "10.0.0.1",
              "claimRef": {{"name": "a-1"}},
              "poolRef": {{"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}}}}}}"#,
            if managed_fields { managed } else { "" }
        )
    }

    /// Decoded lean, an object equals the object decoded whole less its managed fields, whether
    /// its keys are borrowed from the input or unescaped; a label of that name is kept.
    #[test]
    fn an_object_decodes_whole_but_for_its_managed_fields() {
        for escaped in [false, true] {
            let text = address(true, escaped);
            let mut whole: IPAddress = serde_json::from_str(&text).expect("decodes");
            assert!(whole.metadata.managed_fields.is_some());
            whole.metadata.managed_fields = None;
            let Lean(lean) = serde_json::from_str::<Lean<IPAddress>>(&text).expect("decodes lean");
            assert_eq!(lean, whole, "escaped key: {escaped}");
            let plain: IPAddress = serde_json::from_str(&address(false, escaped)).expect("decodes");
            assert_eq!(lean, plain);
        }
    }

    /// The shapes a watch reads: a list's items and a watch event's object.
    #[test]
    fn lists_and_watch_events_decode_lean() {
        let item = address(true, false);
        let list = format!(
            r#"{{"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressList",
            "metadata": {{"resourceVersion": "7"}}, "items": [{item}, {item}]}}"#
        );
        let list: ObjectList<Lean<IPAddress>> = serde_json::from_str(&list).expect("a list");
        assert_eq!(list.items.len(), 2);
        assert!(
            list.items
                .iter()
                .all(|i| i.0.metadata.managed_fields.is_none())
        );
        let event = format!(r#"{{"type": "MODIFIED", "object": {item}}}"#);
        match serde_json::from_str::<WatchEvent<Lean<IPAddress>>>(&event).expect("an event") {
            WatchEvent::Modified(Lean(object)) => {
                assert_eq!(object.metadata.name.as_deref(), Some("a-1"));
                assert!(object.metadata.managed_fields.is_none());
            }
            other => panic!("unexpected event {other:?}"),
        }
    }

    /// Input that is not an object is refused with the decoder's error, not accepted.
    #[test]
    fn what_is_not_an_object_is_refused() {
        for text in [
            r#"[]"#,
            r#""text""#,
            r#"{"metadata": 4}"#,
            r#"{"metadata": {"name": 4}}"#,
        ] {
            assert!(
                serde_json::from_str::<Lean<IPAddress>>(text).is_err(),
                "{text} decoded"
            );
        }
    }
}
