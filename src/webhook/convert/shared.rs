//! What every conversion shares: its error, and reading and removing the annotation where a
//! version keeps what the other has no place for.

use serde_json::Value;

/// Why an object could not be converted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConversionError {
    #[error("{kind} {name}: cannot convert from {from} to {to}")]
    Unsupported {
        kind: String,
        name: String,
        from: String,
        to: String,
    },
    #[error("{name}: spec does not match {version}: {reason}")]
    Spec {
        name: String,
        version: &'static str,
        reason: String,
    },
}

/// The string at JSON `pointer` in `object`; empty when there is none.
pub fn field<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Removes the annotation `key` (and an annotation map it leaves empty); returns its value
/// parsed as JSON.
pub fn take_annotation(object: &mut Value, key: &str) -> Option<Value> {
    let annotations = object
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)?;
    let data = annotations.remove(key)?;
    if annotations.is_empty()
        && let Some(metadata) = object
            .pointer_mut("/metadata")
            .and_then(Value::as_object_mut)
    {
        metadata.remove("annotations");
    }
    serde_json::from_str(data.as_str()?).ok()
}
