//! End-to-end: `kubectl nodewarden report` against the real control plane.
//!
//! First without the CRDs (the report says to install the chart), then with them: three Ready
//! fake Nodes, a DaemonSet whose pods the real DaemonSet controller creates (template 100m /
//! 64Mi), a DaemonSetAutoscaler, and `NodeRecommendation`s written by the admin client with
//! known figures: node A hot (300m / 200Mi, two OOM kills), node B quiet (20m / 32Mi), node C
//! none. The report runs through the library's `run` with real flags and the admin kubeconfig;
//! its JSON and table must carry those figures and their sums, and kubectl's flags (-A, -l, no -n,
//! --no-headers, --sort-by) must pick and order them. Last, a service account with no
//! rights gets the permission error.

use std::collections::BTreeMap;
use std::io::Write as _;

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::api::PostParams;
use nodewarden_api::rightsizing::{
    AutoscalerRef, ContainerRecommendation, DaemonSetAutoscaler, NodeRecommendation, NodeRecommendationSpec,
    NodeSummary,
};
use nodewarden_tests::{
    TestEnv, apply_crds, chart_crd_files, e2e, read_crds, simple_daemonset, wait_for_daemonset_pods,
};
use serde_json::{Value, json};

const DS: &str = "log-shipper";
const MI: i64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_shows_each_nodes_figures_and_the_sums() {
    e2e("report", |env| async move {
        let kubeconfig = env.cp.kubeconfig_path().display().to_string();

        // before the CRDs are installed
        let err = report(&["--kubeconfig", &kubeconfig, "-n", &env.namespace])
            .await
            .err()
            .context("the report without CRDs must fail")?;
        ensure!(
            err.to_string().starts_with(
                "the nodewarden CRDs are not installed in this cluster (daemonsetautoscalers.nodewarden.io is not \
                 served); install the nodewarden chart first"
            ),
            "{err}"
        );

        apply_crds(env.cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let nodes = env.create_nodes(3).await?;
        let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
        env.api::<DaemonSet>()
            .create(&PostParams::default(), &simple_daemonset(DS, &env.node_selector())?)
            .await?;
        env.api::<DaemonSetAutoscaler>()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "nodewarden.io/v1alpha1",
                    "kind": "DaemonSetAutoscaler",
                    "metadata": {"name": DS, "labels": {"team": "obs"}},
                    "spec": {"targetRef": {"kind": "DaemonSet", "name": DS}},
                }))?,
            )
            .await?;
        wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, DS, &nodes).await?;
        publish(&env, a, ("300m", "200Mi"), ("200m", "128Mi"), ("500m", "256Mi"), 2).await?;
        publish(&env, b, ("20m", "32Mi"), ("10m", "16Mi"), ("50m", "48Mi"), 0).await?;

        let out = report(&["--kubeconfig", &kubeconfig, "-n", &env.namespace, "-o", "json"]).await?;
        let json: Value = serde_json::from_str(&out).with_context(|| format!("report JSON: {out}"))?;
        let ds = &json["daemonsets"][0];
        ensure!(ds["daemonset"] == DS && ds["mode"] == "Initial", "{ds}");
        let row = |node: &str| -> Result<&Value> {
            ds["rows"]
                .as_array()
                .and_then(|rows| rows.iter().find(|r| r["node"] == node))
                .with_context(|| format!("no row for {node}: {ds}"))
        };
        let want_a = json!({
            "node": a, "container": "agent", "sidecar": false, "hasPod": true, "source": "node", "oomKills": 2,
            "sourceDetail": "node-recommendation",
            "template": {"cpuMillis": 100, "memoryBytes": 64 * MI},
            "current": {"cpuMillis": 100, "memoryBytes": 64 * MI},
            "target": {"cpuMillis": 300, "memoryBytes": 200 * MI},
            "lowerBound": {"cpuMillis": 200, "memoryBytes": 128 * MI},
            "upperBound": {"cpuMillis": 500, "memoryBytes": 256 * MI},
            "delta": {"cpuMillis": 200, "memoryBytes": 136 * MI},
            // the published entry gives a sample count but no sample times
            "history": {"sampleCount": 1440, "seconds": 0},
        });
        ensure!(row(a)? == &want_a, "node A: {}", row(a)?);
        ensure!(
            row(b)?["delta"] == json!({"cpuMillis": -80, "memoryBytes": -32 * MI}),
            "node B: {}",
            row(b)?
        );
        ensure!(
            row(c)?["source"] == "none" && row(c)?["delta"] == json!({"cpuMillis": 0, "memoryBytes": 0}),
            "node C: {}",
            row(c)?
        );
        let want_totals = json!({
            "cpuFreeMillis": 80, "cpuNeededMillis": 200,
            "memoryFreeBytes": 32 * MI, "memoryNeededBytes": 136 * MI, "oomKills": 2,
        });
        ensure!(json["totals"] == want_totals, "totals: {}", json["totals"]);
        ensure!(ds["totals"] == want_totals, "DaemonSet totals: {}", ds["totals"]);
        ensure!(json["nodes"].as_array().map(Vec::len) == Some(3), "{}", json["nodes"]);

        let table = report(&["--kubeconfig", &kubeconfig, "-n", &env.namespace]).await?;
        let line = |node: &str| -> Result<Vec<&str>> {
            let line = table
                .lines()
                .find(|l| l.trim_start().starts_with(node) && l.contains("agent"))
                .with_context(|| format!("no table line for {node}:\n{table}"))?;
            Ok(line.split_whitespace().collect())
        };
        ensure!(
            line(a)? == [a.as_str(), "agent", "100m", "/", "64Mi", "100m", "/", "64Mi", "300m", "/", "200Mi", "200m",
                "/", "128Mi", "500m", "/", "256Mi", "n=1440", "node", "2", "+200m", "+136Mi"],
            "table line of A:\n{table}"
        );
        ensure!(
            table.contains(
                "Total: frees 80m CPU and 32Mi memory, needs 200m CPU and 136Mi memory on top (net +120m CPU, \
                 +104Mi memory); 2 OOM kills"
            ),
            "{table}"
        );

        // kubectl's habits: -A, -l, the context's namespace when -n is not given
        let title = format!("DaemonSet {}/{DS} ", env.namespace);
        let all = report(&["--kubeconfig", &kubeconfig, "-A"]).await?;
        ensure!(all.contains(&title), "-A lists every namespace:\n{all}");
        let selected = report(&["--kubeconfig", &kubeconfig, "-A", "-l", "team=obs"]).await?;
        ensure!(selected.contains(&title), "-l team=obs:\n{selected}");
        let other = report(&["--kubeconfig", &kubeconfig, "-n", &env.namespace, "-l", "team=web"]).await?;
        ensure!(
            other.trim() == format!("No DaemonSetAutoscalers found in namespace {} (-A for every namespace).", env.namespace),
            "-l team=web selects nothing:\n{other}"
        );
        let unset = report(&["--kubeconfig", &kubeconfig]).await?;
        ensure!(!unset.contains(&title), "no -n: the context's namespace, not the test's:\n{unset}");
        let rows = report(&["--kubeconfig", &kubeconfig, "-n", &env.namespace, "--no-headers", "--sort-by", "node"]).await?;
        let first: Vec<&str> = rows.lines().map(|l| l.split_whitespace().nth(1).unwrap_or_default()).collect();
        ensure!(first == [a.as_str(), b.as_str(), c.as_str()], "--no-headers --sort-by node:\n{rows}");

        let csv = report(&["--kubeconfig", &kubeconfig, "-n", &env.namespace, "-o", "csv"]).await?;
        ensure!(csv.lines().count() == 4, "header + 3 nodes:\n{csv}");
        let html = report(&["--kubeconfig", &kubeconfig, "-n", &env.namespace, "-o", "html"]).await?;
        ensure!(html.contains("<svg") && html.contains(a.as_str()), "HTML page with a chart");

        // `kubectl get noderec` and `kubectl get dsa` columns, as the API server prints them
        let noderec = api_table(&env, &format!("/apis/nodewarden.io/v1alpha1/noderecommendations/{a}")).await?;
        for (column, want) in [("Containers", "agent"), ("CPU", "300m"), ("Memory", "200Mi"), ("OOM", "2")] {
            ensure!(noderec.get(column).map(String::as_str) == Some(want), "noderec {column}: {noderec:?}");
        }
        ensure!(
            noderec.get("Upper Memory").map(String::as_str) == Some("256Mi")
                && noderec.get("CPU Each").map(String::as_str) == Some("300m"),
            "-o wide: {noderec:?}"
        );
        let dsa = api_table(
            &env,
            &format!("/apis/nodewarden.io/v1alpha1/namespaces/{}/daemonsetautoscalers/{DS}", env.namespace),
        )
        .await?;
        let columns: Vec<&str> = dsa.keys().map(String::as_str).collect();
        for column in [
            "Target", "Mode", "Nodes", "Up-to-date", "CPU P50", "CPU P90", "Memory P50", "Memory P90", "Provided", "Age", "Cold Start",
            "Ceiling",
        ] {
            ensure!(columns.contains(&column), "dsa columns: {columns:?}");
        }
        ensure!(dsa.get("Cold Start").map(String::as_str) == Some("Template"), "{dsa:?}");

        // a service account with no rights
        let token = env.cp.service_account_token(&env.namespace, "default", None).await?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("kubeconfig");
        std::fs::File::create(&path)?.write_all(token_kubeconfig(&env, &token)?.as_bytes())?;
        let err = report(&["--kubeconfig", &path.display().to_string(), "-n", &env.namespace])
            .await
            .err()
            .context("the report with no rights must fail")?;
        ensure!(
            err.to_string()
                .starts_with("permission denied listing daemonsetautoscalers.nodewarden.io: "),
            "{err}"
        );
        Ok(())
    })
    .await;
}

/// One object as the API server prints it for kubectl (`as=Table`): column name → cell text.
async fn api_table(env: &TestEnv, path: &str) -> Result<BTreeMap<String, String>> {
    let request = http::Request::get(path)
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())?;
    let table: Value = env
        .client
        .request(request)
        .await
        .with_context(|| format!("GET {path} as Table"))?;
    let names = table["columnDefinitions"]
        .as_array()
        .context("columnDefinitions")?;
    let cells = table["rows"][0]["cells"].as_array().context("cells")?;
    Ok(names
        .iter()
        .zip(cells)
        .map(|(n, c)| {
            let text = match c {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (n["name"].as_str().unwrap_or_default().to_string(), text)
        })
        .collect())
}

/// `kubectl nodewarden report <args>`, its output as text.
async fn report(args: &[&str]) -> Result<String, nodewarden_cli::Error> {
    let argv: Vec<&str> = std::iter::once("report").chain(args.iter().copied()).collect();
    nodewarden_tests::kubectl_nodewarden(&argv).await
}

async fn publish(
    env: &TestEnv,
    node: &str,
    target: (&str, &str),
    lower: (&str, &str),
    upper: (&str, &str),
    oom_count: i64,
) -> Result<()> {
    let list = |(cpu, memory): (&str, &str)| {
        Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.to_string())),
            ("memory".to_string(), Quantity(memory.to_string())),
        ]))
    };
    let mut rec = NodeRecommendation::new(
        node,
        NodeRecommendationSpec {
            update_time: None,
            pods: Vec::new(),
            summary: None,
            recommendations: vec![ContainerRecommendation {
                autoscaler: AutoscalerRef {
                    namespace: env.namespace.clone(),
                    name: DS.to_string(),
                },
                container_name: "agent".to_string(),
                target: list(target),
                lower_bound: list(lower),
                upper_bound: list(upper),
                uncapped_target: None,
                sample_count: 1440,
                first_sample_time: None,
                last_sample_time: None,
                oom_count,
                capped: None,
            }],
        },
    );
    // as the agent writes it: with the totals `kubectl get noderec` shows
    rec.spec.summary = Some(NodeSummary::of(&rec.spec.recommendations));
    Api::<NodeRecommendation>::all(env.client.clone())
        .create(&PostParams::default(), &rec)
        .await
        .with_context(|| format!("NodeRecommendation/{node}"))?;
    Ok(())
}

fn token_kubeconfig(env: &TestEnv, token: &str) -> Result<String> {
    let ca = base64::engine::general_purpose::STANDARD.encode(env.cp.ca_pem());
    Ok(serde_yaml_ng::to_string(&json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": env.cp.apiserver_url(), "certificate-authority-data": ca}}],
        "users": [{"name": "nobody", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "nobody"}}],
        "current-context": "e2e",
    }))?)
}
