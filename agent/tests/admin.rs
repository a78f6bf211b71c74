//! The admin port in-process: /livez, /readyz following the caches, /metrics in OpenMetrics.

use nodewarden_agent::READY_CACHES;
use nodewarden_agent::metrics::Metrics;
use nodewarden_runtime::admin::{self, Readiness};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect to the admin port");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

#[tokio::test]
async fn readiness_follows_the_caches_and_metrics_are_openmetrics() {
    let ready = Arc::new(Readiness::default());
    ready.require(READY_CACHES);
    let metrics = Arc::new(Metrics::new());
    metrics.unreadable_container();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let encoded = metrics.clone();
    let app = admin::router(ready.clone(), Arc::new(move || encoded.encode()));
    tokio::spawn(async move { axum::serve(listener, app).await });

    assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
    let not_ready = get(addr, "/readyz").await;
    assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
    assert!(not_ready.contains("caches not synced"), "{not_ready}");
    ready.set(READY_CACHES, true);
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));

    let m = get(addr, "/metrics").await;
    assert!(m.contains("application/openmetrics-text"), "{m}");
    assert!(
        m.contains(&format!(
            "nodewarden_agent_build_info{{version=\"{}\",program=\"nodewarden-agent\",arch=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::ARCH
        )),
        "{m}"
    );
    assert!(
        m.contains("nodewarden_agent_unreadable_containers_total 1"),
        "{m}"
    );
    assert!(
        m.contains("nodewarden_agent_recommendation_writes_total 0"),
        "{m}"
    );
    // the process's own metrics, unprefixed, after the agent's (one `# EOF`, at the end)
    for name in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_start_time_seconds ",
    ] {
        assert!(m.contains(&format!("\n{name}")), "{name}: {m}");
    }
    assert_eq!(m.matches("# EOF").count(), 1, "{m}");
    assert!(m.trim_end().ends_with("# EOF"), "{m}");
}
