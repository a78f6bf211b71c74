//! A tiny admission webhook served by the test process over TLS on loopback: it records every
//! AdmissionReview the API server sends and answers with what the test's responder says.
//!
//! It checks what the API server really sends (the facts nodewarden's webhook relies on), and
//! with `NODEWARDEN_E2E_RECORD_DIR=<folder>` it writes each review to a file there, to keep
//! as a fixture for unit and in-process tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::controlplane::ControlPlane;
use crate::webhooks::LoopbackEndpoint;

/// Builds the `response` of an AdmissionReview (without `uid`, which is filled in) from its
/// `request`.
pub type Responder = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

/// Admits everything unchanged.
pub fn allow_all() -> Responder {
    Arc::new(|_| json!({"allowed": true}))
}

/// A `response` that admits with a JSON Patch (`ops` is the array of operations).
pub fn allow_with_patch(ops: &Value) -> Value {
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
    json!({"allowed": true, "patchType": "JSONPatch", "patch": patch})
}

/// Label of the pods [`RecordingWebhook::wait_until_called`] creates (dry run) to probe.
pub const PROBE_LABEL: &str = "e2e.nodewarden.io/probe";

/// See the module documentation. Stops serving when dropped.
pub struct RecordingWebhook {
    pub endpoint: LoopbackEndpoint,
    reviews: Arc<Mutex<Vec<Value>>>,
    server: JoinHandle<()>,
}

impl Drop for RecordingWebhook {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl RecordingWebhook {
    /// Serves on a free port of 127.0.0.1 with a certificate from the cluster CA, on every
    /// path, HTTP/1.1 and HTTP/2.
    pub async fn start(cp: &ControlPlane, responder: Responder) -> Result<Self> {
        let cert = cp.issue_loopback_serving_cert()?;
        let chain = rustls_pemfile::certs(&mut cert.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
        let key = rustls_pemfile::private_key(&mut cert.key_pem.as_bytes())?
            .ok_or_else(|| anyhow!("no private key in the issued certificate"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));

        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let port = listener.local_addr()?.port();
        let reviews = Arc::new(Mutex::new(Vec::new()));
        let record_dir = std::env::var_os("NODEWARDEN_E2E_RECORD_DIR").map(PathBuf::from);
        let state = Arc::new(State {
            reviews: reviews.clone(),
            responder,
            record_dir,
            count: AtomicUsize::new(0),
        });
        let server = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let state = state.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, std::convert::Infallible>(state.handle(req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            endpoint: LoopbackEndpoint {
                port,
                ca_pem: cp.ca_pem().to_string(),
            },
            reviews,
            server,
        })
    }

    /// Every AdmissionReview received so far (the whole review, `request` included).
    pub fn reviews(&self) -> Vec<Value> {
        self.reviews.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `request`s received so far for which `pred` holds.
    pub fn requests_where(&self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.reviews()
            .into_iter()
            .filter_map(|r| r.get("request").cloned())
            .filter(|r| pred(r))
            .collect()
    }

    /// Waits until the API server sends this webhook a pod CREATE in `namespace`: creates a
    /// labelled pod there with `dryRun=All` until the webhook has seen one. A webhook on pods
    /// in that namespace is active once this returns (the API server loads configurations
    /// from a watch, so the first requests after registering may pass it by).
    pub async fn wait_until_called(
        &self,
        cp: &ControlPlane,
        client: &kube::Client,
        namespace: &str,
    ) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let probe: Pod = serde_json::from_value(json!({
            "metadata": {"generateName": "probe-", "labels": {PROBE_LABEL: "true"}},
            "spec": {"containers": [{"name": "probe", "image": "nodewarden-e2e/pause:never-pulled"}]},
        }))?;
        let params = PostParams {
            dry_run: true,
            ..Default::default()
        };
        cp.poll(
            &format!("the webhook on 127.0.0.1:{} to be called", self.endpoint.port),
            || {
                let pods = pods.clone();
                let probe = probe.clone();
                let params = params.clone();
                async move {
                    // A denial or patch from the responder is fine: what matters is the call.
                    let _ = pods.create(&params, &probe).await;
                    let seen = !self
                        .requests_where(|r| {
                            r.pointer(&format!(
                                "/object/metadata/labels/{}",
                                PROBE_LABEL.replace('/', "~1")
                            ))
                            .is_some()
                        })
                        .is_empty();
                    Ok(seen.then_some(()))
                }
            },
        )
        .await
        .context("registered webhook never called")
    }
}

struct State {
    reviews: Arc<Mutex<Vec<Value>>>,
    responder: Responder,
    record_dir: Option<PathBuf>,
    count: AtomicUsize,
}

impl State {
    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return reply(StatusCode::BAD_REQUEST, format!("reading the body: {e}").into()),
        };
        let review: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return reply(StatusCode::BAD_REQUEST, format!("not JSON: {e}").into()),
        };
        let request = review.get("request").cloned().unwrap_or(Value::Null);
        self.record(&review);
        let mut response = (self.responder)(&request);
        response["uid"] = request.get("uid").cloned().unwrap_or(Value::Null);
        let answer = json!({
            "apiVersion": review.get("apiVersion").cloned().unwrap_or(json!("admission.k8s.io/v1")),
            "kind": "AdmissionReview",
            "response": response,
        });
        reply(StatusCode::OK, answer.to_string().into())
    }

    fn record(&self, review: &Value) {
        let n = self.count.fetch_add(1, Ordering::Relaxed);
        if let Some(dir) = &self.record_dir {
            let request = review.get("request");
            let field = |p: &str| {
                request
                    .and_then(|r| r.pointer(p))
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
            };
            let name = format!(
                "{}-{}-{}-{n}.json",
                field("/kind/kind").to_lowercase(),
                field("/operation").to_lowercase(),
                std::process::id()
            );
            let _ = std::fs::create_dir_all(dir);
            if let Ok(text) = serde_json::to_string_pretty(review) {
                let _ = std::fs::write(dir.join(name), text);
            }
        }
        self.reviews
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(review.clone());
    }
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}
