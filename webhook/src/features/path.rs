//! Field paths of owned fields: `a.b.c`, `spec.initContainers[*].restartPolicy`, and nested
//! lists (`spec.groups[*].rules[*].expr`, `spec.matrix[*][*]`).
//!
//! A path is read against raw JSON, so it works on any resource, built-in or custom.

use std::fmt;

use serde_json::Value;

/// What a path looks like, for error messages.
pub const ACCEPTED: &str = "dotted field names, each optionally followed by [*] for every element of a list, \
     e.g. spec.initContainers[*].restartPolicy";

/// One step: a field name, then zero or more `[*]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    name: String,
    lists: usize,
}

/// A parsed field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    text: String,
    segments: Vec<Segment>,
}

/// Why a path does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid field path {path:?}: {why}; accepted: {ACCEPTED}")]
pub struct PathError {
    /// The path as written.
    pub path: String,
    /// What is wrong with it.
    pub why: String,
}

/// One place in an object where a path's field is set.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance<'a> {
    /// The concrete path, list indexes filled in, e.g. `spec.initContainers[1].restartPolicy`.
    pub at: String,
    /// The same place as a JSON Pointer, e.g. `/spec/initContainers/1/restartPolicy`.
    pub pointer: String,
    /// The value set there.
    pub value: &'a Value,
}

impl FieldPath {
    /// Parses a dotted path with `[*]` for every item of a list (see `ACCEPTED`).
    pub fn parse(text: &str) -> Result<Self, PathError> {
        let err = |why: String| PathError {
            path: text.to_string(),
            why,
        };
        if text.is_empty() {
            return Err(err("the path is empty".into()));
        }
        if text.len() > 1024 {
            return Err(err(format!("{} characters, at most 1024", text.len())));
        }
        let mut segments = Vec::new();
        for (i, part) in text.split('.').enumerate() {
            let (name, mut rest) = match part.find('[') {
                Some(at) => (&part[..at], &part[at..]),
                None => (part, ""),
            };
            if name.is_empty() {
                return Err(err(format!("segment {} has no field name", i + 1)));
            }
            if let Some(c) = name.chars().find(|c| c.is_whitespace() || *c == ']' || *c == '*') {
                return Err(err(format!("field name {name:?} contains {c:?}")));
            }
            let mut lists = 0;
            while !rest.is_empty() {
                if let Some(after) = rest.strip_prefix("[*]") {
                    lists += 1;
                    rest = after;
                } else {
                    let shown: String = rest.chars().take(12).collect();
                    return Err(err(format!(
                        "after {name:?} comes {shown:?}; only [*] (every element) may follow a name"
                    )));
                }
            }
            segments.push(Segment {
                name: name.to_string(),
                lists,
            });
        }
        Ok(FieldPath {
            text: text.to_string(),
            segments,
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Every place in `object` where the field is set (present and not null), in document order.
    pub fn instances<'a>(&self, object: &'a Value) -> Vec<Instance<'a>> {
        let mut out = Vec::new();
        walk(&self.segments, object, String::new(), String::new(), &mut out);
        out
    }

    /// Whether `object` sets the field anywhere.
    pub fn is_set_in(&self, object: &Value) -> bool {
        !self.instances(object).is_empty()
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn walk<'a>(
    segments: &[Segment],
    value: &'a Value,
    at: String,
    pointer: String,
    out: &mut Vec<Instance<'a>>,
) {
    let Some((first, rest)) = segments.split_first() else {
        if !value.is_null() {
            out.push(Instance { at, pointer, value });
        }
        return;
    };
    let Some(child) = value.as_object().and_then(|o| o.get(&first.name)) else {
        return;
    };
    let at = if at.is_empty() {
        first.name.clone()
    } else {
        format!("{at}.{}", first.name)
    };
    let pointer = format!("{pointer}/{}", escape_pointer(&first.name));
    lists(first.lists, rest, child, at, pointer, out);
}

/// Descends `depth` levels of lists, then walks the rest of the path in each element.
fn lists<'a>(
    depth: usize,
    rest: &[Segment],
    value: &'a Value,
    at: String,
    pointer: String,
    out: &mut Vec<Instance<'a>>,
) {
    if depth == 0 {
        walk(rest, value, at, pointer, out);
        return;
    }
    let Some(items) = value.as_array() else {
        return;
    };
    for (i, item) in items.iter().enumerate() {
        lists(
            depth - 1,
            rest,
            item,
            format!("{at}[{i}]"),
            format!("{pointer}/{i}"),
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_names_and_lists() {
        for ok in [
            "spec.color",
            "spec.initContainers[*].restartPolicy",
            "spec.groups[*].rules[*].expr",
            "spec.matrix[*][*]",
            "metadata.annotations",
            "spec.x-y_z$1",
        ] {
            assert!(FieldPath::parse(ok).is_ok(), "{ok}");
        }
        let cases = [
            ("", "empty"),
            ("spec..x", "segment 2 has no field name"),
            (".spec", "segment 1 has no field name"),
            ("spec.", "segment 2 has no field name"),
            ("spec.containers[0].name", "only [*]"),
            ("spec.containers[].name", "only [*]"),
            ("spec.containers[*", "only [*]"),
            ("spec.con tainers", "contains ' '"),
            ("spec.*", "contains '*'"),
            ("[*].x", "no field name"),
        ];
        for (path, want) in cases {
            let err = FieldPath::parse(path).expect_err(path).to_string();
            assert!(err.contains(want), "{path}: {err}");
            assert!(err.contains("accepted: dotted field names"), "{err}");
        }
    }

    #[test]
    fn finds_every_instance_in_nested_lists() {
        let obj = json!({"spec": {"groups": [
            {"rules": [{"expr": "a"}, {"other": 1}, {"expr": "c"}]},
            {"rules": []},
            {"rules": [{"expr": null}, {"expr": "e"}]}
        ], "matrix": [[1, 2], [3]]}});
        let p = FieldPath::parse("spec.groups[*].rules[*].expr").unwrap();
        let found: Vec<_> = p
            .instances(&obj)
            .into_iter()
            .map(|i| (i.at, i.pointer, i.value.clone()))
            .collect();
        assert_eq!(
            found,
            vec![
                (
                    "spec.groups[0].rules[0].expr".into(),
                    "/spec/groups/0/rules/0/expr".into(),
                    json!("a")
                ),
                (
                    "spec.groups[0].rules[2].expr".into(),
                    "/spec/groups/0/rules/2/expr".into(),
                    json!("c")
                ),
                (
                    "spec.groups[2].rules[1].expr".into(),
                    "/spec/groups/2/rules/1/expr".into(),
                    json!("e")
                ),
            ]
        );
        let m = FieldPath::parse("spec.matrix[*][*]").unwrap();
        assert_eq!(m.instances(&obj).len(), 3);
        assert_eq!(m.instances(&obj)[2].at, "spec.matrix[1][0]");
        // a list where an object is expected, and the other way round: nothing, no panic
        assert!(
            FieldPath::parse("spec.groups.rules")
                .unwrap()
                .instances(&obj)
                .is_empty()
        );
        assert!(FieldPath::parse("spec[*]").unwrap().instances(&obj).is_empty());
        assert!(!FieldPath::parse("spec.absent").unwrap().is_set_in(&obj));
    }

    #[test]
    fn pointer_escapes_slashes_and_tildes() {
        let obj = json!({"metadata": {"annotations": {"a/b~c": "x"}}});
        let p = FieldPath::parse("metadata.annotations.a/b~c").unwrap();
        assert_eq!(p.instances(&obj)[0].pointer, "/metadata/annotations/a~1b~0c");
    }
}
