//! Managed certificates (`--cert-mode managed`, the chart's default).
//!
//! The webhook keeps its own CA and serving certificate in one `kubernetes.io/tls` Secret, the
//! source of truth, and keeps the `caBundle` of its webhook configurations equal to the Secret's
//! `ca.crt`. Every replica runs the same loop; writes use the Secret's resourceVersion, so
//! replicas racing each other cannot overwrite a newer Secret, and the bundle only ever grows
//! by a new CA (old CAs stay until they expire), so a replica injecting a slightly older view
//! breaks nobody.
//!
//! Rotation never presents a caller with a certificate its bundle does not trust:
//! 1. the CA nears its end → a new CA is *staged*: it goes into `ca.crt` in front of the old one
//!    and is injected, while the serving certificate of the old CA stays in use;
//! 2. once the staged CA has been published for `ca_propagation`, a serving certificate of the
//!    new CA replaces the old one;
//! 3. the old CA leaves the bundle when it expires.
//!
//! Each replica serves the pair from the Secret directly (no wait for the kubelet to refresh
//! the mounted files).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_certs::{
    Ca, CaConfig, CertInfo, IssuedCert, ServingSpec, TlsSecretContents, ca_bundle, parse_certificate_info,
    read_tls_secret, service_dns_names, tls_secret,
};
use serde_json::json;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::tls::{CertResolver, certified_key};

/// How the serving certificate is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CertMode {
    /// Read `--tls-cert-file`/`--tls-key-file` (and reload them when they change).
    Files,
    /// Generate, rotate and publish certificates in-process (this module).
    Managed,
    /// cert-manager writes the mounted Secret and injects the caBundle: same as `files`.
    #[value(name = "certManager")]
    CertManager,
    /// A Secret provided by the operator is mounted: same as `files`.
    Secret,
}

/// Flags of managed certificates.
#[derive(clap::Args, Debug, Clone)]
pub struct CertArgs {
    /// How the serving certificate is obtained: files, managed, certManager or secret.
    #[arg(long, env = "NODEWARDEN_CERT_MODE", value_enum, default_value = "files")]
    pub cert_mode: CertMode,
    /// Managed mode: the Secret holding the CA and serving certificate, in --namespace.
    #[arg(
        long,
        env = "NODEWARDEN_CERT_SECRET",
        default_value = "nodewarden-webhook-tls"
    )]
    pub cert_secret: String,
    /// Managed mode: the Service the API server calls; its DNS names go into the certificate.
    #[arg(long, env = "NODEWARDEN_CERT_SERVICE", default_value = "nodewarden-webhook")]
    pub cert_service: String,
    /// Managed mode: more DNS names for the serving certificate, comma-separated.
    #[arg(long, env = "NODEWARDEN_CERT_EXTRA_DNS_NAMES", value_delimiter = ',')]
    pub cert_extra_dns_names: Vec<String>,
    /// Managed mode: IP addresses for the serving certificate, comma-separated.
    #[arg(long, env = "NODEWARDEN_CERT_IP_ADDRESSES", value_delimiter = ',')]
    pub cert_ip_addresses: Vec<IpAddr>,
    /// Managed mode: webhook configurations whose caBundle is kept current, comma-separated.
    #[arg(long, env = "NODEWARDEN_WEBHOOK_CONFIGURATIONS", value_delimiter = ',')]
    pub webhook_configurations: Vec<String>,
    /// Managed mode: lifetime of a CA.
    #[arg(long, env = "NODEWARDEN_CERT_CA_VALIDITY", default_value = "43800h", value_parser = nodewarden_runtime::duration::parse_duration)]
    pub cert_ca_validity: Duration,
    /// Managed mode: lifetime of a serving certificate.
    #[arg(long, env = "NODEWARDEN_CERT_VALIDITY", default_value = "8760h", value_parser = nodewarden_runtime::duration::parse_duration)]
    pub cert_validity: Duration,
    /// Managed mode: reissue the serving certificate this long before it expires.
    #[arg(long, env = "NODEWARDEN_CERT_RENEW_BEFORE", default_value = "720h", value_parser = nodewarden_runtime::duration::parse_duration)]
    pub cert_renew_before: Duration,
    /// Managed mode: stage a new CA this long before the current one expires.
    #[arg(long, env = "NODEWARDEN_CERT_CA_RENEW_BEFORE", default_value = "8760h", value_parser = nodewarden_runtime::duration::parse_duration)]
    pub cert_ca_renew_before: Duration,
    /// Managed mode: how long a new CA is published before certificates it issued are served.
    #[arg(long, env = "NODEWARDEN_CERT_CA_PROPAGATION", default_value = "2m", value_parser = nodewarden_runtime::duration::parse_duration)]
    pub cert_ca_propagation: Duration,
    /// Managed mode: how often the Secret and the caBundles are checked.
    #[arg(long, env = "NODEWARDEN_CERT_CHECK_INTERVAL", default_value = "30s", value_parser = nodewarden_runtime::duration::parse_interval)]
    pub cert_check_interval: Duration,
}

impl CertArgs {
    /// The options of managed mode, or why the flags do not fit together.
    pub fn options(&self, namespace: &str) -> Result<CertManagerOptions, String> {
        let hours = |d: Duration| humantime::format_duration(d).to_string();
        if self.cert_validity > self.cert_ca_validity {
            return Err(format!(
                "--cert-validity {} is longer than --cert-ca-validity {}: a certificate cannot outlive its CA",
                hours(self.cert_validity),
                hours(self.cert_ca_validity)
            ));
        }
        if self.cert_renew_before >= self.cert_validity {
            return Err(format!(
                "--cert-renew-before {} must be shorter than --cert-validity {}",
                hours(self.cert_renew_before),
                hours(self.cert_validity)
            ));
        }
        if self.cert_ca_renew_before >= self.cert_ca_validity {
            return Err(format!(
                "--cert-ca-renew-before {} must be shorter than --cert-ca-validity {}",
                hours(self.cert_ca_renew_before),
                hours(self.cert_ca_validity)
            ));
        }
        if self.cert_secret.is_empty() || self.cert_service.is_empty() {
            return Err("--cert-secret and --cert-service must not be empty in managed mode".into());
        }
        Ok(CertManagerOptions {
            namespace: namespace.to_string(),
            secret: self.cert_secret.clone(),
            service: self.cert_service.clone(),
            extra_dns_names: self.cert_extra_dns_names.clone(),
            ip_addresses: self.cert_ip_addresses.clone(),
            webhook_configurations: self
                .webhook_configurations
                .iter()
                .filter(|n| !n.is_empty())
                .cloned()
                .collect(),
            ca_validity: self.cert_ca_validity,
            cert_validity: self.cert_validity,
            renew_before: self.cert_renew_before,
            ca_renew_before: self.cert_ca_renew_before,
            ca_propagation: self.cert_ca_propagation,
            check_interval: self.cert_check_interval,
        })
    }
}

/// Field manager of the `caBundle` fields this process owns.
pub const FIELD_MANAGER: &str = "nodewarden-cert-injector";
/// Annotation on the Secret: when the current CA was staged (RFC 3339).
pub const STAGED_AT: &str = "nodewarden.io/ca-staged-at";

/// What the certificate manager keeps: which Secret, which names, which lifetimes.
#[derive(Clone, Debug)]
pub struct CertManagerOptions {
    /// Namespace of the Secret and the Service.
    pub namespace: String,
    /// Name of the Secret holding the CA and the serving certificate.
    pub secret: String,
    /// The Service the API server calls; its DNS names go into the serving certificate.
    pub service: String,
    /// More DNS names for the serving certificate.
    pub extra_dns_names: Vec<String>,
    /// IP addresses for the serving certificate.
    pub ip_addresses: Vec<IpAddr>,
    /// Webhook configurations (mutating or validating) whose caBundle is kept current.
    pub webhook_configurations: Vec<String>,
    /// Lifetime of a CA.
    pub ca_validity: Duration,
    /// Lifetime of a serving certificate.
    pub cert_validity: Duration,
    /// Reissue the serving certificate this long before it expires.
    pub renew_before: Duration,
    /// Stage a new CA this long before the current one expires.
    pub ca_renew_before: Duration,
    /// How long a staged CA is published before certificates it issued are served.
    pub ca_propagation: Duration,
    /// How often the Secret and the caBundles are checked.
    pub check_interval: Duration,
}

impl CertManagerOptions {
    /// The serving certificate's DNS names: the Service's, then the extra ones not already among them.
    pub fn dns_names(&self) -> Vec<String> {
        let mut names = service_dns_names(&self.service, &self.namespace);
        for n in &self.extra_dns_names {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names
    }
}

/// What the Secret needs, decided from what it holds and the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing usable: a new CA and serving certificate.
    Create {
        /// Why, in words for the log.
        reason: String,
    },
    /// The CA nears its end: put a new CA in front of it; keep serving the old pair.
    StageCa {
        /// Why, in words for the log.
        reason: String,
    },
    /// A serving certificate from the current CA.
    ReissueServing {
        /// Why, in words for the log.
        reason: String,
    },
    /// The Secret is fine as it is.
    Keep,
}

fn ts(d: Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}

/// The pure decision. `current` is the Secret's contents (or why they could not be read).
pub fn plan(
    current: Option<Result<&TlsSecretContents, String>>,
    staged_at: Option<OffsetDateTime>,
    opts: &CertManagerOptions,
    now: OffsetDateTime,
) -> Action {
    let current = match current {
        None => {
            return Action::Create {
                reason: "the Secret does not exist".into(),
            };
        }
        Some(Err(why)) => {
            return Action::Create {
                reason: format!("the Secret is unusable: {why}"),
            };
        }
        Some(Ok(c)) => c,
    };
    let ca_end = current.ca.not_after();
    if ca_end <= now {
        return Action::Create {
            reason: format!("the CA expired at {ca_end}"),
        };
    }
    let serving = match parse_certificate_info(&current.serving.cert_pem) {
        Ok(info) => info,
        Err(e) => {
            return Action::Create {
                reason: format!("the serving certificate is unreadable: {e}"),
            };
        }
    };
    let ca = match parse_certificate_info(&current.ca.cert_pem) {
        Ok(info) => info,
        Err(e) => {
            return Action::Create {
                reason: format!("the CA certificate is unreadable: {e}"),
            };
        }
    };
    let from_current_ca = serving.issuer == ca.subject;
    if from_current_ca && ca_end - ts(opts.ca_renew_before) <= now {
        return Action::StageCa {
            reason: format!("the CA expires at {ca_end}"),
        };
    }
    if !from_current_ca {
        let published_long_enough = staged_at.is_none_or(|at| at + ts(opts.ca_propagation) <= now);
        if published_long_enough {
            return Action::ReissueServing {
                reason: "the CA was rotated and its bundle is published".into(),
            };
        }
        if serving.not_after > now {
            return Action::Keep;
        }
        return Action::ReissueServing {
            reason: "the serving certificate expired".into(),
        };
    }
    if serving.not_after - ts(opts.renew_before) <= now {
        return Action::ReissueServing {
            reason: format!("the serving certificate expires at {}", serving.not_after),
        };
    }
    if let Some(missing) = missing_names(&serving, opts) {
        return Action::ReissueServing {
            reason: format!("the serving certificate does not cover {missing}"),
        };
    }
    Action::Keep
}

fn missing_names(serving: &CertInfo, opts: &CertManagerOptions) -> Option<String> {
    let missing: Vec<String> = opts
        .dns_names()
        .into_iter()
        .filter(|n| !serving.dns_names.contains(n))
        .chain(
            opts.ip_addresses
                .iter()
                .filter(|ip| !serving.ip_addresses.contains(ip))
                .map(|ip| ip.to_string()),
        )
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// Why the certificate manager could not bring the Secret or a caBundle up to date.
#[derive(Debug, thiserror::Error)]
pub enum CertManagerError {
    /// A call to the API server failed.
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    /// A certificate or key could not be made or read.
    #[error("certificates: {0}")]
    Certs(#[from] nodewarden_certs::CertError),
    /// The Secret (named) does not exist and none was written.
    #[error("Secret {0} does not exist and none was written")]
    NoSecret(String),
    /// The named webhook configuration is neither mutating nor validating.
    #[error(
        "webhook configuration {0} is neither a MutatingWebhookConfiguration nor a ValidatingWebhookConfiguration"
    )]
    NoSuchConfiguration(String),
}

/// The new Secret for `action`, or `None` for [`Action::Keep`].
pub fn build_secret(
    action: &Action,
    current: Option<&TlsSecretContents>,
    opts: &CertManagerOptions,
    now: OffsetDateTime,
) -> Result<Option<Secret>, nodewarden_certs::CertError> {
    let new_ca = || {
        Ca::generate(&CaConfig {
            common_name: format!("nodewarden-webhook-ca-{}", now.unix_timestamp()),
            validity: opts.ca_validity,
        })
    };
    let issue = |ca: &Ca| -> Result<IssuedCert, nodewarden_certs::CertError> {
        ca.issue_serving(&ServingSpec {
            dns_names: opts.dns_names(),
            ip_addresses: opts.ip_addresses.clone(),
            validity: opts.cert_validity,
        })
    };
    let previous = current.map(|c| c.ca_bundle.as_str());
    let mut annotations = BTreeMap::new();
    let secret = match action {
        Action::Keep => return Ok(None),
        Action::Create { .. } => {
            let ca = new_ca()?;
            let serving = issue(&ca)?;
            // still-valid CAs of a readable previous bundle stay trusted; an unreadable one is dropped
            let bundle = match previous.and_then(|p| ca_bundle(&ca.cert_pem, Some(p), now).ok()) {
                Some(bundle) => bundle,
                None => ca_bundle(&ca.cert_pem, None, now)?,
            };
            tls_secret(&opts.secret, &opts.namespace, &serving, &ca, &bundle)
        }
        Action::StageCa { .. } => {
            let Some(current) = current else { return Ok(None) };
            let ca = new_ca()?;
            let bundle = ca_bundle(&ca.cert_pem, previous, now)?;
            annotations.insert(
                STAGED_AT.to_string(),
                now.format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
            );
            tls_secret(&opts.secret, &opts.namespace, &current.serving, &ca, &bundle)
        }
        Action::ReissueServing { .. } => {
            let Some(current) = current else { return Ok(None) };
            let serving = issue(&current.ca)?;
            let bundle = ca_bundle(&current.ca.cert_pem, previous, now)?;
            tls_secret(&opts.secret, &opts.namespace, &serving, &current.ca, &bundle)
        }
    };
    let mut secret = secret;
    if !annotations.is_empty() {
        secret
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations);
    }
    Ok(Some(secret))
}

fn staged_at(secret: &Secret) -> Option<OffsetDateTime> {
    let at = secret.metadata.annotations.as_ref()?.get(STAGED_AT)?;
    OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()
}

/// One pass: read the Secret, write what `plan` says, serve its pair, inject its bundle.
/// Returns the bundle now in force.
pub async fn reconcile(
    client: &Client,
    opts: &CertManagerOptions,
    resolver: &CertResolver,
) -> Result<String, CertManagerError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &opts.namespace);
    let now = OffsetDateTime::now_utc();
    let existing = secrets.get_opt(&opts.secret).await?;
    let contents = existing
        .as_ref()
        .map(|s| read_tls_secret(s).map_err(|e| e.to_string()));
    let action = plan(
        contents.as_ref().map(|c| c.as_ref().map_err(Clone::clone)),
        existing.as_ref().and_then(staged_at),
        opts,
        now,
    );
    let readable = contents.as_ref().and_then(|c| c.as_ref().ok());
    let secret = match (build_secret(&action, readable, opts, now)?, existing) {
        (None, Some(existing)) => existing,
        (None, None) => return Err(CertManagerError::NoSecret(opts.secret.clone())),
        (Some(mut desired), existing) => {
            tracing::info!(?action, secret = %opts.secret, "writing the webhook certificate Secret");
            match &existing {
                Some(old) => {
                    // optimistic concurrency: a replica that lost the race reads again next pass
                    desired.metadata.resource_version = old.metadata.resource_version.clone();
                    secrets
                        .replace(&opts.secret, &PostParams::default(), &desired)
                        .await?
                }
                None => secrets.create(&PostParams::default(), &desired).await?,
            }
        }
    };
    let contents = read_tls_secret(&secret)?;
    load(resolver, &contents);
    for name in &opts.webhook_configurations {
        inject(client, name, &contents.ca_bundle).await?;
    }
    Ok(contents.ca_bundle)
}

/// Serves the Secret's pair if it differs from what is served.
fn load(resolver: &CertResolver, contents: &TlsSecretContents) {
    let leaf = rustls_pemfile::certs(&mut contents.serving.cert_pem.as_bytes())
        .next()
        .and_then(Result::ok);
    if leaf.is_some() && resolver.current_leaf() == leaf {
        return;
    }
    let path = std::path::Path::new("secret");
    match certified_key(
        contents.serving.cert_pem.as_bytes(),
        contents.serving.key_pem.as_bytes(),
        path,
        path,
    ) {
        Ok(key) => {
            resolver.set(key);
            tracing::info!("serving the certificate from the managed Secret");
        }
        Err(err) => {
            tracing::error!(error = %err, "the managed Secret's pair cannot be served; keeping the current one")
        }
    }
}

/// Sets `caBundle` on every webhook of the configuration `name` (mutating or validating) by
/// server-side apply with a field manager of its own, only when it differs.
pub async fn inject(client: &Client, name: &str, bundle: &str) -> Result<(), CertManagerError> {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(bundle);
    let kinds = [
        ApiResource::erase::<MutatingWebhookConfiguration>(&()),
        ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
    ];
    for resource in kinds {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let Some(config) = api.get_opt(name).await? else {
            continue;
        };
        let hooks = config
            .data
            .get("webhooks")
            .and_then(|w| w.as_array())
            .cloned()
            .unwrap_or_default();
        let current = |h: &serde_json::Value| {
            h.pointer("/clientConfig/caBundle")
                .and_then(|b| b.as_str())
                .map(str::to_owned)
        };
        if hooks
            .iter()
            .all(|h| current(h).as_deref() == Some(encoded.as_str()))
        {
            return Ok(());
        }
        let body = json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {"name": name},
            "webhooks": hooks
                .iter()
                .filter_map(|h| h.get("name"))
                .map(|n| json!({"name": n, "clientConfig": {"caBundle": encoded}}))
                .collect::<Vec<_>>(),
        });
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await?;
        tracing::info!(configuration = name, kind = %resource.kind, "injected caBundle");
        return Ok(());
    }
    Err(CertManagerError::NoSuchConfiguration(name.to_string()))
}

/// Reconciles every `check_interval` until cancelled; `loaded` is told whether a pair is served.
pub async fn run(
    client: Client,
    opts: CertManagerOptions,
    resolver: Arc<CertResolver>,
    shutdown: CancellationToken,
    loaded: impl Fn(bool),
) {
    let mut failures = 0u32;
    loop {
        let wait = match reconcile(&client, &opts, &resolver).await {
            Ok(_) => {
                failures = 0;
                opts.check_interval
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                let wait = Duration::from_millis(500).saturating_mul(2u32.saturating_pow(failures.min(6)));
                tracing::warn!(error = %err, retry_in = ?wait, "certificate reconcile failed");
                wait.min(opts.check_interval)
            }
        };
        loaded(resolver.is_loaded());
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> CertManagerOptions {
        CertManagerOptions {
            namespace: "nodewarden".into(),
            secret: "nodewarden-webhook-tls".into(),
            service: "nodewarden-webhook".into(),
            extra_dns_names: vec![],
            ip_addresses: vec![],
            webhook_configurations: vec![],
            ca_validity: Duration::from_secs(3 * 3600),
            cert_validity: Duration::from_secs(3600),
            renew_before: Duration::from_secs(600),
            ca_renew_before: Duration::from_secs(3600),
            ca_propagation: Duration::from_secs(60),
            check_interval: Duration::from_secs(30),
        }
    }

    fn contents(secret: &Secret) -> TlsSecretContents {
        read_tls_secret(secret).expect("readable")
    }

    fn write(
        action: &Action,
        current: Option<&TlsSecretContents>,
        o: &CertManagerOptions,
        now: OffsetDateTime,
    ) -> Secret {
        build_secret(action, current, o, now)
            .expect("builds")
            .expect("a secret")
    }

    /// Does a client holding `bundle` accept the serving certificate in `secret`?
    fn trusted(bundle: &str, secret: &TlsSecretContents) -> bool {
        let serving = parse_certificate_info(&secret.serving.cert_pem).expect("info");
        rustls_pemfile::certs(&mut bundle.as_bytes())
            .filter_map(Result::ok)
            .filter_map(|der| {
                let pem = format!(
                    "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der.as_ref())
                );
                parse_certificate_info(&pem).ok()
            })
            .any(|ca| ca.subject == serving.issuer)
    }

    #[test]
    fn a_missing_or_broken_secret_is_created_afresh() {
        let o = opts();
        let now = OffsetDateTime::now_utc();
        assert!(matches!(plan(None, None, &o, now), Action::Create { .. }));
        let broken = plan(Some(Err("tls.key is missing".into())), None, &o, now);
        assert!(
            matches!(&broken, Action::Create { reason } if reason.contains("tls.key is missing")),
            "{broken:?}"
        );
        let s = contents(&write(
            &Action::Create {
                reason: String::new(),
            },
            None,
            &o,
            now,
        ));
        let info = parse_certificate_info(&s.serving.cert_pem).expect("info");
        assert_eq!(
            info.dns_names,
            service_dns_names("nodewarden-webhook", "nodewarden")
        );
        assert!(trusted(&s.ca_bundle, &s));
        assert_eq!(plan(Some(Ok(&s)), None, &o, now), Action::Keep);
    }

    #[test]
    fn the_serving_certificate_is_reissued_before_it_expires_and_when_names_change() {
        let o = opts();
        let t0 = OffsetDateTime::now_utc();
        let s = contents(&write(
            &Action::Create {
                reason: String::new(),
            },
            None,
            &o,
            t0,
        ));
        // cert valid 1 h, renewed 10 min before the end
        assert_eq!(
            plan(Some(Ok(&s)), None, &o, t0 + time::Duration::minutes(45)),
            Action::Keep
        );
        let late = t0 + time::Duration::minutes(51);
        assert!(matches!(
            plan(Some(Ok(&s)), None, &o, late),
            Action::ReissueServing { .. }
        ));
        let mut more = o.clone();
        more.extra_dns_names.push("webhook.example".into());
        assert!(
            matches!(plan(Some(Ok(&s)), None, &more, t0), Action::ReissueServing { reason } if reason.contains("webhook.example"))
        );
    }

    #[test]
    fn a_ca_rotation_never_serves_a_certificate_the_published_bundle_does_not_trust() {
        let mut o = opts();
        // serving certificates live 2.5 h, so the first one is still current when the CA nears its end
        o.cert_validity = Duration::from_secs(150 * 60);
        let t0 = OffsetDateTime::now_utc();
        let v1 = contents(&write(
            &Action::Create {
                reason: String::new(),
            },
            None,
            &o,
            t0,
        ));
        // the CA lives 3 h and is renewed 1 h before its end
        let t1 = t0 + time::Duration::minutes(125);
        // certificates are issued from the wall clock: the next CA must outlive this simulated day
        let o = CertManagerOptions {
            ca_validity: Duration::from_secs(10 * 3600),
            ..o
        };
        let stage = plan(Some(Ok(&v1)), None, &o, t1);
        assert!(matches!(stage, Action::StageCa { .. }), "{stage:?}");
        let staged_secret = write(&stage, Some(&v1), &o, t1);
        let v2 = contents(&staged_secret);
        assert_eq!(
            v2.serving, v1.serving,
            "the old pair is still served while the new CA propagates"
        );
        assert!(
            trusted(&v1.ca_bundle, &v2),
            "callers with the old bundle still accept what is served"
        );
        assert!(trusted(&v2.ca_bundle, &v2));
        let at = staged_at(&staged_secret);
        assert!(at.is_some());
        // not before the propagation delay
        assert_eq!(
            plan(Some(Ok(&v2)), at, &o, t1 + time::Duration::seconds(30)),
            Action::Keep
        );
        let t2 = t1 + time::Duration::seconds(61);
        let reissue = plan(Some(Ok(&v2)), at, &o, t2);
        assert!(matches!(reissue, Action::ReissueServing { .. }), "{reissue:?}");
        let v3 = contents(&write(&reissue, Some(&v2), &o, t2));
        assert!(
            trusted(&v2.ca_bundle, &v3),
            "the published bundle accepts the new serving certificate"
        );
        assert!(
            !trusted(&v1.ca_bundle, &v3),
            "only because the new CA was published first"
        );
        assert_eq!(plan(Some(Ok(&v3)), at, &o, t2), Action::Keep);
        // the old CA leaves the bundle once expired
        let t3 = t0 + time::Duration::minutes(181);
        let later = plan(Some(Ok(&v3)), at, &o, t3);
        let v4 = contents(&write(
            &Action::ReissueServing {
                reason: String::new(),
            },
            Some(&v3),
            &o,
            t3,
        ));
        assert_eq!(rustls_pemfile::certs(&mut v3.ca_bundle.as_bytes()).count(), 2);
        assert_eq!(
            rustls_pemfile::certs(&mut v4.ca_bundle.as_bytes()).count(),
            1,
            "{later:?}"
        );
    }

    #[test]
    fn an_expired_ca_starts_over() {
        let o = opts();
        let t0 = OffsetDateTime::now_utc();
        let v1 = contents(&write(
            &Action::Create {
                reason: String::new(),
            },
            None,
            &o,
            t0,
        ));
        let gone = t0 + time::Duration::hours(4);
        assert!(
            matches!(plan(Some(Ok(&v1)), None, &o, gone), Action::Create { reason } if reason.contains("CA expired"))
        );
    }
}
