//! Owned-field paths of Feature objects (`spec.initContainers[*].restartPolicy`), parsed from a
//! Feature a user writes and walked over any object the features guard sees.
//!
//! Input: the path, a NUL byte, then a JSON object (both outside input in the webhook).
//! Invariants: a parsed path prints as written; every instance it finds is where its JSON
//! Pointer says, holds the value reported, and is not null; `is_set_in` agrees with `instances`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodewarden_webhook::features::FieldPath;

fuzz_target!(|data: &[u8]| {
    let (path, object) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"{}"[..]),
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let Ok(path) = FieldPath::parse(path) else {
        return;
    };
    assert_eq!(path.to_string(), path.as_str());
    let Ok(object) = serde_json::from_slice::<serde_json::Value>(object) else {
        return;
    };
    let found = path.instances(&object);
    assert_eq!(path.is_set_in(&object), !found.is_empty());
    for instance in &found {
        assert!(!instance.value.is_null(), "{} reported null", instance.at);
        let at = object.pointer(&instance.pointer);
        assert_eq!(
            at,
            Some(instance.value),
            "pointer {} of {}",
            instance.pointer,
            instance.at
        );
    }
});
