//! CycloneDX 1.5 SBOMs (JSON) of the images, written offline from `cargo metadata`: the crates
//! compiled into an image's program, for every platform of the image, with name, version, purl
//! (`pkg:cargo/<name>@<version>`), license and the dependency graph; the image archive (its
//! SHA-256) is the SBOM's subject (`metadata.component`).
//!
//! What counts as compiled in: the package and, transitively, its normal dependencies for the
//! platform (`cargo metadata --filter-platform <triple>`); build-script and dev dependencies are
//! left out, and so are proc-macro crates with what only they depend on (they run in the
//! compiler, not in the program). `cargo metadata` resolves features for the whole workspace,
//! so an optional dependency another member turns on may be listed too: the list errs on the
//! side of more.
//!
//! Written with serde_json rather than the `cyclonedx-bom` crate: the document is a dozen
//! fields, and the crate would bring its XML writer, SPDX expression parser and validation
//! into the tree for them; the tests parse what is written instead.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::image::oci::{rfc3339, sha256_hex};

/// What an SBOM describes: an image archive.
#[derive(Debug, Clone)]
pub struct Subject {
    /// e.g. `nodewarden/nodewarden-webhook`.
    pub name: String,
    pub version: String,
    /// Full reference, e.g. `ghcr.io/nodewarden/nodewarden-webhook:0.1.0`.
    pub reference: String,
    /// `sha256:…` of the image index.
    pub digest: String,
    /// SHA-256 (hex) of the archive file.
    pub archive_sha256: String,
}

#[derive(Deserialize, Debug, Clone)]
struct Metadata {
    packages: Vec<Package>,
    resolve: Resolve,
}

#[derive(Deserialize, Debug, Clone)]
struct Package {
    id: String,
    name: String,
    version: String,
    #[serde(default)]
    license: Option<String>,
    #[serde(default)]
    targets: Vec<CargoTarget>,
}

#[derive(Deserialize, Debug, Clone)]
struct CargoTarget {
    kind: Vec<String>,
}

#[derive(Deserialize, Debug, Clone)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Deserialize, Debug, Clone)]
struct Node {
    id: String,
    #[serde(default)]
    deps: Vec<NodeDep>,
}

#[derive(Deserialize, Debug, Clone)]
struct NodeDep {
    pkg: String,
    #[serde(default)]
    dep_kinds: Vec<DepKind>,
}

#[derive(Deserialize, Debug, Clone)]
struct DepKind {
    kind: Option<String>,
}

/// One crate of an SBOM.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crate {
    pub name: String,
    pub version: String,
    pub license: Option<String>,
}

impl Crate {
    pub fn purl(&self) -> String {
        format!("pkg:cargo/{}@{}", self.name, self.version)
    }
}

/// The workspace's crate graph for one platform (`cargo metadata --filter-platform`).
#[derive(Debug, Clone)]
pub struct CrateGraph {
    pub triple: String,
    packages: BTreeMap<String, Package>,
    /// Normal dependencies of each package id.
    deps: BTreeMap<String, Vec<String>>,
}

impl CrateGraph {
    /// Reads `cargo metadata --locked --filter-platform <triple>` of the workspace at `root`.
    pub fn load(root: &Path, triple: &str) -> Result<Self> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut cmd = Command::new(&cargo);
        crate::image::clean_cargo_env(&mut cmd);
        let out = cmd
            .current_dir(root)
            .args([
                "metadata",
                "--locked",
                "--format-version",
                "1",
                "--filter-platform",
                triple,
            ])
            .output()
            .with_context(|| format!("running {cargo} metadata"))?;
        ensure!(
            out.status.success(),
            "cargo metadata failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Self::from_json(triple, &out.stdout)
    }

    /// [`CrateGraph::load`] for each triple.
    pub fn load_all(root: &Path, triples: &[&str]) -> Result<Vec<Self>> {
        triples.iter().map(|t| Self::load(root, t)).collect()
    }

    /// Reads `cargo metadata`'s JSON.
    pub fn from_json(triple: &str, json: &[u8]) -> Result<Self> {
        let meta: Metadata = serde_json::from_slice(json).context("reading cargo metadata's JSON")?;
        let deps = meta
            .resolve
            .nodes
            .into_iter()
            .map(|n| {
                let normal = n
                    .deps
                    .into_iter()
                    .filter(|d| d.dep_kinds.iter().any(|k| k.kind.is_none()))
                    .map(|d| d.pkg)
                    .collect();
                (n.id, normal)
            })
            .collect();
        Ok(CrateGraph {
            triple: triple.to_string(),
            packages: meta.packages.into_iter().map(|p| (p.id.clone(), p)).collect(),
            deps,
        })
    }

    /// The crates compiled into `package`'s programs (itself first, then its dependencies by
    /// name and version), and each one's dependencies among them.
    pub fn closure(&self, package: &str) -> Result<BTreeMap<Crate, BTreeSet<Crate>>> {
        let root = self
            .packages
            .values()
            .find(|p| p.name == package && self.deps.contains_key(&p.id))
            .with_context(|| format!("no package {package} in cargo metadata"))?;
        let krate = |p: &Package| Crate {
            name: p.name.clone(),
            version: p.version.clone(),
            license: p.license.clone(),
        };
        let is_proc_macro = |p: &Package| p.targets.iter().any(|t| t.kind.iter().any(|k| k == "proc-macro"));
        let mut out: BTreeMap<Crate, BTreeSet<Crate>> = BTreeMap::new();
        let mut seen = BTreeSet::from([root.id.clone()]);
        let mut todo = vec![root.id.clone()];
        while let Some(id) = todo.pop() {
            let pkg = &self.packages[&id];
            let mut edges = BTreeSet::new();
            for dep in self.deps.get(&id).into_iter().flatten() {
                let Some(dp) = self.packages.get(dep) else {
                    continue;
                };
                if is_proc_macro(dp) {
                    continue;
                }
                edges.insert(krate(dp));
                if seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
            out.entry(krate(pkg)).or_default().extend(edges);
        }
        Ok(out)
    }
}

/// A UUID (version 5 layout) from a hash, for `serialNumber`: the same SBOM, the same number.
fn uuid_of(seed: &str) -> String {
    let h = sha256_hex(seed.as_bytes());
    let mut b: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect();
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The CycloneDX 1.5 document of the image `subject` whose program is `package`, over every
/// platform of `graphs` (one crate graph per platform of the image).
pub fn image_sbom(subject: &Subject, package: &str, graphs: &[CrateGraph], epoch: u64) -> Result<Value> {
    ensure!(!graphs.is_empty(), "no platform to list the crates of");
    let mut all: BTreeMap<Crate, BTreeSet<Crate>> = BTreeMap::new();
    let mut platforms: BTreeMap<Crate, BTreeSet<&str>> = BTreeMap::new();
    for graph in graphs {
        for (krate, deps) in graph.closure(package)? {
            platforms
                .entry(krate.clone())
                .or_default()
                .insert(graph.triple.as_str());
            all.entry(krate).or_default().extend(deps);
        }
    }
    let every: BTreeSet<&str> = graphs.iter().map(|g| g.triple.as_str()).collect();
    let image_ref = format!("oci:{}", subject.reference);
    let components: Vec<Value> = all
        .keys()
        .map(|c| {
            let mut v = json!({
                "type": if c.name == package { "application" } else { "library" },
                "bom-ref": c.purl(),
                "name": c.name,
                "version": c.version,
                "purl": c.purl(),
            });
            if let Some(license) = &c.license {
                v["licenses"] = json!([{ "expression": license }]);
            }
            let on = &platforms[c];
            if *on != every {
                v["properties"] = json!([{
                    "name": "nodewarden:rust-targets",
                    "value": on.iter().copied().collect::<Vec<_>>().join(","),
                }]);
            }
            v
        })
        .collect();
    let program = all
        .keys()
        .find(|c| c.name == package)
        .context("the program's own crate is missing")?;
    let mut dependencies = vec![json!({ "ref": image_ref, "dependsOn": [program.purl()] })];
    dependencies.extend(all.iter().map(|(c, deps)| {
        json!({
            "ref": c.purl(),
            "dependsOn": deps.iter().map(Crate::purl).collect::<Vec<_>>(),
        })
    }));
    let seed = format!("{}{}", subject.archive_sha256, subject.digest);
    Ok(json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": format!("urn:uuid:{}", uuid_of(&seed)),
        "version": 1,
        "metadata": {
            "timestamp": rfc3339(epoch),
            "tools": { "components": [{ "type": "application", "name": "cargo xtask release" }] },
            "component": {
                "type": "container",
                "bom-ref": image_ref,
                "name": subject.name,
                "version": subject.version,
                "hashes": [{ "alg": "SHA-256", "content": subject.archive_sha256 }],
                "properties": [
                    { "name": "nodewarden:image-reference", "value": subject.reference },
                    { "name": "nodewarden:image-index-digest", "value": subject.digest },
                    { "name": "nodewarden:rust-targets", "value": every.iter().copied().collect::<Vec<_>>().join(",") },
                ],
            },
        },
        "components": components,
        "dependencies": dependencies,
    }))
}

/// The document as pretty JSON with a final newline.
pub fn to_json(doc: &Value) -> Result<Vec<u8>> {
    let mut out = serde_json::to_vec_pretty(doc)?;
    out.push(b'\n');
    Ok(out)
}
