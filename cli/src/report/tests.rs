use serde_json::{Value, json};

use super::*;

const MI: i64 = 1 << 20;

fn dsa(extra_spec: Value, status: Value) -> DaemonSetAutoscaler {
    let mut spec = json!({"targetRef": {"kind": "DaemonSet", "name": "logs"}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "logs", "namespace": "obs"},
        "spec": spec, "status": status,
    }))
    .expect("autoscaler")
}

fn daemonset() -> DaemonSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "logs", "namespace": "obs", "uid": "ds-uid"},
        "spec": {
            "selector": {"matchLabels": {"app": "logs"}},
            "template": {"metadata": {"labels": {"app": "logs"}}, "spec": {"containers": [
                {"name": "shipper", "image": "x", "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}}},
                {"name": "sidecar", "image": "x", "resources": {"requests": {"cpu": "50m"}}},
            ]}},
        },
    }))
    .expect("daemonset")
}

/// A pod of the DaemonSet aimed at `node` the way the DaemonSet controller does it (matchFields).
fn pod(node: &str, created: &str, shipper: (&str, &str)) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("logs-{node}-{created}"), "namespace": "obs", "creationTimestamp": created,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "logs",
                                 "uid": "ds-uid", "controller": true}],
        },
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]}}},
            "containers": [
                {"name": "shipper", "image": "x", "resources": {"requests": {"cpu": shipper.0, "memory": shipper.1}}},
                {"name": "sidecar", "image": "x", "resources": {"requests": {"cpu": "50m"}}},
            ],
        },
    }))
    .expect("pod")
}

fn rec(
    node: &str,
    container: &str,
    target: (&str, &str),
    lower: (&str, &str),
    upper: (&str, &str),
    oom: i64,
) -> NodeRecommendation {
    serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "NodeRecommendation",
        "metadata": {"name": node},
        "spec": {"recommendations": [{
            "autoscaler": {"namespace": "obs", "name": "logs"}, "containerName": container,
            "target": {"cpu": target.0, "memory": target.1},
            "lowerBound": {"cpu": lower.0, "memory": lower.1},
            "upperBound": {"cpu": upper.0, "memory": upper.1},
            "sampleCount": 100, "oomCount": oom,
        }]},
    }))
    .expect("recommendation")
}

fn res(cpu: i64, mem: i64) -> Resources {
    Resources {
        cpu_millis: Some(cpu),
        memory_bytes: Some(mem),
    }
}

fn shipper_row<'a>(report: &'a Report, node: &str) -> &'a Row {
    report.daemonsets[0]
        .rows
        .iter()
        .find(|r| r.node == node && r.container == "shipper")
        .expect("row")
}

/// What one case expects of the `shipper` container on node `a`.
struct Want {
    source: Source,
    current: Resources,
    target: Resources,
    delta: (i64, i64),
}

#[test]
fn shipper_on_node_a_per_case() {
    let hot = rec(
        "a",
        "shipper",
        ("500m", "512Mi"),
        ("400m", "400Mi"),
        ("800m", "1Gi"),
        2,
    );
    let quiet = rec(
        "a",
        "shipper",
        ("20m", "100Mi"),
        ("10m", "80Mi"),
        ("40m", "150Mi"),
        0,
    );
    type Case = (
        &'static str,
        DaemonSetAutoscaler,
        Vec<Pod>,
        Vec<NodeRecommendation>,
        Want,
    );
    let cases: Vec<Case> = vec![
        (
            "a hot node needs more than its pod has",
            dsa(json!({}), json!({})),
            vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
            vec![hot.clone()],
            Want {
                source: Source::Node,
                current: res(200, 256 * MI),
                target: res(500, 512 * MI),
                delta: (300, 256 * MI),
            },
        ),
        (
            "a quiet node frees what its pod does not use",
            dsa(json!({}), json!({})),
            vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
            vec![quiet.clone()],
            Want {
                source: Source::Node,
                current: res(200, 256 * MI),
                target: res(20, 100 * MI),
                delta: (-180, -156 * MI),
            },
        ),
        (
            "the newest pod on the node counts",
            dsa(json!({}), json!({})),
            vec![
                pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi")),
                pod("a", "2026-01-02T00:00:00Z", ("500m", "512Mi")),
            ],
            vec![hot.clone()],
            Want {
                source: Source::Node,
                current: res(500, 512 * MI),
                target: res(500, 512 * MI),
                delta: (0, 0),
            },
        ),
        (
            "no pod yet: current is the template",
            dsa(json!({}), json!({})),
            vec![],
            vec![quiet.clone()],
            Want {
                source: Source::Node,
                current: res(200, 256 * MI),
                target: res(20, 100 * MI),
                delta: (-180, -156 * MI),
            },
        ),
        (
            "ceiling Template caps the target at the template",
            dsa(json!({"ceiling": "Template"}), json!({})),
            vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
            vec![hot.clone()],
            Want {
                source: Source::Node,
                current: res(200, 256 * MI),
                target: res(200, 256 * MI),
                delta: (0, 0),
            },
        ),
        (
            "no recommendation, cold start Template: nothing changes",
            dsa(
                json!({}),
                json!({"fleet": [{"containerName": "shipper", "target": {"cpu": "1", "memory": "1Gi"}}]}),
            ),
            vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
            vec![],
            Want {
                source: Source::None,
                current: res(200, 256 * MI),
                target: res(200, 256 * MI),
                delta: (0, 0),
            },
        ),
        (
            "no recommendation, cold start Fleet: the fleet figure",
            dsa(
                json!({"coldStart": "Fleet"}),
                json!({"fleet": [{"containerName": "shipper", "target": {"cpu": "1", "memory": "1Gi"}}]}),
            ),
            vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
            vec![],
            Want {
                source: Source::Fleet,
                current: res(200, 256 * MI),
                target: res(1000, 1024 * MI),
                delta: (800, 768 * MI),
            },
        ),
        (
            "container policy Off keeps the pod as it is",
            dsa(
                json!({"resourcePolicy": {"containerPolicies": [{"containerName": "shipper", "mode": "Off"}]}}),
                json!({}),
            ),
            vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
            vec![hot.clone()],
            Want {
                source: Source::Off,
                current: res(200, 256 * MI),
                target: res(200, 256 * MI),
                delta: (0, 0),
            },
        ),
        (
            "only cpu controlled: memory stays",
            dsa(
                json!({"resourcePolicy": {"containerPolicies": [{"containerName": "*", "controlledResources": ["cpu"]}]}}),
                json!({}),
            ),
            vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
            vec![hot.clone()],
            Want {
                source: Source::Node,
                current: res(200, 256 * MI),
                target: res(500, 256 * MI),
                delta: (300, 0),
            },
        ),
    ];
    for (name, autoscaler, pods, recommendations, want) in cases {
        let report = compute(&Snapshot {
            autoscalers: vec![autoscaler],
            daemonsets: vec![daemonset()],
            pods,
            recommendations,
            ..Snapshot::default()
        });
        let row = shipper_row(&report, "a");
        assert_eq!(row.source, want.source, "{name}: source");
        assert_eq!(row.current, want.current, "{name}: current");
        assert_eq!(row.template, res(200, 256 * MI), "{name}: template");
        assert_eq!(row.target, want.target, "{name}: target");
        assert_eq!(
            (row.delta.cpu_millis, row.delta.memory_bytes),
            want.delta,
            "{name}: delta"
        );
    }
}

#[test]
fn totals_add_up_by_node_and_overall() {
    let mut hot = rec(
        "a",
        "shipper",
        ("500m", "512Mi"),
        ("400m", "400Mi"),
        ("800m", "1Gi"),
        2,
    );
    hot.spec.recommendations.push(
        rec(
            "a",
            "sidecar",
            ("10m", "20Mi"),
            ("5m", "10Mi"),
            ("20m", "30Mi"),
            0,
        )
        .spec
        .recommendations[0]
            .clone(),
    );
    let quiet = rec(
        "b",
        "shipper",
        ("20m", "100Mi"),
        ("10m", "80Mi"),
        ("40m", "150Mi"),
        1,
    );
    let report = compute(&Snapshot {
        autoscalers: vec![dsa(json!({}), json!({}))],
        daemonsets: vec![daemonset()],
        pods: vec![
            pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi")),
            pod("b", "2026-01-01T00:00:00Z", ("200m", "256Mi")),
            pod("c", "2026-01-01T00:00:00Z", ("200m", "256Mi")),
        ],
        recommendations: vec![hot, quiet],
        ..Snapshot::default()
    });
    let ds = &report.daemonsets[0];
    assert_eq!(ds.rows.len(), 6, "3 nodes × 2 containers");
    // node a: shipper +300m +256Mi, sidecar -40m +20Mi (no memory request in the pod: it adds one)
    // node b: shipper -180m -156Mi; node c: no recommendation
    let by_node: Vec<(&str, i64, i64, i64, i64, i64)> = report
        .nodes
        .iter()
        .map(|n| {
            let t = n.totals;
            (
                n.node.as_str(),
                t.cpu_free_millis,
                t.cpu_needed_millis,
                t.memory_free_bytes,
                t.memory_needed_bytes,
                t.oom_kills,
            )
        })
        .collect();
    assert_eq!(
        by_node,
        vec![
            ("a", 40, 300, 0, 276 * MI, 2),
            ("b", 180, 0, 156 * MI, 0, 1),
            ("c", 0, 0, 0, 0, 0)
        ]
    );
    assert_eq!(
        report.totals,
        Totals {
            cpu_free_millis: 220,
            cpu_needed_millis: 300,
            memory_free_bytes: 156 * MI,
            memory_needed_bytes: 276 * MI,
            oom_kills: 3
        }
    );
    assert_eq!(ds.totals, report.totals);
    assert_eq!(
        report.nodes[0].current,
        Delta {
            cpu_millis: 250,
            memory_bytes: 256 * MI
        }
    );
    assert_eq!(
        report.nodes[0].target,
        Delta {
            cpu_millis: 510,
            memory_bytes: 532 * MI
        }
    );
}

#[test]
fn missing_daemonset_and_other_autoscalers_entries() {
    let mut other = rec("a", "shipper", ("5", "5Gi"), ("1", "1Gi"), ("9", "9Gi"), 0);
    other.spec.recommendations[0].autoscaler.name = "other".to_string();
    let report = compute(&Snapshot {
        autoscalers: vec![dsa(json!({}), json!({}))],
        daemonsets: vec![],
        pods: vec![],
        recommendations: vec![other.clone()],
        ..Snapshot::default()
    });
    assert_eq!(
        report.daemonsets[0].problem.as_deref(),
        Some("DaemonSet obs/logs does not exist")
    );
    let report = compute(&Snapshot {
        autoscalers: vec![dsa(json!({}), json!({}))],
        daemonsets: vec![daemonset()],
        pods: vec![],
        recommendations: vec![other],
        ..Snapshot::default()
    });
    assert!(
        report.daemonsets[0].rows.is_empty(),
        "entries of another autoscaler are not this one's"
    );
}

#[test]
fn pod_node_reads_node_name_then_match_fields() {
    let mut p = pod("a", "2026-01-01T00:00:00Z", ("1", "1Mi"));
    assert_eq!(pod_node(&p).as_deref(), Some("a"));
    p.spec.as_mut().expect("spec").node_name = Some("b".to_string());
    assert_eq!(pod_node(&p).as_deref(), Some("b"));
}

#[test]
fn quantities_print_as_kubernetes_writes_them() {
    use render::{cpu, memory};
    let cases: &[(String, &str)] = &[
        (cpu(250), "250m"),
        (cpu(2000), "2"),
        (cpu(1500), "1500m"),
        (memory(64 * MI), "64Mi"),
        (memory(1 << 30), "1Gi"),
        (memory(3 << 29), "1.5Gi"),
        (memory(300 << 10), "300Ki"),
        (memory(12), "12"),
        (memory(-156 * MI), "-156Mi"),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}

#[test]
fn every_format_renders_the_figures() {
    let report = compute(&Snapshot {
        autoscalers: vec![dsa(json!({}), json!({}))],
        daemonsets: vec![daemonset()],
        pods: vec![pod("a<b", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
        recommendations: vec![rec(
            "a<b",
            "shipper",
            ("500m", "512Mi"),
            ("400m", "400Mi"),
            ("800m", "1Gi"),
            2,
        )],
        ..Snapshot::default()
    });
    let view = render::View {
        headers: true,
        ..render::View::default()
    };
    let text = |f: &dyn Fn(&mut dyn std::io::Write) -> std::io::Result<()>| {
        let mut out = Vec::new();
        f(&mut out).expect("render");
        String::from_utf8(out).expect("utf-8")
    };
    let table = text(&|out| render::table(&report, &view, false, out));
    assert!(
        table.contains("DaemonSet obs/logs (autoscaler logs, mode Initial)"),
        "{table}"
    );
    assert!(table.contains("200m / 256Mi"), "{table}");
    assert!(table.contains("500m / 512Mi"), "{table}");
    assert!(table.contains("+300m"), "{table}");
    assert!(
        table.contains("Total: frees 0 CPU and 0 memory, needs 300m CPU and 256Mi memory"),
        "{table}"
    );

    let json: Value = serde_json::from_str(&text(&|out| render::json(&report, out))).expect("json");
    assert_eq!(json["daemonsets"][0]["rows"][0]["target"]["cpuMillis"], 500);
    assert_eq!(json["totals"]["memoryNeededBytes"], 256 * MI);

    let csv = text(&|out| render::csv(&report, &view, out));
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "header + 2 containers: {csv}");
    assert!(
        lines[1].starts_with(
            "obs,logs,logs,Initial,a<b,shipper,node,true,200,268435456,200,268435456,500,536870912"
        ),
        "{csv}"
    );

    let html = text(&|out| render::html(&report, &view, out));
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<svg"), "a chart");
    assert!(
        html.contains("a&lt;b") && !html.contains("a<b"),
        "names are escaped"
    );
    assert_self_contained(&html);
}

/// A figure the node's agent held at the node's allocatable is marked under the table, with
/// the history behind it; JSON carries the same line.
#[test]
fn a_capped_figure_says_why_under_the_table() {
    let mut capped = rec(
        "a",
        "shipper",
        ("273m", "363Mi"),
        ("46m", "250Mi"),
        ("4", "16Gi"),
        0,
    );
    capped.spec.recommendations[0].capped = serde_json::from_value(json!({
        "upperBound": {"cpu": "NodeAllocatable", "memory": "NodeAllocatable"}, "history": "2m"
    }))
    .expect("capped");
    let report = compute(&Snapshot {
        autoscalers: vec![dsa(json!({}), json!({}))],
        daemonsets: vec![daemonset()],
        pods: vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
        recommendations: vec![capped],
        ..Snapshot::default()
    });
    let view = render::View {
        headers: true,
        ..render::View::default()
    };
    let table = render_to_string(|out| render::table(&report, &view, false, out));
    assert!(
        table.contains("  a shipper: capped upper cpu+memory at node allocatable (history 2m)"),
        "{table}"
    );
    let json: Value =
        serde_json::from_str(&render_to_string(|out| render::json(&report, out))).expect("json");
    let rows = json["daemonsets"][0]["rows"].as_array().expect("rows");
    let shipper = rows
        .iter()
        .find(|r| r["container"] == "shipper")
        .expect("the shipper's row");
    assert_eq!(
        shipper["capped"],
        "upper cpu+memory at node allocatable (history 2m)"
    );
    // nothing capped: no line, no field
    let plain = compute(&Snapshot {
        autoscalers: vec![dsa(json!({}), json!({}))],
        daemonsets: vec![daemonset()],
        pods: vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
        recommendations: vec![rec(
            "a",
            "shipper",
            ("273m", "363Mi"),
            ("46m", "250Mi"),
            ("1", "1Gi"),
            0,
        )],
        ..Snapshot::default()
    });
    let table = render_to_string(|out| render::table(&plain, &view, false, out));
    assert!(!table.contains("capped"), "{table}");
}

/// The report takes each node's figure by the rule the webhook applies: with `scope:
/// NodeGroup` a node gets its group's figure, not its own, and the namespace's LimitRanges cap
/// it (here: no container above 300m CPU).
#[test]
fn group_figures_and_limit_ranges_are_applied_as_the_webhook_applies_them() {
    let autoscaler = dsa(
        json!({"scope": "NodeGroup", "nodeGroupLabel": "pool", "coldStart": "Group"}),
        json!({"nodeGroupLabel": "pool", "groups": [{"value": "big", "nodes": 2, "containers": [
            {"containerName": "shipper", "target": {"cpu": "400m", "memory": "300Mi"},
             "median": {"cpu": "400m", "memory": "300Mi"}}
        ]}]}),
    );
    let limit_range: LimitRange = serde_json::from_value(json!({
        "metadata": {"name": "cap", "namespace": "obs"},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "300m"}}]},
    }))
    .expect("limit range");
    let snapshot = Snapshot {
        autoscalers: vec![autoscaler],
        daemonsets: vec![daemonset()],
        pods: vec![pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi"))],
        recommendations: vec![rec(
            "a",
            "shipper",
            ("20m", "100Mi"),
            ("10m", "80Mi"),
            ("40m", "150Mi"),
            1,
        )],
        node_labels: BTreeMap::from([(
            "a".to_string(),
            BTreeMap::from([("pool".to_string(), "big".to_string())]),
        )]),
        limit_ranges: vec![],
    };
    let row = shipper_row(&compute(&snapshot), "a").clone();
    assert_eq!(row.source, Source::Group);
    assert_eq!(row.source_detail, "group");
    assert_eq!(
        row.target,
        res(400, 300 * MI),
        "the group's figure, not the node's 20m"
    );
    assert_eq!(
        row.oom_kills, 1,
        "the node's OOM kills are shown whatever the figure"
    );
    assert_eq!(
        row.lower_bound,
        Resources::default(),
        "bounds only with the node's own figure"
    );

    let capped = compute(&Snapshot {
        limit_ranges: vec![limit_range],
        ..snapshot
    });
    assert_eq!(
        shipper_row(&capped, "a").target.cpu_millis,
        Some(300),
        "the LimitRange's max"
    );
}

/// `obj` (any JSON object of the fixtures) moved to namespace `ns`.
fn in_namespace<T: serde::Serialize + serde::de::DeserializeOwned>(obj: &T, ns: &str) -> T {
    let mut v = serde_json::to_value(obj).expect("to json");
    v["metadata"]["namespace"] = json!(ns);
    serde_json::from_value(v).expect("from json")
}

/// Two DaemonSets (`obs/logs`, `web/logs`) on nodes `a` and `b`: in `obs`, `a` needs +300m and
/// `b` frees 180m; in `web`, `a` frees 150m and 200Mi, `b` needs +10m and 1Gi.
fn two_namespaces() -> Report {
    let obs_pods = vec![
        pod("a", "2026-01-01T00:00:00Z", ("200m", "256Mi")),
        pod("b", "2026-01-01T00:00:00Z", ("200m", "256Mi")),
    ];
    let web_pods: Vec<Pod> = obs_pods.iter().map(|p| in_namespace(p, "web")).collect();
    let entry = |node: &str, ns: &str, target: (&str, &str)| {
        let mut r = rec(node, "shipper", target, target, target, 0);
        r.spec.recommendations[0].autoscaler.namespace = ns.to_string();
        r.spec.recommendations.remove(0)
    };
    let mut a = rec("a", "shipper", ("500m", "256Mi"), ("1", "1Mi"), ("1", "1Mi"), 0);
    a.spec.recommendations = vec![
        entry("a", "obs", ("500m", "256Mi")),
        entry("a", "web", ("50m", "56Mi")),
    ];
    let mut b = a.clone();
    b.metadata.name = Some("b".to_string());
    b.spec.recommendations = vec![
        entry("b", "obs", ("20m", "256Mi")),
        entry("b", "web", ("210m", "1280Mi")),
    ];
    let autoscaler = dsa(json!({}), json!({}));
    let mut report = compute(&Snapshot {
        autoscalers: vec![in_namespace(&autoscaler, "web"), autoscaler],
        daemonsets: vec![daemonset(), in_namespace(&daemonset(), "web")],
        pods: obs_pods.into_iter().chain(web_pods).collect(),
        recommendations: vec![a, b],
        ..Snapshot::default()
    });
    report.sort(SortBy::Change);
    report
}

fn render_to_string(f: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>) -> String {
    let mut out = Vec::new();
    f(&mut out).expect("render");
    String::from_utf8(out).expect("utf-8")
}

fn view(sort: SortBy, headers: bool) -> render::View {
    render::View {
        sort,
        headers,
        namespace: None,
    }
}

/// The first two fields of each line without headers: namespace/DaemonSet, node, container.
fn keys(table: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn the_table_header_lines_are_as_documented() {
    let report = two_namespaces();
    let table = render_to_string(|out| render::table(&report, &view(SortBy::Change, true), false, out));
    let header: Vec<&str> = table
        .lines()
        .filter(|l| l.trim_start().starts_with("NODE") && l.contains("CONTAINER"))
        .map(|l| l.trim())
        .collect();
    assert_eq!(header.len(), 2, "one header per DaemonSet:\n{table}");
    assert_eq!(
        header[0].split_whitespace().collect::<Vec<_>>().join(" "),
        "NODE CONTAINER TEMPLATE CURRENT TARGET LOWER UPPER HISTORY SOURCE OOM CPU Δ MEMORY Δ"
    );
    let wide = render_to_string(|out| render::table(&report, &view(SortBy::Change, true), true, out));
    let header = wide
        .lines()
        .find(|l| l.trim_start().starts_with("NODE") && l.contains("CONTAINER"))
        .expect("header");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>().join(" "),
        "NODE CONTAINER TEMPLATE CURRENT TARGET LOWER UPPER HISTORY SOURCE DETAIL OOM CPU Δ MEMORY Δ"
    );
    assert!(wide.contains("node-recommendation"), "the detail column:\n{wide}");
    assert!(
        !table.contains("node-recommendation"),
        "not in the narrow table:\n{table}"
    );
    let csv = render_to_string(|out| render::csv(&report, &view(SortBy::Change, true), out));
    assert_eq!(csv.lines().next(), Some(render::CSV_HEADER.join(",").as_str()));
}

#[test]
fn sort_by_orders_the_rows_across_namespaces() {
    let report = two_namespaces();
    let lines = |sort| {
        keys(&render_to_string(|out| {
            render::table(&report, &view(sort, false), false, out)
        }))
    };
    // CPU Δ: obs/a +300m, obs/b -180m, web/a -150m, web/b +10m; sidecars 0
    assert_eq!(
        lines(SortBy::Change),
        [
            "obs/logs a shipper",
            "obs/logs b shipper",
            "web/logs a shipper",
            "web/logs b shipper",
            "obs/logs a sidecar",
            "obs/logs b sidecar",
            "web/logs a sidecar",
            "web/logs b sidecar",
        ]
    );
    // memory Δ: web/b +1Gi, web/a -200Mi, the rest 0 (then CPU Δ)
    assert_eq!(
        lines(SortBy::MemoryChange)[..4],
        [
            "web/logs b shipper",
            "web/logs a shipper",
            "obs/logs a shipper",
            "obs/logs b shipper",
        ]
    );
    assert_eq!(
        lines(SortBy::Name),
        [
            "obs/logs a shipper",
            "obs/logs a sidecar",
            "obs/logs b shipper",
            "obs/logs b sidecar",
            "web/logs a shipper",
            "web/logs a sidecar",
            "web/logs b shipper",
            "web/logs b sidecar",
        ]
    );
    assert_eq!(
        lines(SortBy::Node),
        [
            "obs/logs a shipper",
            "obs/logs a sidecar",
            "web/logs a shipper",
            "web/logs a sidecar",
            "obs/logs b shipper",
            "obs/logs b sidecar",
            "web/logs b shipper",
            "web/logs b sidecar",
        ]
    );
    // the CSV follows the same order
    let csv = render_to_string(|out| render::csv(&report, &view(SortBy::Node, false), out));
    let csv_keys: Vec<String> = csv
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            format!("{}/{} {} {}", f[0], f[2], f[4], f[5])
        })
        .collect();
    assert_eq!(csv_keys, lines(SortBy::Node));
}

#[test]
fn sort_orders_each_daemonsets_rows_and_the_nodes() {
    let mut report = two_namespaces();
    let order = |r: &Report| -> Vec<Vec<String>> {
        r.daemonsets
            .iter()
            .map(|ds| {
                ds.rows
                    .iter()
                    .map(|r| format!("{} {}", r.node, r.container))
                    .collect()
            })
            .collect()
    };
    assert_eq!(
        order(&report),
        [
            ["a shipper", "b shipper", "a sidecar", "b sidecar"],
            ["a shipper", "b shipper", "a sidecar", "b sidecar"],
        ]
    );
    // node b: 180m + 10m CPU changed, node a: 300m + 150m
    let nodes: Vec<&str> = report.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(nodes, ["a", "b"]);
    report.sort(SortBy::MemoryChange);
    let nodes: Vec<&str> = report.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(nodes, ["b", "a"], "b changes 1Gi of memory, a 200Mi");
    report.sort(SortBy::Name);
    assert_eq!(
        order(&report),
        [
            ["a shipper", "a sidecar", "b shipper", "b sidecar"],
            ["a shipper", "a sidecar", "b shipper", "b sidecar"],
        ]
    );
    let namespaces: Vec<&str> = report.daemonsets.iter().map(|d| d.namespace.as_str()).collect();
    assert_eq!(namespaces, ["obs", "web"], "every namespace is listed, by name");
}

#[test]
fn no_headers_prints_only_the_rows() {
    let report = two_namespaces();
    for wide in [false, true] {
        let table = render_to_string(|out| render::table(&report, &view(SortBy::Change, false), wide, out));
        assert_eq!(table.lines().count(), 8, "one line per row:\n{table}");
        assert!(
            table
                .lines()
                .all(|l| l.starts_with("obs/logs ") || l.starts_with("web/logs ")),
            "no header, title or total:\n{table}"
        );
        assert!(!table.contains("NODE") && !table.contains("Total"), "{table}");
    }
    let csv = render_to_string(|out| render::csv(&report, &view(SortBy::Change, false), out));
    assert_eq!(csv.lines().count(), 8, "{csv}");
    assert!(!csv.contains("namespace"), "no header record:\n{csv}");
    let empty =
        render_to_string(|out| render::table(&Report::default(), &view(SortBy::Change, false), false, out));
    assert_eq!(empty, "", "nothing at all when there is nothing");
}

#[test]
fn yaml_is_the_json_document() {
    let report = two_namespaces();
    let json: Value =
        serde_json::from_str(&render_to_string(|out| render::json(&report, out))).expect("json");
    let yaml: Value =
        serde_yaml_ng::from_str(&render_to_string(|out| render::yaml(&report, out))).expect("yaml");
    assert_eq!(yaml, json);
    assert_eq!(yaml["daemonsets"][1]["namespace"], "web");
}

#[test]
fn an_empty_namespace_says_where_it_looked() {
    let mut v = view(SortBy::Change, true);
    v.namespace = Some("default".to_string());
    let table = render_to_string(|out| render::table(&Report::default(), &v, false, out));
    assert_eq!(
        table,
        "No DaemonSetAutoscalers found in namespace default (-A for every namespace).\n"
    );
}

#[test]
fn flags_pick_the_namespace_as_kubectl_does() {
    use clap::Parser as _;
    let args = |argv: &[&str]| {
        let cli =
            crate::Cli::try_parse_from(["kubectl-nodewarden", "report"].iter().chain(argv)).expect("flags");
        let crate::Command::Report(args) = cli.command;
        args
    };
    assert_eq!(
        args(&[]).scope("team").as_deref(),
        Some("team"),
        "the context's namespace"
    );
    assert_eq!(args(&["-n", "obs"]).scope("team").as_deref(), Some("obs"));
    assert_eq!(args(&["-A"]).scope("team"), None);
    assert_eq!(
        args(&["--all-namespaces", "-n", "obs"]).scope("team"),
        None,
        "-A wins"
    );
    let all = args(&[
        "-l",
        "app=logs",
        "--sort-by",
        "memory-change",
        "--no-headers",
        "-o",
        "wide",
    ]);
    assert_eq!(all.selector.as_deref(), Some("app=logs"));
    assert_eq!(all.sort_by, SortBy::MemoryChange);
    assert!(all.no_headers);
    assert_eq!(all.output, crate::Format::Wide);
    assert_eq!(
        args(&[]).sort_by,
        SortBy::Change,
        "biggest change first by default"
    );
    for (flag, format) in [("yaml", crate::Format::Yaml), ("html", crate::Format::Html)] {
        assert_eq!(args(&["-o", flag]).output, format);
    }
}

/// No address outside the page: no links, sources, imports or URLs of any scheme.
fn assert_self_contained(html: &str) {
    for needle in [
        "http:", "https:", "src=", "href=", "<link", "@import", "url(", "//cdn", "fetch(",
    ] {
        assert!(!html.contains(needle), "an external asset: {needle}");
    }
}

/// `n` nodes running `obs/logs` and `web/logs`, with figures spread over both signs: most nodes
/// have their own recommendation (some OOM kills), every tenth none (the template stays).
fn fleet(n: usize) -> Report {
    let node = |i: usize| format!("node-{i:03}");
    let mut pods = Vec::new();
    let mut recommendations = Vec::new();
    for i in 0..n {
        let obs = pod(&node(i), "2026-01-01T00:00:00Z", ("200m", "256Mi"));
        pods.push(in_namespace(&obs, "web"));
        pods.push(obs);
        if i % 10 == 9 {
            continue;
        }
        let cpu = format!("{}m", 20 + (i * 37) % 400);
        let mem = format!("{}Mi", 64 + (i * 53) % 400);
        let mut r = rec(
            &node(i),
            "shipper",
            (&cpu, &mem),
            ("10m", "32Mi"),
            ("900m", "900Mi"),
            (i % 7 == 0) as i64,
        );
        let mut web = r.spec.recommendations[0].clone();
        web.autoscaler.namespace = "web".to_string();
        web.target = rec(&node(i), "shipper", ("150m", &mem), ("1", "1"), ("1", "1"), 0)
            .spec
            .recommendations[0]
            .target
            .clone();
        r.spec.recommendations.push(web);
        recommendations.push(r);
    }
    let autoscaler = dsa(json!({}), json!({}));
    let mut report = compute(&Snapshot {
        autoscalers: vec![autoscaler.clone(), in_namespace(&autoscaler, "web")],
        daemonsets: vec![daemonset(), in_namespace(&daemonset(), "web")],
        pods,
        recommendations,
        ..Snapshot::default()
    });
    report.sort(SortBy::Change);
    report
}

/// The `<tr>`s of the page's table of rows.
fn html_rows(html: &str) -> Vec<&str> {
    tagged_rows(html).into_iter().map(|(_, row)| row).collect()
}

/// The `<tr>`s of the page's table of rows, each with whether it is hidden (by the filter).
fn tagged_rows(html: &str) -> Vec<(bool, &str)> {
    let start = html.find("<table id=\"rows\"").expect("the table of rows");
    let body = &html[start..];
    let body = &body[..body.find("</table>").expect("end of the table")];
    body.split("<tr")
        .skip(2)
        .map(|piece| {
            let end = piece.find('>').expect("end of the tag");
            (piece[..end].contains("hidden"), &piece[end + 1..])
        })
        .collect()
}

#[test]
fn the_html_page_sums_up_first_then_lists_every_row() {
    let report = two_namespaces();
    let html = render_to_string(|out| render::html(&report, &view(SortBy::Change, true), out));
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    let summary = html.find("id=\"summary\"").expect("a summary");
    assert!(
        summary < html.find("id=\"rows\"").expect("the rows"),
        "the summary first"
    );
    // obs: a +300m, b -180m; web: a -150m -200Mi, b +10m +1Gi
    for (id, want) in [
        ("cpu-free", "330m"),
        ("cpu-needed", "310m"),
        ("cpu-net", "-20m"),
        ("memory-free", "200Mi"),
        ("memory-needed", "1Gi"),
        ("memory-net", "+824Mi"),
    ] {
        let cell = format!(
            "id=\"{id}\" class=\"{}\">{want}</td>",
            match id {
                i if i.ends_with("free") => "free",
                i if i.ends_with("needed") => "need",
                _ => "",
            }
        );
        let cell = cell.replace(" class=\"\"", "");
        assert!(html.contains(&cell), "{cell} in:\n{html}");
    }
    assert!(
        html.contains("<p id=\"counts\">2 DaemonSets, 2 nodes (2 would free, 2 would need more), 8 rows, 0 OOM kills</p>"),
        "{html}"
    );
    assert!(
        html.contains(concat!(
            "Rows by source: <span id=\"source-node\">node 4</span>, <span id=\"source-group\">group 0</span>, ",
            "<span id=\"source-fleet\">fleet 0</span>, <span id=\"source-none\">none 4</span>, ",
            "<span id=\"source-off\">off 0</span>"
        )),
        "{html}"
    );
    let header: Vec<&str> = render::HTML_COLUMNS.iter().map(|(_, title)| *title).collect();
    let header_html: String = render::HTML_COLUMNS
        .iter()
        .map(|(key, title)| format!("<th data-key=\"{key}\">{title}</th>"))
        .collect();
    assert!(html.contains(&header_html), "{header:?}");
    let rows = html_rows(&html);
    assert_eq!(rows.len(), 8, "every row");
    assert!(
        rows[0].starts_with("<td>obs</td><td>logs</td><td>a</td><td>shipper</td>"),
        "the biggest change first: {}",
        rows[0]
    );
    assert!(
        rows[0].contains("<td data-v=\"300\" data-w=\"0\">+300m</td>"),
        "{}",
        rows[0]
    );
    assert!(html.contains("<input id=\"filter\""), "a filter box");
    assert!(
        html.contains("<table id=\"rows\" class=\"sortable\">"),
        "sortable"
    );
    assert_eq!(html.matches("<script>").count(), 1, "one inline script");
    assert_self_contained(&html);
}

#[test]
fn the_html_page_of_500_nodes_holds_every_row_in_the_chosen_order() {
    let report = fleet(500);
    let html = render_to_string(|out| render::html(&report, &view(SortBy::Node, true), out));
    let rows = html_rows(&html);
    assert_eq!(rows.len(), 500 * 2 * 2, "500 nodes × 2 DaemonSets × 2 containers");
    for i in [0, 1, 250, 499] {
        let node = format!("<td>node-{i:03}</td>");
        assert_eq!(rows.iter().filter(|r| r.contains(&node)).count(), 4, "{node}");
    }
    assert!(rows[0].contains("<td>node-000</td>") && rows[3].contains("<td>node-000</td>"));
    assert!(
        rows[1999].contains("<td>node-499</td>"),
        "by node: {}",
        rows[1999]
    );
    assert!(
        html.contains(&format!(
            "<td id=\"cpu-free\" class=\"free\">{}</td>",
            render::cpu(report.totals.cpu_free_millis)
        )),
        "the summary's figures are the report's"
    );
    assert!(
        html.contains("<p id=\"counts\">2 DaemonSets, 500 nodes ("),
        "counts"
    );
    assert!(
        html.len() < 4 << 20,
        "a page a browser opens at once: {} bytes",
        html.len()
    );
    assert_self_contained(&html);
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Chromium on the PATH; `None` (after a loud line) when it is missing outside CI.
fn chromium() -> Option<std::path::PathBuf> {
    let found = ["chromium", "chromium-browser"].iter().find_map(|tool| {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let msg = "chromium is missing: install it with `tests/node/packages.sh chromium`";
        assert!(!ci(), "{msg} (CI=true: this test does not skip)");
        eprintln!("\n!!! SKIPPED: {msg}\n");
    }
    found
}

/// Runs headless Chromium on `args`; its standard output, and its standard error (where the
/// page's console messages and uncaught errors go).
fn run_chromium(chromium: &std::path::Path, args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .args(args)
        .output()
        .expect("starting chromium");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "chromium {args:?}: {}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// The 500-node page in a real browser: the script runs to its end without an error, sorts the
/// rows by the address's `#sort=` and filters them by its `q=`. With
/// `NODEWARDEN_REPORT_SCREENSHOT=<file.png>` it also takes the screenshot of docs/report.png.
#[test]
fn the_html_page_runs_in_headless_chromium() {
    let Some(chromium) = chromium() else { return };
    let report = fleet(500);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("report.html");
    let html = render_to_string(|out| render::html(&report, &view(SortBy::Name, true), out));
    std::fs::write(&path, &html).expect("write the page");
    let url = format!("file://{}", path.display());

    let (dom, stderr) = run_chromium(
        &chromium,
        &["--dump-dom", &format!("{url}#sort=-cpu-delta&q=web")],
    );
    assert!(
        dom.contains("data-ready=\"true\""),
        "the script ran to its end:\n{stderr}"
    );
    for error in ["Uncaught", "SyntaxError", "TypeError", "ReferenceError"] {
        assert!(!stderr.contains(error), "a script error: {stderr}");
    }
    assert!(
        dom.contains("<span id=\"shown\">1000 of 2000 rows</span>"),
        "the filter kept web's rows"
    );
    assert!(
        dom.contains("<th data-key=\"cpu-delta\" tabindex=\"0\" aria-sort=\"descending\">"),
        "the column shows its order"
    );
    let rows = tagged_rows(&dom);
    assert_eq!(rows.len(), 2000, "every row is in the page");
    let shown: Vec<&str> = rows
        .iter()
        .filter(|(hidden, _)| !hidden)
        .map(|(_, r)| *r)
        .collect();
    assert_eq!(shown.len(), 1000);
    let cpu_delta = |row: &str| -> i64 {
        let cells: Vec<&str> = row.split("<td").collect();
        let cell = cells[13];
        let v = cell.split("data-v=\"").nth(1).expect("data-v");
        v[..v.find('"').expect("end")].parse().expect("a number")
    };
    let want_first = report
        .rows_sorted(SortBy::Name)
        .iter()
        .filter(|(ds, _)| ds.namespace == "web")
        .map(|(_, r)| r.delta.cpu_millis)
        .max()
        .expect("web rows");
    assert_eq!(
        cpu_delta(shown[0]),
        want_first,
        "the biggest CPU delta of web first"
    );
    assert!(
        shown.windows(2).all(|w| cpu_delta(w[0]) >= cpu_delta(w[1])),
        "sorted by CPU Δ, descending"
    );
    assert!(
        shown.iter().all(|r| r.starts_with("<td>web</td>")),
        "only web's rows shown"
    );

    if let Some(png) = std::env::var_os("NODEWARDEN_REPORT_SCREENSHOT") {
        let png = std::path::PathBuf::from(png);
        run_chromium(
            &chromium,
            &[
                "--hide-scrollbars",
                "--window-size=1400,900",
                &format!("--screenshot={}", png.display()),
                &format!("{url}#sort=-cpu-delta"),
            ],
        );
        assert!(png.is_file(), "no screenshot at {}", png.display());
    }
}

#[test]
fn native_sidecars_are_rows_marked_as_such_and_the_pod_request_counts_them() {
    // the template's `sidecar` container becomes a native sidecar, beside a run-to-completion
    // init container
    let mut ds = daemonset();
    let spec = ds
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("template");
    let sidecar = spec.containers.pop().expect("sidecar");
    spec.init_containers = Some(vec![
        serde_json::from_value(json!({"name": "setup", "image": "x",
            "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}))
        .expect("init"),
        k8s_openapi::api::core::v1::Container {
            restart_policy: Some("Always".to_string()),
            ..sidecar
        },
    ]);
    let mut recommendation = rec("a", "shipper", ("300m", "200Mi"), ("1m", "1Mi"), ("2", "1Gi"), 0);
    let mut side = recommendation.spec.recommendations[0].clone();
    side.container_name = "sidecar".to_string();
    side.target = Some(serde_json::from_value(json!({"cpu": "20m", "memory": "32Mi"})).expect("target"));
    let mut setup = side.clone();
    setup.container_name = "setup".to_string();
    recommendation.spec.recommendations.extend([side, setup]);
    let snapshot = Snapshot {
        autoscalers: vec![dsa(json!({}), json!({}))],
        daemonsets: vec![ds],
        recommendations: vec![recommendation],
        ..Snapshot::default()
    };
    let report = compute(&snapshot);
    let rows: Vec<(&str, bool, Resources)> = report.daemonsets[0]
        .rows
        .iter()
        .map(|r| (r.container.as_str(), r.sidecar, r.target))
        .collect();
    assert_eq!(
        rows,
        [
            ("shipper", false, res(300, 200 * MI)),
            ("sidecar", true, res(20, 32 * MI)),
        ],
        "the sidecar is a row with its node's figures; setup is none"
    );
    // containers and sidecars summed (320m), under setup's 1 CPU alone; memory 232Mi over 64Mi
    assert_eq!(
        report.daemonsets[0].pods,
        [PodRequests {
            node: "a".to_string(),
            current: res(1000, 256 * MI),
            target: res(1000, 232 * MI),
        }]
    );
    let table = render_to_string(|out| render::table(&report, &view(SortBy::Name, true), false, out));
    assert!(table.contains("sidecar (sidecar)"), "{table}");
    assert!(!table.contains("shipper (sidecar)"), "{table}");
    let json: Value =
        serde_json::from_str(&render_to_string(|out| render::json(&report, out))).expect("json");
    assert_eq!(json["daemonsets"][0]["rows"][1]["sidecar"], json!(true));
    assert_eq!(
        json["daemonsets"][0]["pods"][0]["target"],
        json!({"cpuMillis": 1000, "memoryBytes": 232 * MI})
    );
}

#[test]
fn the_history_column_says_how_long_the_history_is() {
    use super::HistorySpan;
    let span = |sample_count, seconds| HistorySpan {
        sample_count,
        seconds,
        first_sample_time: Some("2026-11-20T00:00:00Z".to_string()),
        last_sample_time: Some("2026-11-28T00:00:00Z".to_string()),
    };
    let cases = [
        (
            HistorySpan {
                sample_count: 1440,
                ..HistorySpan::default()
            },
            "n=1440",
        ),
        (span(0, 0), "-"),
        (span(1, 0), "<1m"),
        (span(5, 50), "<1m"),
        (span(3, 120), "2m"),
        (span(600, 5 * 3600 + 12 * 60 + 7), "5h12m"),
        (span(600, 3 * 3600), "3h"),
        (span(11_520, 8 * 86_400), "8d"),
        (span(3000, 2 * 86_400 + 3 * 3600 + 59), "2d3h"),
    ];
    for (h, want) in cases {
        assert_eq!(render::history(&h), want, "{h:?}");
    }
}

/// KEP-753 as the scheduler counts it: a run-to-completion init container runs beside the
/// sidecars declared before it, so the pod's request is the larger of (containers + sidecars)
/// and (the init container + the sidecars before it). Here that peak holds the CPU up (a plain
/// max of the init container and the sum would say 2 CPUs), the sum holds the memory; a sidecar
/// without requests counts as 0 now and gets its node's figures; the init container keeps the
/// template's requests although its name has a figure, and is no row. The by-node figures are
/// the pod's.
#[test]
fn the_pod_request_is_the_schedulers_with_sidecars_around_a_big_init_container() {
    let mut ds = daemonset();
    let spec = ds
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("template");
    spec.containers.truncate(1);
    spec.init_containers = Some(
        serde_json::from_value(json!([
            {"name": "forwarder", "image": "x", "restartPolicy": "Always",
             "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
            {"name": "setup", "image": "x", "resources": {"requests": {"cpu": "2", "memory": "16Mi"}}},
            {"name": "mesh", "image": "x", "restartPolicy": "Always"},
        ]))
        .expect("init containers"),
    );
    let mut recommendation = rec("a", "shipper", ("300m", "200Mi"), ("1m", "1Mi"), ("2", "1Gi"), 0);
    for (name, cpu, memory) in [
        ("forwarder", "150m", "100Mi"),
        ("mesh", "20m", "32Mi"),
        ("setup", "10m", "1Mi"),
    ] {
        let mut e = recommendation.spec.recommendations[0].clone();
        e.container_name = name.to_string();
        e.target = Some(serde_json::from_value(json!({"cpu": cpu, "memory": memory})).expect("target"));
        recommendation.spec.recommendations.push(e);
    }
    let snapshot = Snapshot {
        autoscalers: vec![dsa(json!({}), json!({}))],
        daemonsets: vec![ds],
        recommendations: vec![recommendation],
        ..Snapshot::default()
    };
    let report = compute(&snapshot);
    let rows: Vec<(&str, bool, Resources, Resources)> = report.daemonsets[0]
        .rows
        .iter()
        .map(|r| (r.container.as_str(), r.sidecar, r.current, r.target))
        .collect();
    assert_eq!(
        rows,
        [
            ("shipper", false, res(200, 256 * MI), res(300, 200 * MI)),
            ("forwarder", true, res(100, 64 * MI), res(150, 100 * MI)),
            ("mesh", true, Resources::default(), res(20, 32 * MI)),
        ]
    );
    // now: containers and sidecars 200+100+0 = 300m, setup's peak 2000+100 = 2100m;
    //      memory 256+64+0 = 320Mi over 16+64 = 80Mi
    // target: 300+150+20 = 470m under 2000+150 = 2150m (setup kept at 2, not 10m);
    //      memory 200+100+32 = 332Mi over 16+100 = 116Mi
    let pod = PodRequests {
        node: "a".to_string(),
        current: res(2100, 320 * MI),
        target: res(2150, 332 * MI),
    };
    assert_eq!(report.daemonsets[0].pods, [pod]);
    let node = &report.nodes[0];
    assert_eq!(
        (node.current, node.target),
        (
            Delta {
                cpu_millis: 2100,
                memory_bytes: 320 * MI
            },
            Delta {
                cpu_millis: 2150,
                memory_bytes: 332 * MI
            }
        ),
        "the node's figures are the pod's"
    );
    // every format: the sidecar without requests prints, CSV says which rows are sidecars
    let table = render_to_string(|out| render::table(&report, &view(SortBy::Name, true), true, out));
    assert!(
        table.contains("mesh (sidecar)") && !table.contains("setup"),
        "{table}"
    );
    let csv = render_to_string(|out| render::csv(&report, &view(SortBy::Name, true), out));
    let sidecar_column: Vec<(String, String)> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[5].to_string(), f[f.len() - 1].to_string())
        })
        .collect();
    assert_eq!(
        sidecar_column,
        [("shipper", "false"), ("forwarder", "true"), ("mesh", "true")]
            .map(|(c, s)| (c.to_string(), s.to_string()))
    );
    let html = render_to_string(|out| render::html(&report, &view(SortBy::Name, true), out));
    assert!(html.contains("<td>mesh (sidecar)</td>"), "{html}");
}
