//! AdmissionReview v1 on the wire.
//!
//! The request's `object` and `oldObject` stay raw JSON: the pipeline only checks that they are
//! well-formed, and each capability parses the part it needs. The response's `patch` is a base64
//! string, as the API server's own types define it.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// What the API server sends.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ReviewIn {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    pub request: Option<AdmissionRequest>,
}

#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// One admission request. `object` and `oldObject` are kept as raw JSON.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    pub request_resource: Option<GroupVersionResource>,
    #[serde(default)]
    pub request_sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default)]
    pub object: Option<Box<RawValue>>,
    #[serde(default)]
    pub old_object: Option<Box<RawValue>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
    #[serde(default)]
    pub options: Option<Box<RawValue>>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub reason: String,
}

/// What goes back to the API server.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub status: Option<Status>,
    /// Base64 of the JSON Patch.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub patch_type: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub audit_annotations: BTreeMap<String, String>,
}

impl AdmissionResponse {
    pub fn allow(uid: &str) -> Self {
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: true,
            ..Default::default()
        }
    }

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
    pub fn with_patch(mut self, patch: &json_patch::Patch) -> Result<Self, serde_json::Error> {
        if patch.0.is_empty() {
            self.patch = None;
            self.patch_type = None;
        } else {
            let bytes = serde_json::to_vec(patch)?;
            self.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
            self.patch_type = Some("JSONPatch".to_string());
        }
        Ok(self)
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
    pub api_version: String,
    pub kind: String,
    pub response: AdmissionResponse,
}

impl ReviewOut {
    pub fn new(response: AdmissionResponse) -> Self {
        ReviewOut {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            response,
        }
    }
}
