//! The `nodewarden-certs` binary, run as a user would.
#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use common::{WEBHOOK_NAME, handshake};
use nodewarden_certs::parse_certificate_info;

/// The binary with none of its variables inherited from the test's environment.
fn cli() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodewarden-certs"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("NODEWARDEN_CERTS_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read(dir: &Path, name: &str) -> String {
    fs::read_to_string(dir.join(name)).unwrap()
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn generate_writes_working_files_into_a_new_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("nested").join("certs");
    let out = run(cli()
        .args([
            "generate",
            "--service",
            "nodewarden-webhook",
            "--namespace",
            "nodewarden",
        ])
        .arg("--out-dir")
        .arg(&out_dir)
        .args(["--dns-name", "webhook.example.com", "--ip-address", "127.0.0.1"])
        .args(["--cert-validity", "30d", "--ca-validity", "90d"]));
    assert!(out.status.success(), "{}", stderr(&out));

    let mut files: Vec<String> = fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["ca.crt", "tls.crt", "tls.key"],
        "no temporary files left, no ca.key by default"
    );
    #[cfg(unix)]
    {
        assert_eq!(mode(&out_dir.join("tls.key")), 0o600);
        assert_eq!(
            mode(&out_dir.join("tls.crt")) & 0o077,
            mode(&out_dir.join("ca.crt")) & 0o077
        );
    }

    let ca = parse_certificate_info(&read(&out_dir, "ca.crt")).unwrap();
    assert!(ca.is_ca);
    assert_eq!(ca.common_name.as_deref(), Some("nodewarden-ca"));
    let tls = parse_certificate_info(&read(&out_dir, "tls.crt")).unwrap();
    assert_eq!(
        tls.dns_names,
        [
            "nodewarden-webhook",
            "nodewarden-webhook.nodewarden",
            "nodewarden-webhook.nodewarden.svc",
            "nodewarden-webhook.nodewarden.svc.cluster.local",
            "webhook.example.com"
        ]
    );
    assert_eq!(
        tls.ip_addresses,
        ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    let days = (tls.not_after - tls.not_before).whole_days();
    assert_eq!(days, 30, "30d plus the clock-skew allowance");
    let days = (ca.not_after - ca.not_before).whole_days();
    assert_eq!(days, 90);

    handshake(
        &read(&out_dir, "tls.crt"),
        &read(&out_dir, "tls.key"),
        &read(&out_dir, "ca.crt"),
        WEBHOOK_NAME,
        None,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn flags_come_from_the_environment_and_an_existing_ca_is_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    let out = run(cli()
        .arg("generate")
        .env("NODEWARDEN_CERTS_SERVICE", "nodewarden-webhook")
        .env("NODEWARDEN_CERTS_NAMESPACE", "nodewarden")
        .env("NODEWARDEN_CERTS_OUT_DIR", &first)
        .env("NODEWARDEN_CERTS_DNS_NAMES", "a.example.com,b.example.com")
        .env("NODEWARDEN_CERTS_CA_COMMON_NAME", "env-ca")
        .env("NODEWARDEN_CERTS_WRITE_CA_KEY", "true"));
    assert!(out.status.success(), "{}", stderr(&out));
    #[cfg(unix)]
    assert_eq!(mode(&first.join("ca.key")), 0o600);
    let tls = parse_certificate_info(&read(&first, "tls.crt")).unwrap();
    assert!(tls.dns_names.contains(&"b.example.com".to_owned()), "{tls:?}");
    assert_eq!(tls.issuer, "CN=env-ca");

    let second = tmp.path().join("second");
    let out = run(cli()
        .args(["generate", "--service", "other", "--namespace", "nodewarden"])
        .arg("--out-dir")
        .arg(&second)
        .arg("--ca-cert")
        .arg(first.join("ca.crt"))
        .arg("--ca-key")
        .arg(first.join("ca.key")));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(read(&second, "ca.crt"), read(&first, "ca.crt"), "same CA");
    assert!(!second.join("ca.key").exists());
    handshake(
        &read(&second, "tls.crt"),
        &read(&second, "tls.key"),
        &read(&first, "ca.crt"),
        "other.nodewarden.svc",
        None,
    )
    .await
    .unwrap();
}

#[test]
fn check_reports_and_exits_1_when_renewal_is_due() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(cli()
        .args([
            "generate",
            "--service",
            "wh",
            "--namespace",
            "ns",
            "--cert-validity",
            "10d",
        ])
        .arg("--out-dir")
        .arg(tmp.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let cert = tmp.path().join("tls.crt");

    let out = run(cli()
        .arg("check")
        .arg("--cert")
        .arg(&cert)
        .args(["--renew-before", "5d"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    for expected in [
        "CN=wh",
        "wh.ns.svc.cluster.local",
        "not after:",
        "renewal due:  no",
    ] {
        assert!(text.contains(expected), "{expected:?} missing in:\n{text}");
    }

    let out = run(cli()
        .arg("check")
        .env("NODEWARDEN_CERTS_CERT", &cert)
        .env("NODEWARDEN_CERTS_RENEW_BEFORE", "240h"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .contains("renewal due:  yes")
    );
}

#[test]
fn bad_input_gives_a_clear_error_and_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let base = [
        "generate",
        "--service",
        "wh",
        "--namespace",
        "ns",
        "--out-dir",
        dir,
    ];

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--cert-validity", "banana"], "--cert-validity"),
        (
            vec!["--ca-validity", "10 fortnights"],
            "unknown time unit \"fortnights\"",
        ),
        (vec!["--ip-address", "300.1.1.1"], "--ip-address"),
        (vec!["--dns-name", "bad_name"], "\"bad_name\""),
        (vec!["--no-such-flag"], "--no-such-flag"),
        (vec!["--ca-cert", "/nonexistent/ca.crt"], "--ca-key"),
        (
            vec![
                "--ca-cert",
                "/nonexistent/ca.crt",
                "--ca-key",
                "/nonexistent/ca.key",
            ],
            "cannot read --ca-cert file /nonexistent/ca.crt",
        ),
        (vec!["--cert-validity", "0s"], "between 1 second and 100 years"),
    ];
    for (extra, says) in cases {
        let out = run(cli().args(base).args(&extra));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: expected {says:?} in: {err}");
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
    }

    let out = run(cli().args([
        "generate",
        "--service",
        "a.b",
        "--namespace",
        "ns",
        "--out-dir",
        dir,
    ]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("single DNS label"), "{}", stderr(&out));

    let out = run(cli().args(["generate", "--namespace", "ns", "--out-dir", dir]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--service"), "{}", stderr(&out));

    let garbage = tmp.path().join("garbage.crt");
    fs::write(&garbage, "hello").unwrap();
    let out = run(cli().arg("check").arg("--cert").arg(&garbage));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("BEGIN CERTIFICATE"), "{}", stderr(&out));

    // Nothing was written by the failed runs.
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1, "only garbage.crt");
}

#[test]
fn help_documents_every_variable() {
    let out = run(cli().args(["generate", "--help"]));
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for var in [
        "NODEWARDEN_CERTS_SERVICE",
        "NODEWARDEN_CERTS_NAMESPACE",
        "NODEWARDEN_CERTS_OUT_DIR",
        "NODEWARDEN_CERTS_DNS_NAMES",
        "NODEWARDEN_CERTS_IP_ADDRESSES",
        "NODEWARDEN_CERTS_CA_VALIDITY",
        "NODEWARDEN_CERTS_CA_COMMON_NAME",
        "NODEWARDEN_CERTS_CERT_VALIDITY",
        "NODEWARDEN_CERTS_CA_CERT",
        "NODEWARDEN_CERTS_CA_KEY",
        "NODEWARDEN_CERTS_WRITE_CA_KEY",
    ] {
        assert!(help.contains(var), "{var} missing in:\n{help}");
    }
    let out = run(cli().args(["check", "--help"]));
    let help = String::from_utf8(out.stdout).unwrap();
    for var in [
        "NODEWARDEN_CERTS_CERT",
        "NODEWARDEN_CERTS_RENEW_BEFORE",
        "Exit status",
    ] {
        assert!(help.contains(var), "{var} missing in:\n{help}");
    }
}
