//! The admission floor: a TLS + HTTP/2 server that reads each review whole and answers every
//! one with the same fixed answer. Built from what the webhook's server is built from (rustls
//! with ring, hyper-util's HTTP/1.1 + HTTP/2 server by ALPN, Tokio's multi-thread runtime sized
//! to the cores it may use), without anything the webhook does with a review: no decoding, no
//! decision, no patch, no logging, no metrics, no limits, no watches. What a review costs it is
//! what any TLS + HTTP/2 admission server pays before its own work.
//!
//! The benchmark starts it as a process of its own (its own binary, with [`FLAG`]), pinned
//! like the servers it is compared with.

use std::convert::Infallible;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The first argument that makes the benchmark's binary this server.
pub const FLAG: &str = "--admission-floor";

/// Serves until killed: `<binary> --admission-floor CERT KEY PORT ANSWER`, where ANSWER is a
/// file holding the answer to give every review.
pub fn serve(args: &[String]) -> Result<()> {
    let [cert, key, port, answer] = args else {
        bail!("usage: {FLAG} CERT KEY PORT ANSWER");
    };
    let answer = Bytes::from(std::fs::read(answer).with_context(|| format!("reading {answer}"))?);
    let port: u16 = port.parse().with_context(|| format!("port {port}"))?;
    let certs = rustls_pemfile::certs(&mut std::fs::read(cert)?.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .context("reading the certificate")?;
    let key = rustls_pemfile::private_key(&mut std::fs::read(key)?.as_slice())?.context("no private key")?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    // as many workers as the cores this process may run on (one when pinned), as the webhook
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
        loop {
            let (tcp, _) = listener.accept().await?;
            let _ = tcp.set_nodelay(true);
            let (acceptor, builder, answer) = (acceptor.clone(), builder.clone(), answer.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let answer = answer.clone();
                    async move {
                        // the review is read whole, as any admission server must before it answers
                        let _review = req.into_body().collect().await;
                        let mut response = http::Response::new(Full::new(answer));
                        response
                            .headers_mut()
                            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = builder.serve_connection(TokioIo::new(tls), service).await;
            });
        }
    })
}
