//! The HTTPS listener: rustls, HTTP/2 and HTTP/1.1 by ALPN, keep-alive, graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a client may take to finish the TLS handshake, and an HTTP/1.1 client to send its headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` over TLS on `listener` until `shutdown` is cancelled; then stops accepting,
/// lets in-flight requests finish for at most `grace`, and returns.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256);
    let builder = Arc::new(builder);
    // connections that are still doing their TLS handshake are not watched by `graceful`
    let handshakes = CancellationToken::new();

    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // e.g. too many open files: back off briefly rather than spin
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let handshakes = handshakes.clone();
        tokio::spawn(async move {
            let tls = tokio::select! {
                _ = handshakes.cancelled() => return,
                r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => r,
            };
            let tls = match tls {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, %err, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = TowerToHyperService::new(app);
            let conn = builder.serve_connection(TokioIo::new(tls), service).into_owned();
            if let Err(err) = watcher.watch(conn).await {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    handshakes.cancel();
    tracing::info!(grace = ?grace, "stopped accepting connections; waiting for in-flight requests");
    match tokio::time::timeout(grace, graceful.shutdown()).await {
        Ok(()) => tracing::info!("all connections closed"),
        Err(_) => tracing::warn!("grace period over; closing the remaining connections"),
    }
}
