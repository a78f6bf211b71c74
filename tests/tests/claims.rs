//! End-to-end: the ClusterClaim guard (KEP-2149) on the real control plane.
//!
//! The webhook runs in this process through `nodewarden_webhook::run` with real flags, a
//! serving certificate from the cluster CA and the admin kubeconfig; kube-apiserver calls it for
//! nodewarden.io ClusterClaims and about.k8s.io ClusterProperties. Claims are cluster-scoped
//! singletons, so every scenario runs in order inside one test (this binary has the control
//! plane to itself).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_api::{ClusterClaim, ClusterClaimSpec};
use nodewarden_tests::process::{free_ports, write_file};
use nodewarden_tests::{
    ControlPlane, Hook, InProcessWebhook, LoopbackEndpoint, TestEnv, apply_crds, chart_crd_files, e2e,
    http_get, read_crds, register_validating_webhooks,
};
use nodewarden_webhook::claims;
use nodewarden_webhook::controllers::{self, ControllerOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const DENIED: &str = "admission webhook \"claims.nodewarden.io\" denied the request: ";
const WRITER_SA: &str = "claims-writer";
const EDITORS: &str = "e2e:claims-editors";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_guard_end_to_end() {
    e2e("claims", |env| async move {
        install_crds(&env).await?;
        grant_claim_writes(&env).await?;
        let ports = free_ports(2)?;
        let (listen_port, admin_port) = (ports[0], ports[1]);
        let cert_dir = tempfile::tempdir()?;
        let cert = env.cp.issue_loopback_serving_cert()?;
        write_file(&cert_dir.path().join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
        write_file(&cert_dir.path().join("tls.key"), cert.key_pem.as_bytes(), true)?;

        let webhook = Webhook::start(
            &env,
            cert_dir.path(),
            listen_port,
            admin_port,
            "e2e-webhook-a",
            &["--claims-discovery-interval=1s"],
        )
        .await?;
        register(&env, listen_port).await?;
        let clients = Clients::new(&env).await?;
        wait_until_guarded(&env, &clients).await?;

        ownership_and_format(&clients)
            .await
            .context("reserved names and ID format")?;
        lifespan(&clients)
            .await
            .context("ClusterSet membership and delete ordering")?;
        cluster_properties(&clients)
            .await
            .context("about.k8s.io ClusterProperty")?;
        crd_installed_later(&env, &clients)
            .await
            .context("Open Cluster Management ClusterClaim installed after start-up")?;
        decisions_in_metrics(admin_port).await?;
        webhook.stop().await?;

        let webhook = Webhook::start(
            &env,
            cert_dir.path(),
            listen_port,
            admin_port,
            "e2e-webhook-b",
            &[
                "--claims-initialize-id=true",
                "--claims-initialize-interval=500ms",
            ],
        )
        .await?;
        initializer(&env, &clients).await.context("ID initializer")?;

        // a second replica waits while the first leads, and takes over as soon as it stops
        let standby_stop = CancellationToken::new();
        let standby = tokio::spawn(controllers::run(
            env.cp.admin_client().await?,
            ControllerOptions {
                namespace: env.namespace.clone(),
                identity: "e2e-webhook-c".to_string(),
            },
            vec![claims::initializer::task(Duration::from_secs(1))],
            standby_stop.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(2)).await;
        ensure!(
            lease_holder(&env).await?.as_deref() == Some("e2e-webhook-b"),
            "the standby took the Lease from a live leader"
        );
        webhook.stop().await?;
        let took_over = Instant::now();
        env.cp
            .poll("the standby to take the Lease", || async {
                Ok((lease_holder(&env).await?.as_deref() == Some("e2e-webhook-c")).then_some(()))
            })
            .await?;
        // the old leader released the Lease, so this is not a wait for it to expire
        ensure!(
            took_over.elapsed() < Duration::from_secs(controllers::LEASE_DURATION_SECS),
            "took {:?} to hand over",
            took_over.elapsed()
        );
        standby_stop.cancel();
        standby.await?;
        let holder = lease_holder(&env).await?;
        ensure!(
            holder.is_none(),
            "a stopped replica should release the Lease, holder is {holder:?}"
        );
        Ok(())
    })
    .await;
}

/// The three kinds of caller.
struct Clients {
    /// `system:masters`.
    admin: Client,
    /// A service account listed in `--claims-allowed-service-accounts`.
    writer: Client,
    /// A user with RBAC rights on claims, but not allowed reserved names.
    jane: Client,
}

impl Clients {
    async fn new(env: &TestEnv) -> Result<Self> {
        let token = env
            .cp
            .service_account_token(&env.namespace, WRITER_SA, None)
            .await?;
        Ok(Clients {
            admin: env.cp.admin_client().await?,
            writer: env.cp.client_with_token(&token).await?,
            jane: env.cp.client_as_user("jane", &[EDITORS]).await?,
        })
    }
}

fn claims(client: &Client) -> Api<ClusterClaim> {
    Api::all(client.clone())
}

fn claim(name: &str, value: &str) -> ClusterClaim {
    ClusterClaim::new(
        name,
        ClusterClaimSpec {
            value: value.to_string(),
        },
    )
}

async fn create(client: &Client, name: &str, value: &str) -> kube::Result<ClusterClaim> {
    claims(client)
        .create(&PostParams::default(), &claim(name, value))
        .await
}

/// Changes the value with a merge patch (the API server sends an UPDATE review).
async fn set_value(client: &Client, name: &str, value: &str) -> kube::Result<ClusterClaim> {
    claims(client)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"value": value}})),
        )
        .await
}

async fn delete(client: &Client, name: &str) -> kube::Result<()> {
    claims(client)
        .delete(name, &DeleteParams::default())
        .await
        .map(|_| ())
}

/// The status code and message of a refused write; an error if the write went through.
fn refused<T>(what: &str, result: kube::Result<T>) -> Result<(u16, String)> {
    match result {
        Ok(_) => bail!("{what}: expected a denial, but the API server accepted the write"),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(other) => Err(anyhow!(other).context(format!("{what}: expected an admission denial"))),
    }
}

fn expect_denied<T>(what: &str, result: kube::Result<T>, message: &str) -> Result<()> {
    let (code, got) = refused(what, result)?;
    let want = format!("{DENIED}{message}");
    ensure!(
        code == 403 && got == want,
        "{what}:\n  got  {code} {got}\n  want 403 {want}"
    );
    Ok(())
}

async fn value_of(client: &Client, name: &str) -> Result<Option<String>> {
    Ok(claims(client).get_opt(name).await?.map(|c| c.spec.value))
}

async fn ownership_and_format(c: &Clients) -> Result<()> {
    // custom names are free for anyone with RBAC rights
    create(&c.jane, "region.example.com", "eu-west-1")
        .await
        .context("jane creates a custom claim")?;
    set_value(&c.jane, "region.example.com", "eu-west-2")
        .await
        .context("jane updates it")?;
    delete(&c.jane, "region.example.com")
        .await
        .context("jane deletes it")?;

    expect_denied(
        "jane creates id.k8s.io",
        create(&c.jane, "id.k8s.io", "cluster-a").await,
        "reserved-name: ClusterClaim \"id.k8s.io\" is reserved (names ending in .k8s.io or .kubernetes.io); \
         \"jane\" may not create it: only the users, groups and service accounts allowed by the nodewarden configuration may",
    )?;
    expect_denied(
        "admin creates id.k8s.io with a bad value",
        create(&c.admin, "id.k8s.io", "Cluster_A").await,
        "id-format: ClusterClaim \"id.k8s.io\": spec.value \"Cluster_A\" contains 'C'; only lowercase letters, \
         digits and '-' are allowed; the cluster ID must be an RFC 1123 DNS label: at most 63 lowercase letters, \
         digits or '-', starting and ending with a letter or digit",
    )?;
    create(&c.admin, "id.k8s.io", "cluster-a")
        .await
        .context("admin creates id.k8s.io")?;
    // another reserved name, by the allowed service account
    create(&c.writer, "platform.k8s.io", "kind")
        .await
        .context("the allowed service account writes a reserved name")?;
    expect_denied(
        "jane deletes platform.k8s.io",
        delete(&c.jane, "platform.k8s.io").await,
        "reserved-name: ClusterClaim \"platform.k8s.io\" is reserved (names ending in .k8s.io or .kubernetes.io); \
         \"jane\" may not delete it: only the users, groups and service accounts allowed by the nodewarden configuration may",
    )?;
    delete(&c.writer, "platform.k8s.io")
        .await
        .context("the allowed service account deletes it")?;
    Ok(())
}

async fn lifespan(c: &Clients) -> Result<()> {
    after_cache_settles("joining a ClusterSet", "clusterset-requires-id", || {
        create(&c.writer, "clusterset.k8s.io", "set-1")
    })
    .await?;
    expect_denied(
        "admin changes the ID while a member",
        set_value(&c.admin, "id.k8s.io", "cluster-b").await,
        "id-lifespan: ClusterClaim \"id.k8s.io\" cannot change from \"cluster-a\" to \"cluster-b\" while ClusterClaim \
         \"clusterset.k8s.io\" exists (the cluster is a ClusterSet member); delete clusterset.k8s.io first to leave the ClusterSet",
    )?;
    expect_denied(
        "admin deletes the ID while a member",
        delete(&c.admin, "id.k8s.io").await,
        "id-lifespan: ClusterClaim \"id.k8s.io\" cannot be deleted while ClusterClaim \"clusterset.k8s.io\" exists \
         (the cluster is a ClusterSet member); delete clusterset.k8s.io first to leave the ClusterSet",
    )?;
    expect_denied(
        "the service account moves to another ClusterSet in place",
        set_value(&c.writer, "clusterset.k8s.io", "set-2").await,
        "clusterset-immutable: ClusterClaim \"clusterset.k8s.io\" cannot change from \"set-1\" to \"set-2\"; \
         to move to another ClusterSet, delete it and create it again",
    )?;
    expect_denied(
        "jane makes the cluster leave",
        delete(&c.jane, "clusterset.k8s.io").await,
        "reserved-name: ClusterClaim \"clusterset.k8s.io\" is reserved (names ending in .k8s.io or .kubernetes.io); \
         \"jane\" may not delete it: only the users, groups and service accounts allowed by the nodewarden configuration may",
    )?;
    ensure!(
        value_of(&c.admin, "id.k8s.io").await?.as_deref() == Some("cluster-a"),
        "the ID changed"
    );
    ensure!(
        value_of(&c.admin, "clusterset.k8s.io").await?.as_deref() == Some("set-1"),
        "the membership changed"
    );

    // leaving: clusterset first, then the ID may go
    delete(&c.writer, "clusterset.k8s.io")
        .await
        .context("leaving the ClusterSet")?;
    after_cache_settles("deleting id.k8s.io after leaving", "id-lifespan", || {
        delete(&c.admin, "id.k8s.io")
    })
    .await?;
    expect_denied(
        "joining without an ID",
        create(&c.writer, "clusterset.k8s.io", "set-1").await,
        "clusterset-requires-id: ClusterClaim \"clusterset.k8s.io\" (value \"set-1\") cannot be created while no ID \
         claim exists; create ClusterClaim \"id.k8s.io\" or \"cluster.clusterset.k8s.io\" first",
    )?;
    // the standard's name for the ID is as good as the proposal's
    create(&c.admin, "cluster.clusterset.k8s.io", "cluster-c").await?;
    after_cache_settles(
        "joining with cluster.clusterset.k8s.io",
        "clusterset-requires-id",
        || create(&c.writer, "clusterset.k8s.io", "set-9"),
    )
    .await?;
    expect_denied(
        "deleting cluster.clusterset.k8s.io while a member",
        delete(&c.admin, "cluster.clusterset.k8s.io").await,
        "id-lifespan: ClusterClaim \"cluster.clusterset.k8s.io\" cannot be deleted while ClusterClaim \
         \"clusterset.k8s.io\" exists (the cluster is a ClusterSet member); delete clusterset.k8s.io first to leave the ClusterSet",
    )?;
    delete(&c.writer, "clusterset.k8s.io").await?;
    after_cache_settles(
        "deleting cluster.clusterset.k8s.io after leaving",
        "id-lifespan",
        || delete(&c.admin, "cluster.clusterset.k8s.io"),
    )
    .await?;
    Ok(())
}

/// Runs a write that depends on another claim written just before. The webhook's cache shows
/// that write a moment later (the lag docs/claims.md describes); until then the guard errs on
/// the side of keeping the ID, so the write is retried while, and only while, it is refused by
/// `rule`, for at most 10 s.
async fn after_cache_settles<T, F, Fut>(what: &str, rule: &str, mut write: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let started = Instant::now();
    let mut refusals = 0;
    loop {
        match write().await {
            Ok(v) => {
                if refusals > 0 {
                    eprintln!(
                        "{what}: went through after {:?} ({refusals} refusals by {rule})",
                        started.elapsed()
                    );
                }
                return Ok(v);
            }
            Err(kube::Error::Api(s))
                if s.message.starts_with(&format!("{DENIED}{rule}: "))
                    && started.elapsed() < Duration::from_secs(10) =>
            {
                refusals += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(anyhow!(e).context(what.to_string())),
        }
    }
}

fn properties(client: &Client, version: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "about.k8s.io".to_string(),
        version: version.to_string(),
        api_version: format!("about.k8s.io/{version}"),
        kind: "ClusterProperty".to_string(),
        plural: "clusterproperties".to_string(),
    };
    Api::all_with(client.clone(), &resource)
}

fn property(version: &str, name: &str, value: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": format!("about.k8s.io/{version}"),
        "kind": "ClusterProperty",
        "metadata": {"name": name},
        "spec": {"value": value},
    }))?)
}

async fn cluster_properties(c: &Clients) -> Result<()> {
    let pp = PostParams::default();
    // the CRD has no maximum length; the guard's size rule applies
    let big = "v".repeat(128 * 1024 + 1);
    expect_denied(
        "jane writes a ClusterProperty over 128 KiB",
        properties(&c.jane, "v1beta1")
            .create(&pp, &property("v1beta1", "blob.example.com", &big)?)
            .await,
        &format!(
            "value-size: ClusterProperty \"blob.example.com\": spec.value \"{}\"… (131073 bytes) is too long; \
             a claim value must be 1 to 131072 bytes",
            "v".repeat(64)
        ),
    )?;
    properties(&c.jane, "v1alpha1")
        .create(&pp, &property("v1alpha1", "blob.example.com", &"v".repeat(1024))?)
        .await
        .context("a 1 KiB ClusterProperty through v1alpha1")?;
    // each API is a set of claims of its own: a ClusterClaim ID does not count for ClusterProperties
    create(&c.admin, "id.k8s.io", "cluster-a").await?;
    expect_denied(
        "ClusterProperty clusterset without a ClusterProperty ID",
        properties(&c.admin, "v1beta1")
            .create(&pp, &property("v1beta1", "clusterset.k8s.io", "set-1")?)
            .await,
        "clusterset-requires-id: ClusterProperty \"clusterset.k8s.io\" (value \"set-1\") cannot be created while no \
         ID claim exists; create ClusterProperty \"id.k8s.io\" or \"cluster.clusterset.k8s.io\" first",
    )?;
    properties(&c.admin, "v1beta1")
        .create(
            &pp,
            &property("v1beta1", "cluster.clusterset.k8s.io", "cluster-a")?,
        )
        .await?;
    let join = property("v1beta1", "clusterset.k8s.io", "set-1")?;
    let writer = properties(&c.writer, "v1beta1");
    after_cache_settles(
        "ClusterProperty clusterset after its ID",
        "clusterset-requires-id",
        || writer.create(&pp, &join),
    )
    .await?;
    expect_denied(
        "deleting the ClusterProperty ID while a member",
        properties(&c.admin, "v1alpha1")
            .delete("cluster.clusterset.k8s.io", &DeleteParams::default())
            .await,
        "id-lifespan: ClusterProperty \"cluster.clusterset.k8s.io\" cannot be deleted while ClusterProperty \
         \"clusterset.k8s.io\" exists (the cluster is a ClusterSet member); delete clusterset.k8s.io first to leave the ClusterSet",
    )?;
    // clean up for the initializer: no nodewarden ID claim left
    delete(&c.admin, "id.k8s.io")
        .await
        .context("removing id.k8s.io")?;
    Ok(())
}

/// The OCM ClusterClaim CRD appears while the webhook runs (discovery every second here): the
/// guard picks it up without a restart. Until its cache has synced, the rules that need the
/// other claims answer 503 `cache-not-synced`; the others apply at once.
async fn crd_installed_later(env: &TestEnv, c: &Clients) -> Result<()> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/crds/cluster.open-cluster-management.io_clusterclaims.yaml");
    apply_crds(env.cp, &env.client, &read_crds(&[file])?).await?;
    let resource = ApiResource {
        group: "cluster.open-cluster-management.io".to_string(),
        version: "v1alpha1".to_string(),
        api_version: "cluster.open-cluster-management.io/v1alpha1".to_string(),
        kind: "ClusterClaim".to_string(),
        plural: "clusterclaims".to_string(),
    };
    let ocm = |client: &Client| Api::<DynamicObject>::all_with(client.clone(), &resource);
    let claim = |name: &str, value: &str| -> Result<DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1alpha1",
            "kind": "ClusterClaim",
            "metadata": {"name": name},
            "spec": {"value": value},
        }))?)
    };
    let pp = PostParams::default();
    let join = claim("clusterset.k8s.io", "set-1")?;
    let not_synced = std::sync::atomic::AtomicUsize::new(0);
    env.cp
        .poll("the guard to watch OCM ClusterClaims", || {
            let api = ocm(&c.admin);
            let join = join.clone();
            let pp = pp.clone();
            let not_synced = &not_synced;
            async move {
                match api.create(&pp, &join).await {
                    Ok(_) => bail!("an OCM clusterset.k8s.io without an ID was admitted"),
                    Err(kube::Error::Api(s)) if s.message.starts_with(&format!("{DENIED}cache-not-synced: ")) => {
                        ensure!(s.code == 503, "cache-not-synced should be 503, got {}", s.code);
                        not_synced.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Ok(None)
                    }
                    // before the API server calls the webhook for the new resource
                    Err(kube::Error::Api(s)) if !s.message.starts_with(DENIED) => Ok(None),
                    Err(kube::Error::Api(s)) => {
                        let want = format!(
                            "{DENIED}clusterset-requires-id: ClusterClaim \"clusterset.k8s.io\" (value \"set-1\") \
                             cannot be created while no ID claim exists; create ClusterClaim \"id.k8s.io\" or \
                             \"cluster.clusterset.k8s.io\" first"
                        );
                        ensure!(s.code == 403 && s.message == want, "got {} {}", s.code, s.message);
                        Ok(Some(()))
                    }
                    Err(e) => Err(e.into()),
                }
            }
        })
        .await?;
    eprintln!(
        "OCM ClusterClaims guarded ({} answers of cache-not-synced before)",
        not_synced.into_inner()
    );
    expect_denied(
        "jane creates an OCM id.k8s.io",
        ocm(&c.jane).create(&pp, &claim("id.k8s.io", "cluster-a")?).await,
        "reserved-name: ClusterClaim \"id.k8s.io\" is reserved (names ending in .k8s.io or .kubernetes.io); \
         \"jane\" may not create it: only the users, groups and service accounts allowed by the nodewarden configuration may",
    )?;
    Ok(())
}

/// The admin port's metrics count the decisions by rule and outcome.
async fn decisions_in_metrics(admin_port: u16) -> Result<()> {
    let (status, text) = http_get(admin_port, "/metrics").await?;
    ensure!(status == 200, "/metrics answered {status}");
    for line in [
        "nodewarden_claims_decisions_total{rule=\"id-lifespan\",outcome=\"denied\"} ",
        "nodewarden_claims_decisions_total{rule=\"clusterset-claim\",outcome=\"allowed\"} ",
        "nodewarden_claims_decisions_total{rule=\"value-size\",outcome=\"denied\"} ",
    ] {
        ensure!(text.contains(line), "/metrics has no {line:?}");
    }
    Ok(())
}

async fn initializer(env: &TestEnv, c: &Clients) -> Result<()> {
    let uid = Api::<Namespace>::all(c.admin.clone())
        .get("kube-system")
        .await?
        .metadata
        .uid
        .ok_or_else(|| anyhow!("kube-system has no uid"))?;
    let created = poll_value(env.cp, &c.admin, "id.k8s.io", |v| v.is_some()).await?;
    ensure!(
        created.as_deref() == Some(uid.as_str()),
        "initializer wrote {created:?}, want the kube-system UID {uid}"
    );
    let holder = lease_holder(env).await?;
    ensure!(
        holder.as_deref() == Some("e2e-webhook-b"),
        "Lease holder is {holder:?}"
    );

    // an ID someone set is left alone
    set_value(&c.admin, "id.k8s.io", "custom-id").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = value_of(&c.admin, "id.k8s.io").await?;
    ensure!(
        kept.as_deref() == Some("custom-id"),
        "the initializer overwrote the ID: {kept:?}"
    );

    // cluster.clusterset.k8s.io is an ID claim too: no id.k8s.io is added next to it
    create(&c.admin, "cluster.clusterset.k8s.io", "custom-id").await?;
    delete(&c.admin, "id.k8s.io").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let added = value_of(&c.admin, "id.k8s.io").await?;
    ensure!(
        added.is_none(),
        "the initializer created id.k8s.io = {added:?} although cluster.clusterset.k8s.io exists"
    );

    // with no ID claim at all, it is back within moments
    delete(&c.admin, "cluster.clusterset.k8s.io").await?;
    let again = poll_value(env.cp, &c.admin, "id.k8s.io", |v| v.is_some()).await?;
    ensure!(
        again.as_deref() == Some(uid.as_str()),
        "re-created {again:?}, want {uid}"
    );
    Ok(())
}

async fn lease_holder(env: &TestEnv) -> Result<Option<String>> {
    let lease: Lease = Api::namespaced(env.client.clone(), &env.namespace)
        .get(controllers::LEASE_NAME)
        .await?;
    Ok(lease.spec.and_then(|s| s.holder_identity))
}

async fn poll_value(
    cp: &ControlPlane,
    client: &Client,
    name: &str,
    done: impl Fn(&Option<String>) -> bool,
) -> Result<Option<String>> {
    cp.poll(&format!("ClusterClaim {name}"), || async {
        let v = value_of(client, name).await?;
        Ok(done(&v).then_some(v))
    })
    .await
}

/// nodewarden's CRDs from the chart and the about-api ClusterProperty fixture.
async fn install_crds(env: &TestEnv) -> Result<()> {
    let mut files = chart_crd_files()?;
    files.push(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/crds/about.k8s.io_clusterproperties.yaml"),
    );
    apply_crds(env.cp, &env.client, &read_crds(&files)?).await?;
    Ok(())
}

/// RBAC for the writer service account and jane's group on both claim APIs, so that what
/// refuses them is the guard, not RBAC.
async fn grant_claim_writes(env: &TestEnv) -> Result<()> {
    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(env.client.clone(), &env.namespace)
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": WRITER_SA}}))?,
        )
        .await?;
    let role = format!("{}-claims-editor", env.id);
    Api::<ClusterRole>::all(env.client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": role},
                "rules": [{
                    "apiGroups": ["nodewarden.io", "about.k8s.io", "cluster.open-cluster-management.io"],
                    "resources": ["clusterclaims", "clusterproperties"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }],
            }))?,
        )
        .await?;
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [
                    {"kind": "ServiceAccount", "name": WRITER_SA, "namespace": env.namespace},
                    {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": EDITORS},
                ],
            }))?,
        )
        .await?;
    Ok(())
}

/// The validating webhook for both claim APIs, as the chart registers it.
async fn register(env: &TestEnv, port: u16) -> Result<()> {
    let mut hook = Hook::claims();
    hook.timeout_seconds = 5;
    let endpoint = LoopbackEndpoint {
        port,
        ca_pem: env.cp.ca_pem().to_string(),
    };
    register_validating_webhooks(&env.client, &format!("{}-claims", env.id), &endpoint, &[hook]).await?;
    Ok(())
}

/// Waits until the API server calls the webhook: a reserved write by jane is refused by it.
async fn wait_until_guarded(env: &TestEnv, c: &Clients) -> Result<()> {
    env.cp
        .poll("the claims webhook to be called", || async {
            match create(&c.jane, "probe.k8s.io", "x").await {
                Err(kube::Error::Api(s)) if s.message.starts_with(DENIED) => Ok(Some(())),
                Ok(_) => {
                    delete(&c.admin, "probe.k8s.io").await?;
                    Ok(None)
                }
                Err(_) => Ok(None),
            }
        })
        .await
}

/// `nodewarden_webhook::run` in this process with the flags this test needs.
struct Webhook;

impl Webhook {
    async fn start(
        env: &TestEnv,
        cert_dir: &Path,
        listen_port: u16,
        admin_port: u16,
        pod_name: &str,
        extra: &[&str],
    ) -> Result<InProcessWebhook> {
        let mut args = vec![
            format!("--listen-addr=127.0.0.1:{listen_port}"),
            format!("--admin-addr=127.0.0.1:{admin_port}"),
            format!("--tls-cert-file={}", cert_dir.join("tls.crt").display()),
            format!("--tls-key-file={}", cert_dir.join("tls.key").display()),
            format!("--kubeconfig={}", env.cp.kubeconfig_path().display()),
            format!("--namespace={}", env.namespace),
            format!("--pod-name={pod_name}"),
            format!("--claims-allowed-service-accounts={}:{WRITER_SA}", env.namespace),
            "--shutdown-grace=2s".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        InProcessWebhook::start(&args, admin_port).await
    }
}
