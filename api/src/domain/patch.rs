//! A JSON Patch of `add` operations, written as the JSON text it is sent as while it is built.
//!
//! The right-sizing decision makes a patch for every pod the cluster creates, and the webhook
//! sends it as text. Built as `json_patch` operations, each path was a validated pointer and each
//! value a `serde_json::Value`, all written out again afterwards: more than a third of the
//! instructions of a review (docs/benchmarks.md). Here each operation is appended as its text
//! once. [`AddPatch::to_json_patch`] gives the `json_patch` form, for tests and tools that apply
//! it.

use serde::Serialize;

/// A JSON Patch made of `add` operations only, kept as its JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddPatch {
    /// The array's JSON as far as it is written: `[`, then the operations separated by commas
    /// (the closing `]` is added when the text is taken).
    ops: String,
    /// How many operations `ops` holds.
    len: usize,
}

impl AddPatch {
    /// An empty patch.
    pub fn new() -> Self {
        AddPatch::with_capacity(0)
    }

    /// An empty patch with room for `bytes` of operations' text.
    pub fn with_capacity(bytes: usize) -> Self {
        let mut ops = String::with_capacity(bytes + 2);
        ops.push('[');
        AddPatch { ops, len: 0 }
    }

    /// Room for `bytes` more of operations' text.
    pub fn reserve(&mut self, bytes: usize) {
        self.ops.reserve(bytes);
    }

    /// Whether the patch has no operation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many operations the patch has.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Adds `{"op":"add","path":…,"value":"<value>"}`: the path is the JSON Pointer of these
    /// unescaped tokens (`~` written `~0`, `/` written `~1`).
    pub fn add_str(&mut self, tokens: &[&str], value: &str) {
        self.start(tokens);
        push_json_str(&mut self.ops, value);
        self.ops.push('}');
    }

    /// Adds `{"op":"add","path":…,"value":{}}`: an empty object at the pointer of these tokens.
    pub fn add_empty_object(&mut self, tokens: &[&str]) {
        self.start(tokens);
        self.ops.push_str("{}}");
    }

    /// The length of the patch's JSON in bytes.
    pub fn json_len(&self) -> usize {
        self.ops.len() + 1
    }

    /// Appends `other`'s operations after this patch's.
    pub fn append(&mut self, other: &AddPatch) {
        if other.is_empty() {
            return;
        }
        if !self.is_empty() {
            self.ops.push(',');
        }
        self.ops.push_str(other.ops.get(1..).unwrap_or_default());
        self.len += other.len;
    }

    /// Writes the patch's JSON (an array of operations) to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.reserve(self.ops.len() + 1);
        out.extend_from_slice(self.ops.as_bytes());
        out.push(b']');
    }

    /// The patch's JSON: an array of operations.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(self.ops.len() + 1);
        out.push_str(&self.ops);
        out.push(']');
        out
    }

    /// The patch's JSON, closing the text it was built in (no copy).
    pub fn into_json(self) -> String {
        let mut text = self.ops;
        text.push(']');
        text
    }

    /// The same patch as `json_patch` operations, to apply it. An error would mean this module
    /// wrote text that is not a JSON Patch (a bug, which the tests look for).
    pub fn to_json_patch(&self) -> Result<json_patch::Patch, serde_json::Error> {
        serde_json::from_str(&self.to_json())
    }

    /// The start of an `add`, up to and including `"value":`.
    fn start(&mut self, tokens: &[&str]) {
        if self.len > 0 {
            self.ops.push(',');
        }
        self.len += 1;
        self.ops.push_str(r#"{"op":"add","path":""#);
        for token in tokens {
            self.ops.push('/');
            push_escaped(&mut self.ops, token, |b| {
                b == b'~' || b == b'/' || needs_escape(b)
            });
        }
        self.ops.push_str(r#"","value":"#);
    }
}

impl Default for AddPatch {
    fn default() -> Self {
        AddPatch::new()
    }
}

/// Serialized as the array of operations (as `json_patch::Patch` is).
impl Serialize for AddPatch {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json_patch()
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

/// Whether JSON needs `b` escaped inside a string: `"`, `\` and the control characters.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Appends `text` as a JSON string, escaped as serde_json escapes it.
fn push_json_str(out: &mut String, text: &str) {
    out.push('"');
    push_escaped(out, text, needs_escape);
    out.push('"');
}

/// Appends `text` with each byte for which `special` holds escaped (`~` and `/` as a JSON
/// Pointer writes them, the rest as JSON does), the runs between copied as they are. Every
/// special byte is ASCII, so the runs are whole characters.
fn push_escaped(out: &mut String, text: &str, special: impl Fn(u8) -> bool) {
    // most text has nothing to escape: found so in one pass without early exit, which the
    // compiler turns into vector compares, and copied at once
    if !text.bytes().fold(false, |any, b| any | special(b)) {
        out.push_str(text);
        return;
    }
    let mut run = 0;
    for (at, b) in text.bytes().enumerate() {
        if special(b) {
            out.push_str(text.get(run..at).unwrap_or_default());
            push_escape(out, b);
            run = at + 1;
        }
    }
    out.push_str(text.get(run..).unwrap_or_default());
}

/// Appends the escape of the ASCII byte `b`: `~0` and `~1` for a pointer's `~` and `/`, else
/// serde_json's (the short forms where JSON has one, `\u00XX` in lower-case hex for the other
/// control characters).
fn push_escape(out: &mut String, b: u8) {
    match b {
        b'~' => out.push_str("~0"),
        b'/' => out.push_str("~1"),
        b'"' => out.push_str("\\\""),
        b'\\' => out.push_str("\\\\"),
        b'\n' => out.push_str("\\n"),
        b'\r' => out.push_str("\\r"),
        b'\t' => out.push_str("\\t"),
        0x08 => out.push_str("\\b"),
        0x0c => out.push_str("\\f"),
        b => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The same operations built through `json_patch` and serde_json, the reference.
    fn reference(ops: &[(&[&str], Value)]) -> String {
        let ops: Vec<json_patch::PatchOperation> = ops
            .iter()
            .map(|(tokens, value)| {
                json_patch::PatchOperation::Add(json_patch::AddOperation {
                    path: json_patch::jsonptr::PointerBuf::from_tokens(tokens.iter().copied()),
                    value: value.clone(),
                })
            })
            .collect();
        serde_json::to_string(&json_patch::Patch(ops)).expect("json")
    }

    #[test]
    fn the_text_is_what_serde_and_json_patch_write() {
        let odd = "a\"b\\c\nd\re\tf\u{08}g\u{0c}h\u{01}i\u{1f}j\u{7f}k é ✓ 🚀";
        let odd_key = ["metadata", "annotations", odd];
        let cases: Vec<(&[&str], Value)> = vec![
            (&["metadata", "annotations"], json!({})),
            (
                &["metadata", "annotations", "rightsizing.nodewarden.io/source"],
                json!("a=node, b=fleet"),
            ),
            (
                &["spec", "containers", "12", "resources", "requests", "cpu"],
                json!("250m"),
            ),
            (&["metadata", "annotations", "a~b/c~/~1"], json!(odd)),
            (&odd_key, json!("")),
            (&[], json!("root")),
            (&[""], json!({})),
        ];
        let mut patch = AddPatch::new();
        for (tokens, value) in &cases {
            match value {
                Value::String(s) => patch.add_str(tokens, s),
                _ => patch.add_empty_object(tokens),
            }
        }
        assert_eq!(patch.len(), cases.len());
        assert_eq!(patch.json_len(), reference(&cases).len());
        assert_eq!(patch.to_json(), reference(&cases));
        let mut bytes = Vec::new();
        patch.write_json(&mut bytes);
        assert_eq!(bytes, reference(&cases).into_bytes());
        assert_eq!(
            serde_json::to_value(&patch).expect("value"),
            serde_json::from_str::<Value>(&reference(&cases)).expect("reference")
        );
        assert_eq!(patch.to_json_patch().expect("a patch").0.len(), cases.len());
        assert_eq!(patch.into_json(), reference(&cases));
    }

    #[test]
    fn appending_keeps_the_order_and_the_count() {
        let mut first = AddPatch::new();
        assert!(first.is_empty());
        assert_eq!(first.to_json(), "[]");
        let mut second = AddPatch::new();
        second.add_str(&["b"], "2");
        second.add_empty_object(&["c"]);
        first.append(&AddPatch::new());
        assert_eq!(first.to_json(), "[]");
        first.add_str(&["a"], "1");
        first.append(&second);
        first.append(&AddPatch::new());
        assert_eq!(first.len(), 3);
        assert_eq!(
            first.to_json(),
            reference(&[(&["a"], json!("1")), (&["b"], json!("2")), (&["c"], json!({}))])
        );
    }
}
