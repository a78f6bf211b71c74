//! How the agent trusts its kubelet's serving certificate.
//!
//! In order: the CA (`--kubelet-ca-file`, by default the cluster CA of the service account),
//! right where kubelets serve certificates the cluster signs (`serverTLSBootstrap`). Where the
//! CA does not verify it and `--kubelet-serving-cert-file` names the kubelet's own certificate
//! (what a kubelet writes when it signs its own, kubeadm's and kind's default:
//! `<cert-dir>/kubelet.crt`, the certificate followed by the throw-away CA that signed it), that
//! file: its certificates are the only roots, and the name checked is the one the certificate
//! was made for (the node's host name), not the IP the agent dials. So only that node's kubelet
//! is trusted, and no key leaves the node: the agent reads the public certificate alone. Or, on
//! explicit request, nothing is verified (`--kubelet-insecure-skip-verify`).

use std::path::Path;

use nodewarden_api::features::ReadFailure;

use super::GatesArgs;
use super::scrape::{KubeletTrust, PinnedCertificate, ScrapeError, Scraper};

/// Most bytes of a serving-certificate file read (a kubelet's is about 2.5 KiB).
pub const MAX_CERT_FILE_BYTES: u64 = 64 * 1024;

/// Reads a kubelet's serving certificate file (PEM).
pub fn read_serving_certificate(file: &Path) -> Result<PinnedCertificate, String> {
    use std::io::Read;
    let shown = file.display();
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX_CERT_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("reading the kubelet's serving certificate {shown}: {e}"))?;
    if bytes.len() as u64 > MAX_CERT_FILE_BYTES {
        return Err(format!(
            "the kubelet's serving certificate {shown} is larger than {MAX_CERT_FILE_BYTES} bytes; \
             nodewarden reads at most that much"
        ));
    }
    parse_serving_certificate(&bytes, file)
}

/// Parses the PEM text of a kubelet's serving certificate file.
pub fn parse_serving_certificate(pem: &[u8], file: &Path) -> Result<PinnedCertificate, String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let shown = file.display();
    let certificates = rustls_pemfile::certs(&mut &pem[..])
        .map(|c| c.map(|der| der.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{shown}: not a PEM certificate file: {e}"))?;
    let Some(first) = certificates.first() else {
        return Err(format!("{shown}: no certificate in the file"));
    };
    let (_, cert) = X509Certificate::from_der(first)
        .map_err(|e| format!("{shown}: the first certificate cannot be read: {e}"))?;
    let names = cert
        .subject_alternative_name()
        .map_err(|e| format!("{shown}: the certificate's subject alternative names cannot be read: {e}"))?;
    let server_name = names
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .find_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_string()),
            GeneralName::IPAddress(ip) => ip_text(ip),
            _ => None,
        })
        .ok_or_else(|| {
            format!("{shown}: the certificate names no host (no DNS or IP subject alternative name)")
        })?;
    Ok(PinnedCertificate {
        certificates,
        server_name,
        file: file.to_path_buf(),
    })
}

fn ip_text(bytes: &[u8]) -> Option<String> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .ok()
            .map(|b| std::net::Ipv4Addr::from(b).to_string()),
        16 => <[u8; 16]>::try_from(bytes)
            .ok()
            .map(|b| std::net::Ipv6Addr::from(b).to_string()),
        _ => None,
    }
}

/// Reads the kubelet's `/metrics` with the trust above, falling back from the CA to the
/// kubelet's own certificate, and back again when the kubelet's certificate changes.
pub struct KubeletReader {
    args: GatesArgs,
    /// Made on first use, and again while it cannot be (e.g. the token file is not there yet).
    primary: Option<Scraper>,
    /// The kubelet's own certificate, while it is what verifies the kubelet.
    pinned: Option<(Scraper, PinnedCertificate)>,
}

impl KubeletReader {
    /// A reader for the kubelet `args` name; nothing is connected yet.
    pub fn new(args: GatesArgs) -> Self {
        KubeletReader {
            args,
            primary: None,
            pinned: None,
        }
    }

    /// Which trust verified the last successful read: `ca`, `pinned` or `insecure`.
    pub fn trust_in_use(&self) -> &'static str {
        if self.args.kubelet_insecure_skip_verify {
            "insecure"
        } else if self.pinned.is_some() {
            "pinned"
        } else {
            "ca"
        }
    }

    /// The exposition text, or why it could not be read.
    pub async fn scrape(&mut self) -> Result<String, ScrapeError> {
        if let Some((scraper, pinned)) = &self.pinned {
            match scraper.scrape().await {
                Err(e) if e.reason == ReadFailure::CertificateNotVerified => {
                    // the kubelet made a new certificate (or now serves one the cluster signs)
                    tracing::info!(file = %pinned.file.display(), error = %e,
                        "the kubelet no longer serves the certificate in its file; verifying it again from the start");
                    self.pinned = None;
                }
                other => return other,
            }
        }
        if self.primary.is_none() {
            let trust = if self.args.kubelet_insecure_skip_verify {
                KubeletTrust::Insecure
            } else {
                KubeletTrust::Ca(self.args.kubelet_ca_file.clone())
            };
            self.primary = Some(
                Scraper::kubelet(&self.args, &trust)
                    .await
                    .map_err(ScrapeError::from)?,
            );
        }
        let Some(primary) = &self.primary else {
            return Err("no client for the kubelet".into());
        };
        let err = match primary.scrape().await {
            Ok(text) => return Ok(text),
            Err(err) => err,
        };
        let file = match (&err.reason, &self.args.kubelet_serving_cert_file) {
            (ReadFailure::CertificateNotVerified, Some(file)) if !self.args.kubelet_insecure_skip_verify => {
                file.clone()
            }
            _ => return Err(err),
        };
        let ca = self.args.kubelet_ca_file.display().to_string();
        let not_pinned = |why: String| ScrapeError {
            reason: ReadFailure::CertificateNotVerified,
            message: format!(
                "{err} (with the CA {ca}); the kubelet's own certificate does not verify it either: {why}"
            ),
        };
        let pinned = read_serving_certificate(&file).map_err(not_pinned)?;
        let scraper = Scraper::kubelet(&self.args, &KubeletTrust::Pinned(pinned.clone()))
            .await
            .map_err(not_pinned)?;
        let text = scraper.scrape().await.map_err(|e| not_pinned(e.message))?;
        tracing::info!(file = %file.display(), name = %pinned.server_name,
            "the kubelet's serving certificate is its own (the CA does not sign it); verified against that certificate, for this node's kubelet alone");
        self.pinned = Some((scraper, pinned));
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const METRICS: &str = "kubernetes_feature_enabled{name=\"InPlacePodVerticalScaling\",stage=\"\"} 1\n";

    /// A serving certificate made the way a kubelet makes its own: a throw-away CA, and a
    /// certificate for the host name signed by it; the file holds the certificate, then the CA.
    struct KubeletCert {
        file_pem: String,
        key: KeyPair,
        chain: Vec<Vec<u8>>,
    }

    fn kubelet_cert(host: &str) -> KubeletCert {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::default();
        ca.distinguished_name
            .push(DnType::CommonName, format!("{host}-ca@1700000000"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let key = KeyPair::generate().expect("key");
        let mut leaf = CertificateParams::new(vec![host.to_string()]).expect("params");
        leaf.distinguished_name
            .push(DnType::CommonName, format!("{host}@1700000000"));
        let issuer = Issuer::from_params(&ca, &ca_key);
        let cert = leaf.signed_by(&key, &issuer).expect("certificate");
        KubeletCert {
            file_pem: format!("{}{}", cert.pem(), ca_cert.pem()),
            key,
            chain: vec![cert.der().to_vec(), ca_cert.der().to_vec()],
        }
    }

    /// A kubelet stand-in on 127.0.0.1: HTTPS with `cert`, answers every request with METRICS.
    async fn kubelet(cert: &KubeletCert) -> u16 {
        let chain = cert
            .chain
            .iter()
            .map(|d| rustls::pki_types::CertificateDer::from(d.clone()))
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::try_from(cert.key.serialize_der()).expect("key der");
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{METRICS}",
                        METRICS.len()
                    );
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        port
    }

    fn args(dir: &Path, port: u16, ca: &str, pinned: Option<&str>, insecure: bool) -> GatesArgs {
        let token = dir.join("token");
        std::fs::write(&token, "a-token").expect("token file");
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, ca).expect("ca file");
        let pinned = pinned.map(|pem| {
            let file = dir.join("kubelet.crt");
            std::fs::write(&file, pem).expect("kubelet.crt");
            file
        });
        GatesArgs {
            kubelet_url: Some(format!("https://127.0.0.1:{port}")),
            node_ip: None,
            kubelet_ca_file: ca_file,
            kubelet_serving_cert_file: pinned,
            kubelet_insecure_skip_verify: insecure,
            kubelet_token_file: token,
            kube_proxy_metrics_url: None,
            gates_interval: Duration::from_secs(1),
            gates_refresh_interval: Duration::from_secs(60),
            gates: true,
        }
    }

    /// PEM of a CA that signs nothing the kubelet serves (the cluster CA, in these tests).
    fn cluster_ca() -> String {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "cluster-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.self_signed(&key).expect("CA").pem()
    }

    #[test]
    fn the_name_checked_is_the_one_the_kubelet_made_its_certificate_for() {
        let cert = kubelet_cert("node-a");
        let pinned =
            parse_serving_certificate(cert.file_pem.as_bytes(), Path::new("kubelet.crt")).expect("parses");
        assert_eq!(pinned.server_name, "node-a");
        assert_eq!(pinned.certificates, cert.chain, "the certificate, then its CA");
    }

    #[test]
    fn a_file_that_is_no_certificate_is_a_clear_error() {
        let file = Path::new("/x/kubelet.crt");
        let err = parse_serving_certificate(b"", file).expect_err("empty");
        assert_eq!(err, "/x/kubelet.crt: no certificate in the file");
        let err = parse_serving_certificate(
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            file,
        )
        .expect_err("not DER");
        assert!(err.contains("the first certificate cannot be read"), "{err}");
        let dir = tempfile::tempdir().expect("dir");
        let big = dir.path().join("big.crt");
        std::fs::write(&big, vec![b'a'; MAX_CERT_FILE_BYTES as usize + 1]).expect("write");
        let err = read_serving_certificate(&big).expect_err("too large");
        assert!(err.contains("larger than 65536 bytes"), "{err}");
        let err = read_serving_certificate(&dir.path().join("missing.crt")).expect_err("missing");
        assert!(err.contains("reading the kubelet's serving certificate"), "{err}");
    }

    #[tokio::test]
    async fn a_self_signed_kubelet_is_read_with_its_own_certificate_where_the_ca_fails() {
        let dir = tempfile::tempdir().expect("dir");
        let cert = kubelet_cert("node-a");
        let port = kubelet(&cert).await;

        // the cluster CA alone: not verified, and said so
        let mut reader = KubeletReader::new(args(dir.path(), port, &cluster_ca(), None, false));
        let err = reader
            .scrape()
            .await
            .expect_err("the cluster CA does not sign it");
        assert_eq!(err.reason, ReadFailure::CertificateNotVerified, "{err}");

        // with the kubelet's own certificate file: read, and it stays the trust in use
        let mut reader =
            KubeletReader::new(args(dir.path(), port, &cluster_ca(), Some(&cert.file_pem), false));
        assert_eq!(
            reader.scrape().await.expect("verified by its own certificate"),
            METRICS
        );
        assert_eq!(reader.trust_in_use(), "pinned");
        assert_eq!(reader.scrape().await.expect("again"), METRICS);

        // another node's certificate does not verify this kubelet
        let other = kubelet_cert("node-a");
        let mut reader = KubeletReader::new(args(
            dir.path(),
            port,
            &cluster_ca(),
            Some(&other.file_pem),
            false,
        ));
        let err = reader.scrape().await.expect_err("another kubelet's certificate");
        assert_eq!(err.reason, ReadFailure::CertificateNotVerified);
        assert!(err.message.contains("does not verify it either"), "{err}");

        // a CA that signs it for the address dialled is used first (the kubelet's own CA here;
        // a cluster CA under serverTLSBootstrap)
        let by_ip = kubelet_cert("127.0.0.1");
        let port = kubelet(&by_ip).await;
        let ca_pem = by_ip
            .file_pem
            .split_inclusive("-----END CERTIFICATE-----\n")
            .nth(1)
            .expect("CA");
        let mut reader = KubeletReader::new(args(dir.path(), port, ca_pem, Some(&cert.file_pem), false));
        assert_eq!(reader.scrape().await.expect("verified by the CA"), METRICS);
        assert_eq!(reader.trust_in_use(), "ca");
    }

    #[tokio::test]
    async fn a_kubelet_that_makes_a_new_certificate_is_verified_again() {
        let dir = tempfile::tempdir().expect("dir");
        let old = kubelet_cert("node-a");
        let port = kubelet(&old).await;
        let mut a = args(dir.path(), port, &cluster_ca(), Some(&old.file_pem), false);
        let mut reader = KubeletReader::new(a.clone());
        reader.scrape().await.expect("the old certificate");
        // the kubelet restarts with a new certificate on another port; its file is rewritten
        let new = kubelet_cert("node-a");
        let new_port = kubelet(&new).await;
        std::fs::write(a.kubelet_serving_cert_file.as_ref().expect("file"), &new.file_pem).expect("rewrite");
        a.kubelet_url = Some(format!("https://127.0.0.1:{new_port}"));
        reader.args = a;
        reader.primary = None;
        let pinned = reader.pinned.take().expect("pinned");
        let stale = Scraper::kubelet(&reader.args, &KubeletTrust::Pinned(pinned.1.clone()))
            .await
            .expect("scraper");
        reader.pinned = Some((stale, pinned.1));
        assert_eq!(
            reader.scrape().await.expect("the new certificate is read"),
            METRICS
        );
        assert_eq!(reader.trust_in_use(), "pinned");
    }

    /// Runs in a child process without any system trust store (as in the agent's image, which
    /// has none): with verification off the kubelet is still read. Before, the client looked for
    /// the system's certificates anyway and failed: "No CA certificates were loaded from the system".
    #[tokio::test]
    async fn insecure_needs_no_system_trust_store() {
        if std::env::var_os("NODEWARDEN_TEST_NO_TRUST_STORE").is_none() {
            let exe = std::env::current_exe().expect("test binary");
            let out = std::process::Command::new(exe)
                .args([
                    "--exact",
                    "features::trust::tests::insecure_needs_no_system_trust_store",
                    "--nocapture",
                ])
                .env("NODEWARDEN_TEST_NO_TRUST_STORE", "1")
                .env("SSL_CERT_FILE", "/nonexistent/ca-certificates.crt")
                .env("SSL_CERT_DIR", "/nonexistent/certs")
                .output()
                .expect("child test");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        let dir = tempfile::tempdir().expect("dir");
        let cert = kubelet_cert("node-a");
        let port = kubelet(&cert).await;
        let mut reader = KubeletReader::new(args(dir.path(), port, "", None, true));
        assert_eq!(reader.scrape().await.expect("read without verification"), METRICS);
        assert_eq!(reader.trust_in_use(), "insecure");
    }
}
