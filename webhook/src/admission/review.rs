//! AdmissionReview v1 on the wire.
//!
//! The request's `object` and `oldObject` stay raw JSON unless a handler declares its view of the
//! object ([`super::Handler::Object`]): the pipeline only checks that they are well-formed, and
//! each capability parses the part it needs. The response's `patch` is a base64
//! string, as the API server's own types define it.

use std::collections::BTreeMap;

use base64::Engine;
use nodewarden_api::domain::patch::AddPatch;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The `apiVersion` of the AdmissionReviews this webhook reads and writes.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The `kind` of an AdmissionReview.
pub const KIND: &str = "AdmissionReview";

/// What the API server sends. `O` is how the request's `object` is read and `X` what is kept of
/// its other fields ([`Extras`]): raw JSON and all of them by default; a handler's own view and
/// nothing when it declares so ([`super::Handler::Object`], [`super::Handler::Extras`]).
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
#[serde(bound(deserialize = "O: Deserialize<'de>"))]
pub struct ReviewIn<O = Box<RawValue>, X: Extras = Kept> {
    /// The review's `apiVersion`; empty when absent.
    #[serde(default)]
    pub api_version: String,
    /// The review's `kind`; empty when absent.
    #[serde(default)]
    pub kind: String,
    /// The request; a review without one is refused as a bad request.
    pub request: Option<AdmissionRequest<O, X>>,
}

/// A group, version and kind (`metav1.GroupVersionKind`).
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupVersionKind {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version, e.g. `v1`.
    #[serde(default)]
    pub version: String,
    /// Kind, e.g. `Pod`.
    #[serde(default)]
    pub kind: String,
}

/// A group, version and resource (`metav1.GroupVersionResource`).
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupVersionResource {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version, e.g. `v1`.
    #[serde(default)]
    pub version: String,
    /// Plural resource name, e.g. `pods`.
    #[serde(default)]
    pub resource: String,
}

/// The operation an admission request is for.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    /// `CREATE`.
    Create,
    /// `UPDATE`.
    Update,
    /// `DELETE`.
    Delete,
    /// `CONNECT` (e.g. `pods/exec`).
    Connect,
}

impl Operation {
    /// The operation as the API server spells it: `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// Who made the request (`authenticationv1.UserInfo`).
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user's name, e.g. `system:serviceaccount:<namespace>:<name>`.
    #[serde(default)]
    pub username: String,
    /// The user's UID.
    #[serde(default)]
    pub uid: String,
    /// The groups the user is in.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Extra attributes from the authenticator, e.g. the node a service account token is bound to.
    #[serde(default)]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a request keeps of its fields beyond who and what it is about and its object:
/// `userInfo`, `requestKind`, `requestResource`, `requestSubResource`, `oldObject` and
/// `options`. [`Kept`] reads them all; [`Skipped`] reads them only as far as [`Kept`] would
/// accept or refuse them, and keeps nothing, for a handler that decides without them (the pod
/// mutator; docs/benchmarks.md, "the lean envelope"). Either way a body one of them makes malformed is
/// refused.
pub trait Extras: Send + Sync + 'static {
    /// `userInfo`.
    type User: DeserializeOwned + Default + std::fmt::Debug + Send + Sync;
    /// `requestKind`.
    type Kind: DeserializeOwned + std::fmt::Debug + Send + Sync;
    /// `requestResource`.
    type Resource: DeserializeOwned + std::fmt::Debug + Send + Sync;
    /// `requestSubResource`.
    type Str: DeserializeOwned + std::fmt::Debug + Send + Sync;
    /// `oldObject` and `options`.
    type Raw: DeserializeOwned + std::fmt::Debug + Send + Sync;
}

/// Every field of the request kept ([`Extras`]).
#[derive(Debug)]
pub struct Kept;

impl Extras for Kept {
    type User = UserInfo;
    type Kind = GroupVersionKind;
    type Resource = GroupVersionResource;
    type Str = String;
    type Raw = Box<RawValue>;
}

/// The request's other fields checked and not kept ([`Extras`]).
#[derive(Debug)]
pub struct Skipped;

impl Extras for Skipped {
    type User = checked::User;
    type Kind = checked::Kind;
    type Resource = checked::Resource;
    type Str = checked::Str;
    type Raw = IgnoredAny;
}

/// One admission request. `object` is read as `O` (raw JSON unless a handler names its view of
/// it); `oldObject` and `options` stay raw JSON, and with [`Skipped`] they, `userInfo` and the
/// requested kind and resource are checked and not kept.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
#[serde(bound(deserialize = "O: Deserialize<'de>"))]
pub struct AdmissionRequest<O = Box<RawValue>, X: Extras = Kept> {
    /// Identifies this request; the response must carry it back.
    pub uid: String,
    /// The kind of the object, as the webhook is called for it.
    pub kind: GroupVersionKind,
    /// The resource, as the webhook is called for it.
    pub resource: GroupVersionResource,
    /// The subresource, e.g. `status` or `eviction`.
    #[serde(default)]
    pub sub_resource: Option<String>,
    /// The kind the client asked for, when the API server converted it to `kind`.
    #[serde(default = "none")]
    pub request_kind: Option<X::Kind>,
    /// The resource the client asked for, when the API server converted it to `resource`.
    #[serde(default = "none")]
    pub request_resource: Option<X::Resource>,
    /// The subresource the client asked for.
    #[serde(default = "none")]
    pub request_sub_resource: Option<X::Str>,
    /// The object's name; absent when the server generates it.
    #[serde(default)]
    pub name: Option<String>,
    /// The object's namespace; absent for cluster-scoped objects.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The operation.
    pub operation: Operation,
    /// Who made the request.
    #[serde(default)]
    pub user_info: X::User,
    /// The object as it would be admitted (raw JSON, or the handler's view); absent for DELETE.
    #[serde(default = "none")]
    pub object: Option<O>,
    /// The object before the change (raw JSON), for UPDATE and DELETE.
    #[serde(default = "none")]
    pub old_object: Option<X::Raw>,
    /// Whether the request is a dry run (nothing is persisted).
    #[serde(default)]
    pub dry_run: Option<bool>,
    /// The operation's options, e.g. `CreateOptions` (raw JSON).
    #[serde(default = "none")]
    pub options: Option<X::Raw>,
}

/// No value (the default of an optional field, without asking its type for a default).
fn none<O>() -> Option<O> {
    None
}

/// Types that accept and refuse what [`AdmissionRequest`]'s fields of the same names do with
/// [`Kept`], and keep nothing (no allocation: a list of zero-sized items allocates nothing).
pub mod checked {
    use serde::Deserialize;
    use serde::de::{Deserializer, MapAccess, Visitor};

    /// A string (as `String`).
    #[derive(Debug, Default)]
    pub struct Str;

    impl<'de> Deserialize<'de> for Str {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct AnyStr;
            impl Visitor<'_> for AnyStr {
                type Value = Str;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a string")
                }
                fn visit_str<E>(self, _: &str) -> Result<Str, E> {
                    Ok(Str)
                }
            }
            d.deserialize_str(AnyStr)
        }
    }

    /// As [`super::GroupVersionKind`].
    #[derive(Deserialize, Debug, Default)]
    pub struct Kind {
        #[serde(default, rename = "group")]
        _group: Str,
        #[serde(default, rename = "version")]
        _version: Str,
        #[serde(default, rename = "kind")]
        _kind: Str,
    }

    /// As [`super::GroupVersionResource`].
    #[derive(Deserialize, Debug, Default)]
    pub struct Resource {
        #[serde(default, rename = "group")]
        _group: Str,
        #[serde(default, rename = "version")]
        _version: Str,
        #[serde(default, rename = "resource")]
        _resource: Str,
    }

    /// As [`super::UserInfo`].
    #[derive(Deserialize, Debug, Default)]
    pub struct User {
        #[serde(default, rename = "username")]
        _username: Str,
        #[serde(default, rename = "uid")]
        _uid: Str,
        #[serde(default, rename = "groups")]
        _groups: Vec<Str>,
        #[serde(default, rename = "extra")]
        _extra: Extra,
    }

    /// As `BTreeMap<String, Vec<String>>`.
    #[derive(Debug, Default)]
    pub struct Extra;

    impl<'de> Deserialize<'de> for Extra {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Entries;
            impl<'de> Visitor<'de> for Entries {
                type Value = Extra;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a map")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Extra, A::Error> {
                    while map.next_entry::<Str, Vec<Str>>()?.is_some() {}
                    Ok(Extra)
                }
            }
            d.deserialize_map(Entries)
        }
    }
}

impl AdmissionRequest {
    /// Parses `object` into `T`; a clear message when it is missing or of another shape.
    pub fn object_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        parse_raw(self.object.as_deref(), "object")
    }

    /// Parses `oldObject` into `T`, `None` when the request has no old object.
    pub fn old_object_as<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, String> {
        match self.old_object.as_deref() {
            None => Ok(None),
            Some(raw) if raw.get() == "null" => Ok(None),
            Some(raw) => parse_raw(Some(raw), "oldObject").map(Some),
        }
    }
}

fn parse_raw<T: serde::de::DeserializeOwned>(raw: Option<&RawValue>, field: &str) -> Result<T, String> {
    let raw = raw.ok_or_else(|| format!("request.{field} is missing"))?;
    serde_json::from_str(raw.get()).map_err(|e| format!("request.{field} could not be read: {e}"))
}

/// `metav1.Status` as admission responses carry it.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// HTTP status code of a denial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// Human-readable reason for the denial, shown to the client.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub message: String,
    /// Machine-readable reason, e.g. `Forbidden`.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub reason: String,
}

/// What goes back to the API server.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's `uid`.
    pub uid: String,
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Why it is denied.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub status: Option<Status>,
    /// Base64 of the JSON Patch.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub patch: Option<String>,
    /// `JSONPatch` when `patch` is set.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub patch_type: Option<String>,
    /// Warnings shown to the client (admitted or not).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub warnings: Vec<String>,
    /// Annotations added to the request's audit event.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub audit_annotations: BTreeMap<String, String>,
}

impl AdmissionResponse {
    /// A response admitting request `uid` unchanged.
    pub fn allow(uid: &str) -> Self {
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: true,
            ..Default::default()
        }
    }

    /// A response denying request `uid` with HTTP `code`, a machine-readable `reason` and a `message` for the client.
    pub fn deny(uid: &str, code: u16, reason: &str, message: impl Into<String>) -> Self {
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: false,
            status: Some(Status {
                code: Some(code),
                message: message.into(),
                reason: reason.to_string(),
            }),
            ..Default::default()
        }
    }

    /// Sets the JSON Patch (base64 of its JSON), or clears it when the patch is empty.
    pub fn with_patch(self, patch: &json_patch::Patch) -> Result<Self, serde_json::Error> {
        if patch.0.is_empty() {
            return Ok(self.without_patch());
        }
        let mut bytes = Vec::with_capacity(2048);
        serde_json::to_writer(&mut bytes, patch)?;
        Ok(self.with_patch_json(&bytes))
    }

    /// Sets a patch of `add` operations, kept as its text ([`AddPatch`], what the right-sizing
    /// decision makes), or clears it when the patch is empty.
    pub fn with_add_patch(self, patch: AddPatch) -> Self {
        if patch.is_empty() {
            return self.without_patch();
        }
        self.with_patch_json(patch.into_json().as_bytes())
    }

    fn without_patch(mut self) -> Self {
        self.patch = None;
        self.patch_type = None;
        self
    }

    /// Sets the patch from its JSON text, in base64, with a SIMD encoder (`base64-simd`, which
    /// picks AVX2 or SSSE3 on x86-64 and NEON on arm64 when it runs): the patch is most of an
    /// answer's bytes.
    fn with_patch_json(mut self, json: &[u8]) -> Self {
        self.patch = Some(base64_simd::STANDARD.encode_to_string(json));
        self.patch_type = Some("JSONPatch".to_string());
        self
    }

    /// Writes the response as JSON: the same text serde writes for it, with fewer instructions.
    /// serde checks every byte of every string for characters to escape, one at a time; here a
    /// string that has none (the base64 patch always, which is most of an answer's bytes) is
    /// found so in a check the compiler vectorises, and copied as it is.
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.extend_from_slice(br#"{"uid":"#);
        write_str(out, &self.uid)?;
        out.extend_from_slice(if self.allowed {
            br#","allowed":true"#
        } else {
            br#","allowed":false"#
        });
        if let Some(status) = &self.status {
            out.extend_from_slice(br#","status":"#);
            serde_json::to_writer(&mut *out, status)?;
        }
        if let Some(patch) = &self.patch {
            out.extend_from_slice(br#","patch":"#);
            write_str(out, patch)?;
        }
        if let Some(patch_type) = &self.patch_type {
            out.extend_from_slice(br#","patchType":"#);
            write_str(out, patch_type)?;
        }
        if !self.warnings.is_empty() {
            out.extend_from_slice(br#","warnings":"#);
            serde_json::to_writer(&mut *out, &self.warnings)?;
        }
        if !self.audit_annotations.is_empty() {
            out.extend_from_slice(br#","auditAnnotations":"#);
            serde_json::to_writer(&mut *out, &self.audit_annotations)?;
        }
        out.push(b'}');
        Ok(())
    }

    /// Decodes the patch, for tests and tools.
    pub fn decoded_patch(&self) -> Option<json_patch::Patch> {
        let b = base64::engine::general_purpose::STANDARD
            .decode(self.patch.as_ref()?)
            .ok()?;
        serde_json::from_slice(&b).ok()
    }
}

/// The envelope of a response.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ReviewOut {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// Always [`KIND`].
    pub kind: String,
    /// The answer.
    pub response: AdmissionResponse,
}

impl ReviewOut {
    /// The envelope of `response`.
    pub fn new(response: AdmissionResponse) -> Self {
        ReviewOut {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            response,
        }
    }

    /// The review as JSON, appended to `out`: the text `serde_json::to_writer` writes for it, at
    /// less cost (see `AdmissionResponse::write_json`). What the webhook sends back.
    pub fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.extend_from_slice(br#"{"apiVersion":"#);
        write_str(out, &self.api_version)?;
        out.extend_from_slice(br#","kind":"#);
        write_str(out, &self.kind)?;
        out.extend_from_slice(br#","response":"#);
        self.response.write_json(out)?;
        out.push(b'}');
        Ok(())
    }

    /// [`ReviewOut::write_json`] into a new buffer sized for the answer (the patch and some 200
    /// bytes around it), so it is written without growing.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = Vec::with_capacity(512 + self.response.patch.as_ref().map_or(0, String::len));
        self.write_json(&mut out)?;
        Ok(out)
    }
}

/// Writes `text` as a JSON string, as serde_json does: as it is between quotes when it holds
/// nothing to escape (no `"`, `\` or control character; serde_json leaves every other character,
/// non-ASCII included, as it is), else through serde_json.
fn write_str(out: &mut Vec<u8>, text: &str) -> Result<(), serde_json::Error> {
    // no early exit: a plain fold over the bytes, which the compiler turns into vector compares
    let escapes = text
        .bytes()
        .fold(false, |any, b| any | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if escapes {
        serde_json::to_writer(&mut *out, text)
    } else {
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_kept_as_text_is_sent_as_its_json_patch_is() {
        let mut text = AddPatch::new();
        text.add_empty_object(&["metadata", "annotations"]);
        text.add_str(
            &["metadata", "annotations", "nodewarden.io/updates"],
            "agent: cpu \"request\" 120m\n",
        );
        text.add_str(&["spec", "containers", "1", "resources", "requests", "a~b"], "5m");
        let ops = text.to_json_patch().expect("a JSON patch");
        assert_eq!(ops.0.len(), 3);
        let ours = AdmissionResponse::allow("u").with_add_patch(text);
        let theirs = AdmissionResponse::allow("u").with_patch(&ops).expect("encodes");
        assert_eq!(ours.patch, theirs.patch);
        // the SIMD encoder's text is the `base64` crate's
        let json = serde_json::to_vec(&ops).expect("json");
        assert_eq!(
            ours.patch,
            Some(base64::engine::general_purpose::STANDARD.encode(json))
        );
        assert_eq!(ours.patch_type.as_deref(), Some("JSONPatch"));
        assert_eq!(ours.decoded_patch(), Some(ops));

        let cleared = ours.with_add_patch(AddPatch::new());
        assert_eq!((cleared.patch, cleared.patch_type), (None, None));
    }

    #[test]
    fn the_answer_is_written_as_serde_writes_it() {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/metadata/annotations/a", "value": "x\"y\\z\u{1}é"},
        ]))
        .expect("patch");
        let patched = AdmissionResponse::allow("uid-1")
            .with_patch(&patch)
            .expect("patch encodes");
        let mut denied = AdmissionResponse::deny("ü \"quoted\"\n", 403, "Forbidden", "no:\tnever \\ ever");
        denied.warnings = vec!["w1".to_string(), "tab\there".to_string()];
        denied
            .audit_annotations
            .insert("k\u{7f}".to_string(), "v\u{1f}".to_string());
        let mut odd = AdmissionResponse::allow("");
        odd.patch = Some("not base64 \"at all\"".to_string());
        odd.patch_type = Some("JSON\\Patch".to_string());
        odd.status = Some(Status::default());
        for response in [AdmissionResponse::allow("u"), patched, denied, odd] {
            let mut review = ReviewOut::new(response);
            for version in [API_VERSION, "v\u{0}"] {
                review.api_version = version.to_string();
                assert_eq!(
                    String::from_utf8(review.to_json().expect("written")).expect("utf-8"),
                    serde_json::to_string(&review).expect("serde"),
                );
            }
        }
    }
}
