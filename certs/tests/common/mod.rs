//! Shared helpers: a real TLS connection between a tokio-rustls server and client on 127.0.0.1.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub const WEBHOOK_NAME: &str = "nodewarden-webhook.nodewarden.svc";

/// A client certificate the client presents, and the CA bundle the server trusts for client certificates.
pub struct ClientAuth<'a> {
    pub cert_pem: &'a str,
    pub key_pem: &'a str,
    pub server_trusts_pem: &'a str,
}

fn certs(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

fn roots(pem: &str) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in certs(pem) {
        roots.add(cert).unwrap();
    }
    roots
}

/// Serves `server_cert_pem`/`server_key_pem`, connects with a client that trusts only `client_trusts_pem`
/// and asks for `server_name` (DNS name or IP), exchanges one message each way.
///
/// `Ok` only when both sides completed the handshake and the exchange; otherwise the errors of both sides.
pub async fn handshake(
    server_cert_pem: &str,
    server_key_pem: &str,
    client_trusts_pem: &str,
    server_name: &str,
    client_auth: Option<ClientAuth<'_>>,
) -> Result<(), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());

    let server_builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let server_builder = match &client_auth {
        Some(auth) => server_builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(auth.server_trusts_pem)),
                provider.clone(),
            )
            .build()
            .unwrap(),
        ),
        None => server_builder.with_no_client_auth(),
    };
    let server_config = server_builder
        .with_single_cert(
            certs(server_cert_pem),
            PrivateKeyDer::from_pem_slice(server_key_pem.as_bytes()).unwrap(),
        )
        .map_err(|e| format!("server config: {e}"))?;
    let acceptor = TlsAcceptor::from(Arc::new(server_config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();

    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.map_err(|e| format!("accept: {e}"))?;
        let mut tls = acceptor
            .accept(tcp)
            .await
            .map_err(|e| format!("server handshake: {e}"))?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf)
            .await
            .map_err(|e| format!("server read: {e}"))?;
        if &buf != b"ping" {
            return Err(format!("server got {buf:?}"));
        }
        tls.write_all(b"pong")
            .await
            .map_err(|e| format!("server write: {e}"))?;
        tls.shutdown()
            .await
            .map_err(|e| format!("server shutdown: {e}"))?;
        Ok::<(), String>(())
    });

    let client_builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(client_trusts_pem));
    let client_config = match &client_auth {
        Some(auth) => client_builder
            .with_client_auth_cert(
                certs(auth.cert_pem),
                PrivateKeyDer::from_pem_slice(auth.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => client_builder.with_no_client_auth(),
    };
    let connector = TlsConnector::from(Arc::new(client_config));
    let name = ServerName::try_from(server_name.to_owned()).unwrap();

    let client = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("client handshake: {e}"))?;
        tls.write_all(b"ping")
            .await
            .map_err(|e| format!("client write: {e}"))?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf)
            .await
            .map_err(|e| format!("client read: {e}"))?;
        if &buf != b"pong" {
            return Err(format!("client got {buf:?}"));
        }
        Ok::<(), String>(())
    };
    let client_result = tokio::time::timeout(Duration::from_secs(10), client)
        .await
        .unwrap_or_else(|_| Err("client timed out".to_owned()));
    let server_result = match tokio::time::timeout(Duration::from_secs(10), server).await {
        Ok(joined) => joined.unwrap(),
        Err(_) => Err("server timed out".to_owned()),
    };
    match (client_result, server_result) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(c), Ok(())) => Err(c),
        (Ok(()), Err(s)) => Err(s),
        (Err(c), Err(s)) => Err(format!("{c}; {s}")),
    }
}
