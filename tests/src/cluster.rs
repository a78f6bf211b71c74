//! What a test sets up in the cluster: its namespace, fake nodes, CRDs, and waits on what
//! the real controllers do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::controlplane::ControlPlane;

/// Field manager of everything the harness applies.
pub const FIELD_MANAGER: &str = "nodewarden-e2e";
/// Label that ties fake nodes to the test that made them; DaemonSets of that test select it
/// so they do not create pods on other tests' nodes.
pub const NODE_GROUP_LABEL: &str = "e2e.nodewarden.io/group";
/// The taint the `TaintNodesByCondition` admission plugin puts on every new Node; the node
/// lifecycle controller removes it once the Node reports Ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// A short name unique within this test process: `<prefix>-<base36 counter+time>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let suffix = base36(((t % 1_000_000_000) as u64) * 100 + u64::from(n % 100));
    let mut prefix: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    prefix.truncate(40);
    format!("{}-{suffix}", prefix.trim_matches('-'))
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// One test's view of the shared control plane: an admin client, a namespace of its own
/// (with its `default` ServiceAccount in place), and an id to name cluster-scoped objects.
///
/// When the test panics while this is alive, the control plane's log tails are printed.
pub struct TestEnv {
    pub cp: &'static ControlPlane,
    pub client: Client,
    pub namespace: String,
    /// Unique per test; prefix for Node names and the value of [`NODE_GROUP_LABEL`].
    pub id: String,
}

impl TestEnv {
    /// Starts (or joins) the shared control plane and creates the test's namespace.
    pub async fn new(test: &str) -> Result<Self> {
        let cp = ControlPlane::shared().await?;
        let client = cp.admin_client().await?;
        let id = unique_name(test);
        let namespace = id.clone();
        create_namespace(cp, &client, &namespace).await?;
        Ok(Self {
            cp,
            client,
            namespace,
            id,
        })
    }

    /// An API for namespaced objects in the test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Waits for an `events.k8s.io` Event in the test's namespace about the `kind` object `name`
    /// with `reason`, as `kubectl describe` would list it, and returns its note.
    pub async fn wait_for_event(&self, kind: &str, name: &str, reason: &str) -> Result<String> {
        wait_for_event(self.cp, &self.client, &self.namespace, kind, name, reason).await
    }

    /// The `nodeSelector` that picks this test's fake nodes.
    pub fn node_selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(NODE_GROUP_LABEL.to_string(), self.id.clone())])
    }

    /// Creates `count` Ready, schedulable fake Nodes named `<id>-node-<i>` (see
    /// [`create_ready_node`]) and returns their names.
    pub async fn create_nodes(&self, count: usize) -> Result<Vec<String>> {
        let mut names = Vec::with_capacity(count);
        for i in 0..count {
            let name = format!("{}-node-{i}", self.id);
            let mut labels = self.node_selector();
            labels.insert("kubernetes.io/hostname".to_string(), name.clone());
            create_ready_node(self.cp, &self.client, &name, labels).await?;
            names.push(name);
        }
        Ok(names)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "nodewarden-tests: test in namespace {} failed; control plane logs ({}):\n{}",
                self.namespace,
                self.cp.dir().display(),
                self.cp.log_tails(40)
            );
        }
    }
}

/// Runs an end-to-end test body against the shared control plane; an error fails the test
/// with its full chain and the control plane's log tails (a panic prints them too, through
/// [`TestEnv`]'s `Drop`).
pub async fn e2e<F, Fut>(test: &str, body: F)
where
    F: FnOnce(TestEnv) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let env = match TestEnv::new(test).await {
        Ok(env) => env,
        Err(e) => panic!("{test}: setting up: {e:#}"),
    };
    let cp = env.cp;
    let namespace = env.namespace.clone();
    if let Err(e) = body(env).await {
        eprintln!(
            "nodewarden-tests: {test} (namespace {namespace}) failed; control plane logs ({}):\n{}",
            cp.dir().display(),
            cp.log_tails(40)
        );
        panic!("{test}: {e:#}");
    }
}

/// Creates a namespace and waits for kube-controller-manager to give it its `default`
/// ServiceAccount (pods cannot be created before that).
pub async fn create_namespace(cp: &ControlPlane, client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"e2e.nodewarden.io/test": "true"}},
    }))?;
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    cp.poll(&format!("ServiceAccount {name}/default"), || {
        let sas = sas.clone();
        async move { Ok(sas.get_opt("default").await?.map(|_| ())) }
    })
    .await
}

/// Creates a Node that no kubelet backs, then makes it look like a healthy node: status
/// Ready=True with capacity and no pressure conditions. It then waits until the node
/// lifecycle controller has removed the `not-ready` taint that admission puts on every new
/// Node, which is what lets the DaemonSet controller place pods there.
pub async fn create_ready_node(
    cp: &ControlPlane,
    client: &Client,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut all_labels = BTreeMap::from([
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
    ]);
    all_labels.extend(labels);
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {},
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating Node {name}"))?;

    let now = serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now()))?;
    let condition = |kind: &str, status: &str, reason: &str| {
        json!({
            "type": kind, "status": status, "reason": reason,
            "message": "set by the nodewarden e2e harness (no kubelet)",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    let resources = json!({"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("Ready", "True", "KubeletReady"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [{"type": "Hostname", "address": name}],
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "6.1.0",
            "osImage": "nodewarden e2e", "containerRuntimeVersion": "fake://0.0.0",
            "kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("setting the status of Node {name}"))?;

    cp.poll(
        &format!("the node lifecycle controller to untaint Node {name}"),
        || {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get(name).await?;
                let tainted = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key == NOT_READY_TAINT));
                Ok((!tainted).then_some(node))
            }
        },
    )
    .await
}

/// What an agent publishes for `container` of the autoscaler `namespace/autoscaler`: a target of
/// `cpu` and `memory` (quantities) over a day of samples, no bounds.
pub fn target_recommendation(
    namespace: &str,
    autoscaler: &str,
    container: &str,
    cpu: &str,
    memory: &str,
) -> nodewarden_api::rightsizing::ContainerRecommendation {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    nodewarden_api::rightsizing::ContainerRecommendation {
        autoscaler: nodewarden_api::rightsizing::AutoscalerRef {
            namespace: namespace.to_string(),
            name: autoscaler.to_string(),
        },
        container_name: container.to_string(),
        target: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.to_string())),
            ("memory".to_string(), Quantity(memory.to_string())),
        ])),
        lower_bound: None,
        upper_bound: None,
        uncapped_target: None,
        sample_count: 1440,
        first_sample_time: None,
        last_sample_time: None,
        oom_count: 0,
        capped: None,
    }
}

/// The node a DaemonSet pod is meant for (`nodewarden_api::domain::rightsizing::daemonset_pod_node`).
pub fn daemonset_pod_target_node(pod: &Pod) -> Option<String> {
    nodewarden_api::domain::rightsizing::daemonset_pod_node(pod)
}

/// Waits until the DaemonSet controller has created exactly one pod for each of `nodes`
/// (and none elsewhere) and returns them keyed by node.
pub async fn wait_for_daemonset_pods(
    cp: &ControlPlane,
    client: &Client,
    namespace: &str,
    daemonset: &str,
    nodes: &[String],
) -> Result<BTreeMap<String, Pod>> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let ds = daemonsets.get(daemonset).await?;
    let uid = ds
        .uid()
        .ok_or_else(|| anyhow!("DaemonSet {daemonset} has no uid"))?;
    let mut want: Vec<String> = nodes.to_vec();
    want.sort();
    let last = std::sync::Mutex::new(String::new());
    let last = &last;
    let note = |s: String| *last.lock().unwrap_or_else(|p| p.into_inner()) = s;
    let found = cp
        .poll(
            &format!("DaemonSet {namespace}/{daemonset} pods on {want:?}"),
            || {
                let pods = pods.clone();
                let uid = uid.clone();
                let want = want.clone();
                async move {
                    let owned: Vec<Pod> = pods
                        .list(&ListParams::default())
                        .await?
                        .items
                        .into_iter()
                        .filter(|p| {
                            p.owner_references()
                                .iter()
                                .any(|o| o.uid == uid && o.controller == Some(true))
                        })
                        .collect();
                    let mut by_node = BTreeMap::new();
                    for p in owned.iter() {
                        let node = daemonset_pod_target_node(p).unwrap_or_default();
                        if by_node.insert(node.clone(), p.clone()).is_some() {
                            note(format!("two pods for node {node:?}"));
                            return Ok(None);
                        }
                    }
                    let have: Vec<String> = by_node.keys().cloned().collect();
                    note(format!("pods for {have:?}"));
                    Ok((have == want).then_some(by_node))
                }
            },
        )
        .await
        .with_context(|| format!("last seen: {}", last.lock().unwrap_or_else(|p| p.into_inner())))?;
    Ok(found)
}

/// The CRD files of the chart (`charts/nodewarden/crds/*.yaml`), sorted by name; or those in
/// `$NODEWARDEN_E2E_CRD_DIR`, to try CRDs out before they are committed to the chart.
pub fn chart_crd_files() -> Result<Vec<PathBuf>> {
    let dir = match std::env::var_os("NODEWARDEN_E2E_CRD_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/nodewarden/crds"),
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    Ok(files)
}

/// Every CustomResourceDefinition in `files` (a file may hold several YAML documents).
pub fn read_crds(files: &[PathBuf]) -> Result<Vec<CustomResourceDefinition>> {
    use serde::Deserialize;
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value =
                serde_json::Value::deserialize(doc).with_context(|| format!("parsing {}", file.display()))?;
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(value)
                .with_context(|| format!("{} does not hold a CustomResourceDefinition", file.display()))?;
            crds.push(crd);
        }
    }
    Ok(crds)
}

/// Server-side applies `crds` and waits until each is Established (its API is served).
pub async fn apply_crds(
    cp: &ControlPlane,
    client: &Client,
    crds: &[CustomResourceDefinition],
) -> Result<Vec<CustomResourceDefinition>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.name_any();
        let mut crd = crd.clone();
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        crd.status = None;
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    let mut established = Vec::new();
    for crd in crds {
        let name = crd.name_any();
        let got = cp
            .poll(&format!("CRD {name} to be Established"), || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let crd = api.get(&name).await?;
                    let conditions = crd.status.as_ref().and_then(|s| s.conditions.as_ref());
                    if let Some(c) = conditions.and_then(|cs| cs.iter().find(|c| c.type_ == "NamesAccepted"))
                        && c.status == "False"
                    {
                        bail!("CRD {name} names not accepted: {:?}", c.message);
                    }
                    let ok = conditions
                        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
                    Ok(ok.then_some(crd))
                }
            })
            .await?;
        established.push(got);
    }
    Ok(established)
}

/// A DaemonSet `name` with one container `agent` (requests 100m CPU, 64Mi memory; limits
/// 200m, 128Mi) whose pods go to the nodes matching `node_selector`. The image is never
/// pulled: no kubelet runs.
pub fn simple_daemonset(name: &str, node_selector: &BTreeMap<String, String>) -> Result<DaemonSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": node_selector,
                    "containers": [{
                        "name": "agent",
                        "image": "nodewarden-e2e/pause:never-pulled",
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "64Mi"},
                            "limits": {"cpu": "200m", "memory": "128Mi"},
                        },
                    }],
                },
            },
        },
    }))?)
}

/// Waits (two minutes, [`ControlPlane::poll`]) for an `events.k8s.io` Event in `namespace` about
/// the `kind` object `name` with `reason`, as `kubectl describe` would list it, and returns its note.
pub async fn wait_for_event(
    cp: &ControlPlane,
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
    reason: &str,
) -> Result<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    cp.poll(&format!("an Event {reason} on {kind} {name}"), || {
        let api = api.clone();
        async move {
            let events = api.list(&Default::default()).await?;
            Ok(events.items.into_iter().find_map(|e| {
                let regarding = e.regarding.as_ref()?;
                (regarding.kind.as_deref() == Some(kind)
                    && regarding.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason))
                .then(|| e.note.clone().unwrap_or_default())
            }))
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded_daemonset_pod() -> Pod {
        let text = include_str!("../fixtures/admission/daemonset-pod-create.json");
        let review: serde_json::Value = serde_json::from_str(text).expect("fixture is JSON");
        serde_json::from_value(review["request"]["object"].clone()).expect("fixture holds a pod")
    }

    #[test]
    fn target_node_of_a_recorded_daemonset_pod_is_its_match_fields_value() {
        assert_eq!(
            daemonset_pod_target_node(&recorded_daemonset_pod()).as_deref(),
            Some("webhook-b8hcd8g-node-1")
        );
    }

    #[test]
    fn node_name_wins_over_affinity() {
        let mut pod = recorded_daemonset_pod();
        pod.spec.as_mut().expect("spec").node_name = Some("bound-node".to_string());
        assert_eq!(daemonset_pod_target_node(&pod).as_deref(), Some("bound-node"));
    }

    #[test]
    fn no_single_match_fields_term_means_no_target() {
        let mut pod = recorded_daemonset_pod();
        let affinity = pod
            .spec
            .as_mut()
            .and_then(|s| s.affinity.as_mut())
            .expect("affinity");
        let required = affinity
            .node_affinity
            .as_mut()
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_mut())
            .expect("required terms");
        let term = required.node_selector_terms[0].clone();
        required.node_selector_terms.push(term);
        assert_eq!(daemonset_pod_target_node(&pod), None);
        assert_eq!(daemonset_pod_target_node(&Pod::default()), None);
    }

    #[test]
    fn unique_names_are_dns_labels_and_differ() {
        let a = unique_name("Some_Test::Name");
        let b = unique_name("Some_Test::Name");
        assert_ne!(a, b);
        assert!(a.len() <= 63, "{a}");
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a}"
        );
        assert!(a.starts_with("some-test--name-"), "{a}");
    }
}
