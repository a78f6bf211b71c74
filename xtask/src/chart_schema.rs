//! The Kubernetes parts of the chart's `values.schema.json`: the values that are Kubernetes
//! objects (a pod's and a container's `securityContext`, `affinity`) are checked by the schemas
//! of the Kubernetes API itself, taken from `k8s-openapi` (the Kubernetes release the workspace
//! builds against), made strict (an unknown field is refused, as `resources` refuses `request`)
//! and without their descriptions. `cargo xtask crdgen` writes them into the file's `$defs`;
//! `tests/tests/helm_render.rs` fails when the file and these differ.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Affinity, PodSecurityContext, SecurityContext};
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::Value;

/// The chart's values schema, from the repository root.
pub const SCHEMA_FILE: &str = "charts/nodewarden/values.schema.json";

/// `(name in $defs, schema)` of every Kubernetes object the values hold.
pub fn kubernetes_defs() -> Result<Vec<(&'static str, Value)>> {
    Ok(vec![
        (
            "securityContext",
            generate::<SecurityContext>("Container securityContext")?,
        ),
        (
            "podSecurityContext",
            generate::<PodSecurityContext>("Pod securityContext")?,
        ),
        ("affinity", generate::<Affinity>("Pod affinity")?),
    ])
}

fn generate<T: JsonSchema>(description: &str) -> Result<Value> {
    let schema = SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<T>();
    let mut value = serde_json::to_value(schema).context("a generated schema")?;
    strict(&mut value);
    let object = value.as_object_mut().context("a schema object")?;
    object.remove("$schema");
    object.remove("title");
    object.insert(
        "description".into(),
        format!("{description}, checked by the Kubernetes API's schema").into(),
    );
    Ok(value)
}

/// Every object schema with `properties` refuses other fields; descriptions go (a value's
/// documentation is the chart's README, and the Kubernetes API reference).
fn strict(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("description");
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            // `properties` holds field names, not schemas: walk into each field's schema only
            for (key, inner) in map.iter_mut() {
                if key == "properties" {
                    if let Value::Object(fields) = inner {
                        fields.values_mut().for_each(strict);
                    }
                } else {
                    strict(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strict),
        _ => {}
    }
}

/// `text` (the values schema) with its Kubernetes `$defs` replaced by [`kubernetes_defs`], every
/// other key kept in its place and order; written as the file is (two-space indent).
pub fn update(text: &str) -> Result<String> {
    // read as YAML, whose mappings keep their order (serde_json's would sort them)
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).context("reading the values schema")?;
    let defs = doc
        .get_mut("$defs")
        .and_then(serde_yaml_ng::Value::as_mapping_mut)
        .context("the values schema has no $defs")?;
    for (name, schema) in kubernetes_defs()? {
        defs.insert(name.into(), serde_yaml_ng::to_value(schema)?);
    }
    let mut out = serde_json::to_string_pretty(&doc)?;
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schemas_are_strict_and_keep_kubernetes_types() {
        let defs = kubernetes_defs().unwrap();
        let sc = &defs[0].1;
        assert_eq!(sc["additionalProperties"], false);
        assert_eq!(sc["properties"]["runAsUser"]["type"], "integer");
        assert_eq!(sc["properties"]["capabilities"]["additionalProperties"], false);
        assert!(sc["properties"]["capabilities"]["properties"]["drop"].is_object());
        let affinity = &defs[2].1;
        assert!(affinity["properties"]["nodeAffinity"]["properties"].is_object());
        assert!(!serde_json::to_string(affinity).unwrap().contains("\"$ref\""));
    }

    #[test]
    fn update_keeps_the_order_of_other_keys() {
        let text = "{\n  \"z\": 1,\n  \"a\": {\n    \"y\": \"µs\",\n    \"b\": 0.05\n  },\n  \"$defs\": {\n    \"quantity\": {}\n  }\n}\n";
        let out = update(text).unwrap();
        assert!(
            out.starts_with("{\n  \"z\": 1,\n  \"a\": {\n    \"y\": \"µs\",\n    \"b\": 0.05\n  },"),
            "{out}"
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert!(v["$defs"]["quantity"].is_object() && v["$defs"]["affinity"].is_object());
        assert_eq!(update(&out).unwrap(), out, "a second run changes nothing");
    }
}
