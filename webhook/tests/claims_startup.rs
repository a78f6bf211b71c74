//! `run()` when the API server cannot be reached: the webhook keeps serving, stays unready
//! (readiness names the caches), does not exit, and still shuts down cleanly.

use std::time::{Duration, Instant};

use nodewarden_certs::{Ca, CaConfig, ServingSpec};
use nodewarden_webhook::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// A port for the webhook binary to listen on (below the ephemeral range: see the function).
fn free_port() -> u16 {
    nodewarden_runtime::testing::free_port().expect("a free port")
}

async fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_keeps_the_webhook_up_and_unready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::generate(&CaConfig {
        common_name: "startup-test".to_string(),
        validity: Duration::from_secs(3600),
    })
    .expect("ca");
    let cert = ca
        .issue_serving(&ServingSpec {
            dns_names: vec!["localhost".to_string()],
            ip_addresses: vec![],
            validity: Duration::from_secs(3600),
        })
        .expect("serving cert");
    std::fs::write(dir.path().join("tls.crt"), &cert.cert_pem).expect("write cert");
    std::fs::write(dir.path().join("tls.key"), &cert.key_pem).expect("write key");
    // nothing listens on this port
    let dead = free_port();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: down\n  cluster:\n    server: https://127.0.0.1:{dead}\n    \
         insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: not-used\ncontexts:\n- name: down\n  \
         context:\n    cluster: down\n    user: u\n    namespace: nodewarden\ncurrent-context: down\n"
    );
    std::fs::write(dir.path().join("kubeconfig"), kubeconfig).expect("write kubeconfig");

    let (listen, admin) = (free_port(), free_port());
    let config = Config::from_args([
        "nodewarden-webhook".to_string(),
        format!("--listen-addr=127.0.0.1:{listen}"),
        format!("--admin-addr=127.0.0.1:{admin}"),
        format!("--tls-cert-file={}", dir.path().join("tls.crt").display()),
        format!("--tls-key-file={}", dir.path().join("tls.key").display()),
        format!("--kubeconfig={}", dir.path().join("kubeconfig").display()),
        "--claims-initialize-id=true".to_string(),
        "--shutdown-grace=1s".to_string(),
    ])
    .expect("flags");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(nodewarden_webhook::run(config, shutdown.clone()));

    // the admin port answers, and says what is missing
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        match get(admin, "/readyz").await {
            Ok(answer) => break answer,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("admin port never answered: {e}"),
        }
    };
    assert_eq!(first, (503, "not ready: caches\n".to_string()));
    // and keeps saying so while discovery is retried; the process does not give up
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        get(admin, "/readyz").await.expect("readyz"),
        (503, "not ready: caches\n".to_string())
    );
    assert!(
        !task.is_finished(),
        "run() returned while the API server was down"
    );
    assert_eq!(get(admin, "/livez").await.expect("livez").0, 200);

    shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run() stops within 10 s of shutdown")
        .expect("task");
    assert!(ended.is_ok(), "run() failed: {ended:?}");
}
