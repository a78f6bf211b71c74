//! The `nodewarden-webhook` binary as an operator runs it: configured by environment variables,
//! `--help` documenting every flag, live but not ready while the API server cannot be reached,
//! and a clean exit on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nodewarden_certs::{Ca, CaConfig, ServingSpec};

/// A port for the webhook binary to listen on (below the ephemeral range: see the function).
fn free_port() -> u16 {
    nodewarden_runtime::testing::free_port().expect("a free port")
}

const BIN: &str = env!("CARGO_BIN_EXE_nodewarden-webhook");

/// Status line and body of a plain-HTTP GET.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    Some((
        status,
        answer.split("\r\n\r\n").nth(1).unwrap_or_default().to_string(),
    ))
}

#[test]
fn help_names_the_environment_variable_of_every_flag() {
    let out = Command::new(BIN).arg("--help").output().expect("runs");
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).expect("utf8");
    let flags: Vec<&str> = help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("--") && !l.starts_with("--help") && !l.starts_with("--version"))
        .collect();
    assert!(flags.len() > 20, "{help}");
    // clap prints `[env: NAME=]` in each flag's description, which may wrap onto later lines
    let env_count = help.matches("[env: NODEWARDEN_").count();
    assert_eq!(
        env_count,
        flags.len(),
        "every flag reads an environment variable:\n{help}"
    );
}

#[test]
fn by_hand_outside_a_cluster_it_listens_on_loopback_and_in_a_pod_everywhere() {
    let help = |in_pod: bool| {
        let mut command = Command::new(BIN);
        command
            .arg("--help")
            .env_remove("NODEWARDEN_LISTEN_ADDR")
            .env_remove("NODEWARDEN_ADMIN_ADDR");
        if in_pod {
            command.env("KUBERNETES_SERVICE_HOST", "10.96.0.1");
        } else {
            command.env_remove("KUBERNETES_SERVICE_HOST");
        }
        let out = command.output().expect("runs");
        assert!(out.status.success());
        String::from_utf8(out.stdout).expect("utf8")
    };
    let by_hand = help(false);
    assert!(
        by_hand.contains("[default: 127.0.0.1:8443]") && by_hand.contains("[default: 127.0.0.1:8080]"),
        "{by_hand}"
    );
    let in_pod = help(true);
    assert!(
        in_pod.contains("[default: 0.0.0.0:8443]") && in_pod.contains("[default: 0.0.0.0:8080]"),
        "{in_pod}"
    );
}

#[test]
fn a_bad_flag_is_a_clear_usage_error() {
    let out = Command::new(BIN)
        .env("NODEWARDEN_LISTEN_ADDR", "not-an-address")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--listen-addr") && err.contains("not-an-address"),
        "{err}"
    );

    let out = Command::new(BIN)
        .args([
            "--cert-mode",
            "managed",
            "--cert-validity",
            "9000h",
            "--cert-ca-validity",
            "100h",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot outlive its CA"), "{err}");
}

#[test]
fn live_but_not_ready_without_an_api_server_and_a_clean_exit_on_sigterm() {
    let dir = tempfile::tempdir().expect("tmp");
    let ca = Ca::generate(&CaConfig {
        common_name: "t".into(),
        validity: Duration::from_secs(600),
    })
    .expect("ca");
    let cert = ca
        .issue_serving(&ServingSpec {
            dns_names: vec!["localhost".into()],
            ip_addresses: vec![],
            validity: Duration::from_secs(600),
        })
        .expect("cert");
    std::fs::write(dir.path().join("tls.crt"), &cert.cert_pem).expect("write");
    std::fs::write(dir.path().join("tls.key"), &cert.key_pem).expect("write");
    // a kubeconfig naming an API server that is not there
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            free_port()
        ),
    )
    .expect("write");
    let (listen, admin) = (free_port(), free_port());
    let mut child = Command::new(BIN)
        .env("NODEWARDEN_LISTEN_ADDR", format!("127.0.0.1:{listen}"))
        .env("NODEWARDEN_ADMIN_ADDR", format!("127.0.0.1:{admin}"))
        .env("NODEWARDEN_TLS_CERT_FILE", dir.path().join("tls.crt"))
        .env("NODEWARDEN_TLS_KEY_FILE", dir.path().join("tls.key"))
        .env("NODEWARDEN_KUBECONFIG", &kubeconfig)
        .env("NODEWARDEN_POD_NAMESPACE", "nodewarden")
        .env("NODEWARDEN_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut live = None;
    while Instant::now() < deadline && live.is_none() {
        live = get(admin, "/livez");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(live.map(|l| l.0), Some(200), "live");
    let (status, body) = get(admin, "/readyz").expect("readyz answers");
    assert_eq!(status, 503);
    assert!(
        body.contains("caches") && !body.contains("certificates"),
        "certificates loaded, caches not: {body}"
    );
    let metrics = get(admin, "/metrics").expect("metrics").1;
    assert!(
        metrics.contains("nodewarden_certificate_reloads_total{result=\"loaded\"} 1"),
        "{metrics}"
    );
    // what a dashboard and the expiry alert read: the version, and when the served leaf expires
    assert!(
        metrics.contains(&format!(
            "nodewarden_build_info{{version=\"{}\",program=\"nodewarden-webhook\",arch=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::ARCH
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "nodewarden_serving_certificate_expiration_timestamp_seconds{{}} {}\n",
            cert.not_after.unix_timestamp()
        )),
        "{metrics}"
    );
    // the process's own figures (unprefixed, after the webhook's): this binary's memory and start
    let sample = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let rss = sample("process_resident_memory_bytes");
    assert!((1048576.0..1073741824.0).contains(&rss), "resident {rss}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let start = sample("process_start_time_seconds");
    assert!(
        now - start < 60.0 && start < now + 1.0,
        "started {start}, now {now}"
    );
    assert!(sample("process_open_fds") >= 3.0);

    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "still running 15 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().expect("piped"), &mut stderr).expect("read");
    assert!(status.success(), "exit {status}\n{stderr}");
    // JSON logs, one object a line
    let first = stderr.lines().next().expect("logged something");
    let parsed: serde_json::Value = serde_json::from_str(first).expect("JSON log line");
    assert!(
        parsed.get("level").is_some() && parsed.get("timestamp").is_some(),
        "{first}"
    );
    assert!(
        stderr.contains("SIGTERM received") && stderr.contains("nodewarden-webhook stopped"),
        "{stderr}"
    );
}

#[test]
fn a_missing_client_ca_file_stops_the_start_and_crds_apply_names_its_kubeconfig() {
    let port = free_port();
    let out = Command::new(BIN)
        .args([
            "--client-ca-file=/nonexistent/client-ca.crt",
            &format!("--listen-addr=127.0.0.1:{port}"),
            &format!("--admin-addr=127.0.0.1:{}", free_port()),
            "--log-format=text",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("/nonexistent/client-ca.crt"), "{all}");

    let out = Command::new(BIN)
        .args([
            "--kubeconfig=/nonexistent/kubeconfig",
            "--log-format=text",
            "crds",
            "apply",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("/nonexistent/kubeconfig"), "{all}");
}
