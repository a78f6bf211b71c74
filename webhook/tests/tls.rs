//! The admission server over real TLS: protocol versions, ALPN, keep-alive, certificate reload
//! and graceful shutdown. Certificates come from `nodewarden-certs`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use nodewarden_certs::{Ca, CaConfig, IssuedCert, ServingSpec, service_dns_names};
use nodewarden_webhook::admission::{self, AdmissionRequest, AdmissionResponse, Route};
use nodewarden_webhook::certificates::{
    CertReloader, CertResolver, ClientVerifier, Reload, server_config, server_config_with,
};
use nodewarden_webhook::metrics::Metrics;
use nodewarden_webhook::server::{ServerLimits, Shutdown, serve_tls_with};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const POD_REVIEW: &str = include_str!("../../tests/fixtures/admission/daemonset-pod-create.json");
const SERVER_NAME: &str = "nodewarden-webhook.nodewarden.svc";

fn ca(name: &str) -> Ca {
    Ca::generate(&CaConfig {
        common_name: name.to_string(),
        validity: Duration::from_secs(3600),
    })
    .expect("ca")
}

fn serving(ca: &Ca, extra: &str) -> IssuedCert {
    let mut dns_names = service_dns_names("nodewarden-webhook", "nodewarden");
    dns_names.push(extra.to_string());
    ca.issue_serving(&ServingSpec {
        dns_names,
        ip_addresses: vec![],
        validity: Duration::from_secs(3600),
    })
    .expect("serving cert")
}

fn slow_or_fast(req: &AdmissionRequest) -> AdmissionResponse {
    if req.namespace.as_deref() == Some("slow") {
        std::thread::sleep(Duration::from_millis(800));
    }
    AdmissionResponse::allow(&req.uid)
}

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    /// Starts the retiring phase (what the webhook does when it turns unready).
    retire: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// The reasons of the connections the server closed early, as its metric counts them.
    closed_early: Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl Server {
    fn closed_early(&self, reason: &str) -> usize {
        let log = self.closed_early.lock().expect("lock");
        log.iter().filter(|r| **r == reason).count()
    }
}

async fn start(resolver: Arc<CertResolver>) -> Server {
    start_with(resolver, ServerLimits::default()).await
}

async fn start_with(resolver: Arc<CertResolver>, limits: ServerLimits) -> Server {
    start_authenticating(resolver, limits, None).await
}

async fn start_authenticating(
    resolver: Arc<CertResolver>,
    limits: ServerLimits,
    client_auth: Option<Arc<ClientVerifier>>,
) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = admission::router(
        vec![Route::new("/review", slow_or_fast)],
        Arc::new(Metrics::new()),
        1 << 20,
    );
    let shutdown = Shutdown::default();
    let (stop, retire) = (shutdown.stop.clone(), shutdown.retire.clone());
    let tls = match client_auth {
        Some(verifier) => server_config_with(resolver, Some(verifier)),
        None => server_config(resolver),
    }
    .expect("tls config");
    let closed_early = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = closed_early.clone();
    let task = tokio::spawn(serve_tls_with(
        listener,
        tls,
        app,
        shutdown,
        Duration::from_secs(5),
        limits,
        Arc::new(move |reason| log.lock().expect("lock").push(reason)),
    ));
    Server {
        addr,
        stop,
        retire,
        task,
        closed_early,
    }
}

fn resolver_with(cert: &IssuedCert) -> Arc<CertResolver> {
    let resolver = Arc::new(CertResolver::default());
    let ck = nodewarden_webhook::certificates::certified_key(
        cert.cert_pem.as_bytes(),
        cert.key_pem.as_bytes(),
        Path::new("tls.crt"),
        Path::new("tls.key"),
    )
    .expect("pair");
    resolver.set(ck);
    resolver
}

struct Client {
    versions: Vec<&'static rustls::SupportedProtocolVersion>,
    alpn: Vec<Vec<u8>>,
    trust: String,
    identity: Option<IssuedCert>,
}

struct Connected {
    alpn: Option<Vec<u8>>,
    version: rustls::ProtocolVersion,
    leaf: CertificateDer<'static>,
    sender: Sender,
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Client {
    fn new(trust: &str) -> Self {
        Client {
            versions: vec![&rustls::version::TLS13, &rustls::version::TLS12],
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            trust: trust.to_string(),
            identity: None,
        }
    }

    fn presenting(mut self, identity: &IssuedCert) -> Self {
        self.identity = Some(identity.clone());
        self
    }

    async fn connect(&self, addr: SocketAddr) -> std::io::Result<Connected> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut self.trust.as_bytes()) {
            roots.add(cert?).map_err(std::io::Error::other)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&self.versions)
            .map_err(std::io::Error::other)?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some(id) => {
                let chain =
                    rustls_pemfile::certs(&mut id.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
                let key = rustls_pemfile::private_key(&mut id.key_pem.as_bytes())?
                    .ok_or_else(|| std::io::Error::other("no key"))?;
                config
                    .with_client_auth_cert(chain, key)
                    .map_err(std::io::Error::other)?
            }
            None => config.with_no_client_auth(),
        };
        config.alpn_protocols = self.alpn.clone();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await?;
        let tls = connector
            .connect(ServerName::try_from(SERVER_NAME).expect("name"), tcp)
            .await?;
        let (_, session) = tls.get_ref();
        let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
        let version = session.protocol_version().expect("negotiated");
        let leaf = session.peer_certificates().expect("server cert")[0]
            .clone()
            .into_owned();
        let io = TokioIo::new(tls);
        let sender = if alpn.as_deref() == Some(b"h2") {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Sender::H2(sender)
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            Sender::H1(sender)
        };
        Ok(Connected {
            alpn,
            version,
            leaf,
            sender,
        })
    }
}

impl Connected {
    /// Posts a review for `namespace`; returns the HTTP version and the answer's `allowed`.
    async fn review(&mut self, namespace: &str) -> Result<(http::Version, bool), String> {
        let mut review: serde_json::Value = serde_json::from_str(POD_REVIEW).expect("fixture");
        review["request"]["namespace"] = serde_json::json!(namespace);
        let req = http::Request::post("https://nodewarden-webhook.nodewarden.svc/review")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(review.to_string())))
            .expect("request");
        let resp = match &mut self.sender {
            Sender::H1(s) => s.send_request(req).await,
            Sender::H2(s) => s.send_request(req).await,
        }
        .map_err(|e| with_sources(&e))?;
        let version = resp.version();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let out: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        Ok((version, out["response"]["allowed"].as_bool().unwrap_or(false)))
    }
}

impl Connected {
    /// Posts a review; returns the answer's `connection` header, if any.
    async fn review_connection_header(&mut self) -> Result<Option<String>, String> {
        let req = http::Request::post("https://nodewarden-webhook.nodewarden.svc/review")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(POD_REVIEW)))
            .expect("request");
        let resp = match &mut self.sender {
            Sender::H1(s) => s.send_request(req).await,
            Sender::H2(s) => s.send_request(req).await,
        }
        .map_err(|e| with_sources(&e))?;
        let header = resp
            .headers()
            .get(http::header::CONNECTION)
            .map(|v| v.to_str().unwrap_or_default().to_string());
        let _ = resp.into_body().collect().await;
        Ok(header)
    }

    /// Posts `body` as is; returns the HTTP status.
    async fn post(&mut self, body: Bytes) -> Result<http::StatusCode, String> {
        let req = http::Request::post("https://nodewarden-webhook.nodewarden.svc/review")
            .header("content-type", "application/json")
            .body(Full::new(body))
            .expect("request");
        let resp = match &mut self.sender {
            Sender::H1(s) => s.send_request(req).await,
            Sender::H2(s) => s.send_request(req).await,
        }
        .map_err(|e| with_sources(&e))?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        Ok(status)
    }
}

fn leaf_der(cert: &IssuedCert) -> CertificateDer<'static> {
    rustls_pemfile::certs(&mut cert.cert_pem.as_bytes())
        .next()
        .expect("one")
        .expect("pem")
}

#[tokio::test]
async fn h2_and_http11_are_negotiated_by_alpn_over_tls13_and_tls12() {
    let ca = ca("nodewarden-test-ca");
    let cert = serving(&ca, "a.example");
    let server = start(resolver_with(&cert)).await;

    let mut h2 = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("connect");
    assert_eq!(h2.alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(h2.version, rustls::ProtocolVersion::TLSv1_3);
    assert_eq!(
        h2.review("default").await.expect("review"),
        (http::Version::HTTP_2, true)
    );

    let mut c = Client::new(&ca.cert_pem);
    c.alpn = vec![b"http/1.1".to_vec()];
    c.versions = vec![&rustls::version::TLS12];
    let mut h1 = c.connect(server.addr).await.expect("connect");
    assert_eq!(h1.alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(h1.version, rustls::ProtocolVersion::TLSv1_2);
    // keep-alive: several reviews on one connection
    for _ in 0..3 {
        assert_eq!(
            h1.review("default").await.expect("review"),
            (http::Version::HTTP_11, true)
        );
    }

    // a client that offers no ALPN still gets HTTP/1.1
    let mut c = Client::new(&ca.cert_pem);
    c.alpn = vec![];
    let mut plain = c.connect(server.addr).await.expect("connect");
    assert_eq!(plain.alpn, None);
    assert_eq!(
        plain.review("default").await.expect("review"),
        (http::Version::HTTP_11, true)
    );
    server.stop.cancel();
}

#[tokio::test]
async fn a_client_that_trusts_another_ca_is_refused() {
    let ca1 = ca("one");
    let ca2 = ca("two");
    let server = start(resolver_with(&serving(&ca1, "a.example"))).await;
    let err = Client::new(&ca2.cert_pem)
        .connect(server.addr)
        .await
        .err()
        .expect("must fail");
    assert!(
        err.to_string().contains("UnknownIssuer") || err.to_string().contains("certificate"),
        "{err}"
    );
    server.stop.cancel();
}

/// An error with its sources (hyper's own message alone is only "connection error").
fn with_sources(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Connects and posts one review; the error of whichever step failed.
async fn answer(client: &Client, addr: SocketAddr) -> Result<bool, String> {
    let mut connected = client.connect(addr).await.map_err(|e| e.to_string())?;
    connected.review("default").await.map(|(_, allowed)| allowed)
}

fn client_cert(ca: &Ca, common_name: &str) -> IssuedCert {
    ca.issue_client(common_name, &[], Duration::from_secs(3600))
        .expect("client cert")
}

#[tokio::test]
async fn with_a_client_ca_only_callers_with_its_certificates_get_an_answer() {
    let server_ca = ca("serving");
    let callers = ca("callers");
    let other = ca("other");
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &callers.cert_pem).expect("write");
    let verifier = Arc::new(ClientVerifier::load(ca_file.clone(), vec![]).expect("ca"));
    let resolver = resolver_with(&serving(&server_ca, "a.example"));
    let server = start_authenticating(resolver.clone(), ServerLimits::default(), Some(verifier)).await;

    let apiserver = client_cert(&callers, "kube-apiserver");
    for versions in [vec![&rustls::version::TLS13], vec![&rustls::version::TLS12]] {
        let mut c = Client::new(&server_ca.cert_pem).presenting(&apiserver);
        c.versions = versions.clone();
        assert_eq!(answer(&c, server.addr).await, Ok(true), "{versions:?}");

        let mut c = Client::new(&server_ca.cert_pem);
        c.versions = versions.clone();
        let err = answer(&c, server.addr).await.expect_err("no certificate");
        assert!(
            err.contains("CertificateRequired") || err.contains("HandshakeFailure"),
            "{versions:?}: {err}"
        );

        let mut c = Client::new(&server_ca.cert_pem).presenting(&client_cert(&other, "kube-apiserver"));
        c.versions = versions.clone();
        let err = answer(&c, server.addr).await.expect_err("another CA");
        assert!(
            err.contains("UnknownCA") || err.contains("BadCertificate"),
            "{versions:?}: {err}"
        );
    }
    server.stop.cancel();

    // with names: the common name must be one of them
    let verifier = Arc::new(
        ClientVerifier::load(ca_file, vec!["Kube-APIServer".to_string(), " ".to_string()]).expect("ca"),
    );
    let server = start_authenticating(resolver, ServerLimits::default(), Some(verifier)).await;
    let c = Client::new(&server_ca.cert_pem).presenting(&apiserver);
    assert_eq!(answer(&c, server.addr).await, Ok(true));
    let c = Client::new(&server_ca.cert_pem).presenting(&client_cert(&callers, "someone-else"));
    let err = answer(&c, server.addr).await.expect_err("a name not allowed");
    assert!(err.contains("AccessDenied"), "{err}");
    server.stop.cancel();
}

#[tokio::test]
async fn a_new_client_ca_is_used_without_a_restart_and_a_bad_one_is_ignored() {
    let server_ca = ca("serving");
    let (old, new) = (ca("callers-old"), ca("callers-new"));
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &old.cert_pem).expect("write");
    let verifier = Arc::new(ClientVerifier::load(ca_file.clone(), vec![]).expect("ca"));
    let server = start_authenticating(
        resolver_with(&serving(&server_ca, "a.example")),
        ServerLimits::default(),
        Some(verifier.clone()),
    )
    .await;
    let by_old = Client::new(&server_ca.cert_pem).presenting(&client_cert(&old, "kube-apiserver"));
    let by_new = Client::new(&server_ca.cert_pem).presenting(&client_cert(&new, "kube-apiserver"));
    assert_eq!(answer(&by_old, server.addr).await, Ok(true));
    assert!(answer(&by_new, server.addr).await.is_err());
    assert_eq!(verifier.check(), Reload::Unchanged);

    std::fs::write(&ca_file, &new.cert_pem).expect("write");
    assert_eq!(verifier.check(), Reload::Loaded);
    assert_eq!(answer(&by_new, server.addr).await, Ok(true));
    assert!(answer(&by_old, server.addr).await.is_err());

    std::fs::write(&ca_file, "not a certificate").expect("write");
    assert!(matches!(verifier.check(), Reload::Rejected(why) if why.contains("no PEM certificate")));
    assert_eq!(answer(&by_new, server.addr).await, Ok(true));
    std::fs::remove_file(&ca_file).expect("rm");
    assert!(matches!(verifier.check(), Reload::Rejected(_)));
    assert_eq!(answer(&by_new, server.addr).await, Ok(true));
    // the serving pair's reloader re-reads the CA file too (as the webhook runs it)
    let pair = serving(&server_ca, "a.example");
    std::fs::write(dir.path().join("tls.crt"), &pair.cert_pem).expect("write");
    std::fs::write(dir.path().join("tls.key"), &pair.key_pem).expect("write");
    let reloader = CertReloader::new(
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        Arc::new(CertResolver::default()),
        Arc::new(()),
    )
    .with_client_ca(Some(verifier.clone()));
    std::fs::write(&ca_file, &old.cert_pem).expect("write");
    assert_eq!(reloader.check(), Reload::Loaded, "the serving pair's outcome");
    assert_eq!(answer(&by_old, server.addr).await, Ok(true));
    assert!(answer(&by_new, server.addr).await.is_err());

    // both CAs in one file (a rotation): both callers get an answer
    std::fs::write(&ca_file, format!("{}{}", old.cert_pem, new.cert_pem)).expect("write");
    assert_eq!(verifier.check(), Reload::Loaded);
    assert_eq!(answer(&by_old, server.addr).await, Ok(true));
    assert_eq!(answer(&by_new, server.addr).await, Ok(true));
    server.stop.cancel();
}

/// Lays out files as the kubelet does for a mounted Secret: `..<stamp>/` holds the files,
/// `..data` links to it, `tls.crt`/`tls.key` link through `..data`. A new version is a new
/// stamped folder and an atomic rename of a fresh `..data` link over the old one.
fn kubelet_write(dir: &Path, stamp: &str, cert: &str, key: &str) {
    let versioned = dir.join(format!("..{stamp}"));
    std::fs::create_dir_all(&versioned).expect("mkdir");
    std::fs::write(versioned.join("tls.crt"), cert).expect("write");
    std::fs::write(versioned.join("tls.key"), key).expect("write");
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{stamp}"), &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("atomic swap");
    for name in ["tls.crt", "tls.key"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).expect("symlink");
        }
    }
}

#[tokio::test]
async fn certificates_reload_after_a_kubelet_style_symlink_swap_and_bad_pairs_are_ignored() {
    let dir = tempfile::tempdir().expect("tmp");
    let ca = ca("nodewarden-test-ca");
    let first = serving(&ca, "first.example");
    let second = serving(&ca, "second.example");
    kubelet_write(
        dir.path(),
        "2026_11_21_07_00_00.1",
        &first.cert_pem,
        &first.key_pem,
    );

    let resolver = Arc::new(CertResolver::default());
    let metrics = Arc::new(Metrics::new());
    let reloader = Arc::new(CertReloader::new(
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        resolver.clone(),
        metrics.clone(),
    ));
    assert_eq!(reloader.check(), Reload::Loaded);
    let stop_reload = CancellationToken::new();
    tokio::spawn(
        reloader
            .clone()
            .run(Duration::from_millis(100), stop_reload.clone(), |_| {}),
    );
    let server = start(resolver.clone()).await;
    let client = Client::new(&ca.cert_pem);
    assert_eq!(
        client.connect(server.addr).await.expect("connect").leaf,
        leaf_der(&first)
    );

    kubelet_write(
        dir.path(),
        "2026_11_21_08_00_00.2",
        &second.cert_pem,
        &second.key_pem,
    );
    let mut served = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let leaf = client.connect(server.addr).await.expect("connect").leaf;
        if leaf == leaf_der(&second) {
            served = Some(leaf);
            break;
        }
    }
    assert_eq!(
        served,
        Some(leaf_der(&second)),
        "the new certificate is served without a restart"
    );

    // a broken new pair (key of another certificate, then garbage) is rejected; the last good pair stays
    kubelet_write(
        dir.path(),
        "2026_11_21_09_00_00.3",
        &first.cert_pem,
        &second.key_pem,
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        client.connect(server.addr).await.expect("connect").leaf,
        leaf_der(&second)
    );
    // the last step calls check() itself: stop the background loop so it cannot look first
    stop_reload.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    kubelet_write(
        dir.path(),
        "2026_11_21_09_30_00.4",
        "not a certificate",
        "nor a key",
    );
    assert!(matches!(reloader.check(), Reload::Rejected(m) if m.contains("no PEM certificate")));
    assert_eq!(
        client.connect(server.addr).await.expect("connect").leaf,
        leaf_der(&second)
    );
    let text = metrics.encode();
    assert!(
        text.contains(r#"nodewarden_certificate_reloads_total{result="loaded"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"nodewarden_certificate_reloads_total{result="rejected"} 2"#),
        "{text}"
    );
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_reviews_finish_and_refuses_new_connections() {
    let ca = ca("nodewarden-test-ca");
    let server = start(resolver_with(&serving(&ca, "a.example"))).await;
    let client = Client::new(&ca.cert_pem);
    let mut conn = client.connect(server.addr).await.expect("connect");
    let in_flight = tokio::spawn(async move { conn.review("slow").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.stop.cancel();
    let answer = in_flight.await.expect("join");
    assert_eq!(
        answer,
        Ok((http::Version::HTTP_2, true)),
        "the in-flight review completes"
    );
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("server stops")
        .expect("join");
    assert!(
        client.connect(server.addr).await.is_err(),
        "no new connections after shutdown"
    );
}

/// The retiring phase (the webhook's `--shutdown-delay`, after it turned unready): every request
/// is still answered, but a kept-alive HTTP/1.1 connection ends after its next answer
/// (`Connection: close`) and an HTTP/2 connection gets a GOAWAY, so callers reconnect (to a ready
/// replica, once the endpoint is gone) rather than having a connection closed under a request at
/// the stop. New connections are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retiring_sends_kept_alive_callers_elsewhere_and_still_answers() {
    let ca = ca("nodewarden-test-ca");
    let server = start(resolver_with(&serving(&ca, "a.example"))).await;
    let mut h1 = Client::new(&ca.cert_pem);
    h1.alpn = vec![b"http/1.1".to_vec()];
    let mut h2 = Client::new(&ca.cert_pem);
    h2.alpn = vec![b"h2".to_vec()];
    let mut old_h1 = h1.connect(server.addr).await.expect("connect");
    let mut old_h2 = h2.connect(server.addr).await.expect("connect");
    // before: kept alive, no header
    for _ in 0..2 {
        assert_eq!(old_h1.review_connection_header().await, Ok(None));
    }
    assert!(old_h2.review("default").await.expect("h2 review").1);

    server.retire.cancel();
    // the HTTP/2 connection is told to go away, and closes once it has no stream left
    assert!(
        sender_closed(&old_h2.sender).await,
        "the HTTP/2 connection stayed open while retiring"
    );
    // the kept-alive HTTP/1.1 connection gets its answer, then ends
    assert_eq!(
        old_h1.review_connection_header().await,
        Ok(Some("close".to_string()))
    );
    assert!(
        sender_closed(&old_h1.sender).await,
        "the HTTP/1.1 connection stayed open after Connection: close"
    );
    // new callers are still answered (one request a connection over HTTP/1.1)
    let mut new_h1 = h1.connect(server.addr).await.expect("connect while retiring");
    assert_eq!(
        new_h1.review_connection_header().await,
        Ok(Some("close".to_string()))
    );
    let mut new_h2 = h2.connect(server.addr).await.expect("connect while retiring");
    assert!(
        new_h2
            .review("default")
            .await
            .expect("h2 review while retiring")
            .1
    );

    server.stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), server.task)
        .await
        .expect("server stops")
        .expect("join");
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }
}

/// Waits until the server closes `tcp`, at most 5 s: half the default handshake timeout, so
/// only the short limit set in the test can close it in time.
async fn closed_by_server(tcp: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    read.await.is_ok()
}

/// Waits (at most 20 s) until the server closes the connection behind `sender`.
async fn sender_closed(sender: &Sender) -> bool {
    tokio::time::timeout(Duration::from_secs(20), async {
        while !sender.is_closed() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}

fn short(limits: impl FnOnce(&mut ServerLimits)) -> ServerLimits {
    let mut l = ServerLimits::default();
    limits(&mut l);
    l
}

#[tokio::test]
async fn a_connection_that_never_starts_its_handshake_is_closed() {
    let ca = ca("nodewarden-test-ca");
    let server = start_with(
        resolver_with(&serving(&ca, "a.example")),
        short(|l| l.tls_handshake_timeout = Duration::from_millis(200)),
    )
    .await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    assert!(
        closed_by_server(&mut tcp).await,
        "a silent connection stayed open"
    );
    // the server still serves others
    let mut ok = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("connect");
    assert!(ok.review("default").await.expect("review").1);
}

#[tokio::test]
async fn idle_http11_and_h2_connections_are_closed_and_busy_ones_are_not() {
    let ca = ca("nodewarden-test-ca");
    let server = start_with(
        resolver_with(&serving(&ca, "a.example")),
        short(|l| l.idle_timeout = Duration::from_millis(300)),
    )
    .await;
    for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
        let mut c = Client::new(&ca.cert_pem);
        c.alpn = vec![alpn.to_vec()];
        let mut conn = c.connect(server.addr).await.expect("connect");
        // a review that takes longer than the idle timeout is answered: it is in flight
        assert!(conn.review("slow").await.expect("slow review").1);
        assert!(
            sender_closed(&conn.sender).await,
            "an idle {} connection stayed open",
            String::from_utf8_lossy(alpn)
        );
    }
}

#[tokio::test]
async fn at_the_connection_limit_a_new_connection_waits_for_a_free_slot() {
    let ca = ca("nodewarden-test-ca");
    let server = start_with(
        resolver_with(&serving(&ca, "a.example")),
        short(|l| l.max_connections = 1),
    )
    .await;
    let mut first = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("connect");
    assert!(first.review("default").await.expect("review").1);
    let client = Client::new(&ca.cert_pem);
    let second = client.connect(server.addr);
    tokio::pin!(second);
    // while the first is open, the second is not served (its handshake is not answered)
    assert!(
        tokio::time::timeout(Duration::from_millis(500), second.as_mut())
            .await
            .is_err(),
        "a second connection was served beyond the limit of 1"
    );
    drop(first);
    let mut second = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("served once the first closed")
        .expect("connect");
    assert!(second.review("default").await.expect("review").1);
}

#[tokio::test]
async fn at_the_connection_limit_a_silent_or_idle_connection_makes_room_for_a_new_one() {
    let ca = ca("nodewarden-test-ca");
    let server = start_with(
        resolver_with(&serving(&ca, "a.example")),
        short(|l| l.max_connections = 1),
    )
    .await;
    // a TCP connection that sends nothing holds the only slot
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let mut conn = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("served in its place");
    assert!(conn.review("default").await.expect("review").1);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        closed_by_server(&mut silent).await,
        "the silent connection stayed open"
    );
    // that connection, idle for a second, makes room for the next
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut next = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("served in the idle one's place");
    assert!(next.review("default").await.expect("review").1);
    assert!(
        sender_closed(&conn.sender).await,
        "the idle connection stayed open"
    );
}

/// A TCP connection from 127.0.0.`last`: a client of another address than the tests' clients.
/// On loopback a connection the server resets at once may fail already in `connect`.
async fn connect_from(addr: SocketAddr, last: u8) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, last], 0)))
        .expect("bind");
    socket.connect(addr).await
}

/// How many of `conns` the server closes, in `connect` (reset) or after (each waited for at
/// most 5 s, all at once).
async fn closed_of(conns: &mut [std::io::Result<TcpStream>]) -> usize {
    let closed = futures::future::join_all(conns.iter_mut().map(|conn| async move {
        match conn {
            Ok(tcp) => closed_by_server(tcp).await,
            Err(err) => {
                assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
                true
            }
        }
    }))
    .await;
    closed.into_iter().filter(|c| *c).count()
}

#[tokio::test]
async fn an_address_at_its_share_gets_no_more_while_another_address_is_served() {
    let ca = ca("nodewarden-test-ca");
    let server = start_with(
        resolver_with(&serving(&ca, "a.example")),
        short(|l| {
            l.max_connections = 16;
            l.max_connections_per_source = 2;
        }),
    )
    .await;
    // another address holds a connection (the API server, say)
    let mut api = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("connect");
    assert!(api.review("default").await.expect("review").1);
    // one address opens five silent connections: it keeps two (its share), whichever the
    // server chose; the others are closed, at once or to make room for a newer one
    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(connect_from(server.addr, 2).await);
    }
    assert_eq!(
        closed_of(&mut silent).await,
        3,
        "one address kept more than its share"
    );
    // each closing is counted under its reason (the metric connections_closed_early_total)
    assert_eq!(
        server.closed_early("share-full") + server.closed_early("stalest-at-share"),
        3,
        "{:?}",
        server.closed_early.lock().expect("lock")
    );
    // the other address is still served, on its open connection and on a new one
    assert!(api.review("default").await.expect("review").1);
    let mut new = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("a new connection from the other address");
    assert!(new.review("default").await.expect("review").1);
}

#[tokio::test]
async fn connections_beyond_an_addresss_rate_are_closed_and_another_address_is_served() {
    let ca = ca("nodewarden-test-ca");
    let server = start_with(
        resolver_with(&serving(&ca, "a.example")),
        short(|l| l.max_connection_rate_per_source = 4),
    )
    .await;
    let started = std::time::Instant::now();
    let mut opened = Vec::new();
    for _ in 0..12 {
        opened.push(connect_from(server.addr, 2).await);
    }
    // four at once, then one every 250 ms
    let let_in = 4 + (started.elapsed().as_secs_f64() * 4.0).ceil() as usize;
    let closed = closed_of(&mut opened).await;
    assert!(
        closed >= 12usize.saturating_sub(let_in),
        "{closed} of 12 closed, {let_in} could be let in"
    );
    assert_eq!(
        server.closed_early("over-rate"),
        closed,
        "each refusal is counted"
    );
    // another address has its own bucket
    let mut other = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("another address connects");
    assert!(other.review("default").await.expect("review").1);
}

#[tokio::test]
async fn with_a_client_ca_silent_connections_at_the_limit_make_room_for_the_api_server() {
    let server_ca = ca("serving");
    let callers = ca("callers");
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &callers.cert_pem).expect("write");
    let verifier = Arc::new(ClientVerifier::load(ca_file, vec![]).expect("ca"));
    let server = start_authenticating(
        resolver_with(&serving(&server_ca, "a.example")),
        short(|l| l.max_connections = 4),
        Some(verifier),
    )
    .await;
    // every slot held by a TCP connection that never starts its handshake
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let apiserver = Client::new(&server_ca.cert_pem).presenting(&client_cert(&callers, "kube-apiserver"));
    let started = std::time::Instant::now();
    assert_eq!(answer(&apiserver, server.addr).await, Ok(true));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_connection_whose_answers_cannot_be_sent_is_closed() {
    let ca = ca("nodewarden-test-ca");
    let server = start_with(
        resolver_with(&serving(&ca, "a.example")),
        short(|l| l.write_timeout = Duration::from_millis(300)),
    )
    .await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca.cert_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(SERVER_NAME).expect("name"), tcp)
        .await
        .expect("tls");
    // a receive window of 0: no answer can be sent; h2 answers the server's pings
    let (mut client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tls)
        .await
        .expect("h2");
    let driver = tokio::spawn(conn);
    let mut streams = Vec::new();
    for _ in 0..4 {
        client = client.ready().await.expect("ready");
        let request = http::Request::post("https://nodewarden-webhook.nodewarden.svc/review")
            .body(())
            .expect("request");
        let (response, mut body) = client.send_request(request, false).expect("sent");
        body.send_data(Bytes::from(POD_REVIEW), true).expect("body");
        streams.push(response);
    }
    let started = std::time::Instant::now();
    let _ended_with = tokio::time::timeout(Duration::from_secs(5), driver)
        .await
        .expect("the server closed the connection")
        .expect("driver");
    // closed between one and two write timeouts after the answers were made
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "closed after {:?}",
        started.elapsed()
    );
    // and serves others on
    let mut ok = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("connect");
    assert!(ok.review("default").await.expect("review").1);
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_and_on_h2_the_connection_serves_on() {
    let ca = ca("nodewarden-test-ca");
    let server = start(resolver_with(&serving(&ca, "a.example"))).await;
    // the test server's limit is 1 MiB
    let oversized = Bytes::from(vec![b' '; 7 << 20]);
    let mut c = Client::new(&ca.cert_pem);
    c.alpn = vec![b"h2".to_vec()];
    let mut conn = c.connect(server.addr).await.expect("connect");
    for round in 0..3 {
        match conn.post(oversized.clone()).await {
            Ok(status) => assert_eq!(status, http::StatusCode::PAYLOAD_TOO_LARGE, "round {round}"),
            // the server may reset the stream before the client has read the 413
            Err(e) => eprintln!("round {round}: oversized stream ended with {e}"),
        }
        assert!(
            conn.review("default")
                .await
                .expect("a review after an oversized one")
                .1,
            "round {round}: the next review on the same h2 connection was not allowed"
        );
    }
    // on HTTP/1.1 the 413 closes the connection (the rest of the body is never read)
    let mut c = Client::new(&ca.cert_pem);
    c.alpn = vec![b"http/1.1".to_vec()];
    let mut conn = c.connect(server.addr).await.expect("connect");
    if let Ok(status) = conn.post(oversized).await {
        assert_eq!(status, http::StatusCode::PAYLOAD_TOO_LARGE);
    }
    assert!(
        sender_closed(&conn.sender).await,
        "the HTTP/1.1 connection stayed open after a 413"
    );
    let mut again = Client::new(&ca.cert_pem)
        .connect(server.addr)
        .await
        .expect("connect");
    assert!(again.review("default").await.expect("review").1);
}

/// Waits up to 5 s for the runtime to have no task left alive.
async fn no_task_left() -> bool {
    let metrics = tokio::runtime::Handle::current().metrics();
    for _ in 0..500 {
        if metrics.num_alive_tasks() == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn a_server_stopped_or_dropped_leaves_no_task_behind() {
    let ca = ca("nodewarden-test-ca");
    let resolver = resolver_with(&serving(&ca, "a.example"));

    let server = start(resolver.clone()).await;
    let client = Client::new(&ca.cert_pem);
    let mut conn = client.connect(server.addr).await.expect("connect");
    assert_eq!(conn.review("fast").await, Ok((http::Version::HTTP_2, true)));
    drop(conn);
    server.stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("server stops")
        .expect("join");
    assert!(no_task_left().await, "a task outlived the stopped server");

    // dropped without being asked to stop (its task aborted), e.g. by a select! that ended
    let server = start(resolver).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.task.abort();
    assert!(no_task_left().await, "a task outlived the dropped server");
}
