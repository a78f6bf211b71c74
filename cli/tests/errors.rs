//! What a user sees when the cluster cannot be used: the real binary, real flags, no cluster.

use std::process::Command;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-nodewarden"));
    cmd.args(args);
    for var in [
        "KUBECONFIG",
        "NODEWARDEN_KUBECONFIG",
        "NODEWARDEN_CONTEXT",
        "NODEWARDEN_OUTPUT",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const KUBECONFIG: &str = r#"apiVersion: v1
kind: Config
clusters:
- name: down
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: someone
  user: {token: not-a-real-token}
contexts:
- name: down
  context: {cluster: down, user: someone}
current-context: down
"#;

#[test]
fn no_cluster_says_so_and_how_to_point_at_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, KUBECONFIG).expect("write");
    let path = path.to_str().expect("utf-8 path");
    let (code, stdout, stderr) = run(&["report", "--kubeconfig", path], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr
            .starts_with("error: cannot reach the cluster while listing daemonsetautoscalers.nodewarden.io"),
        "{stderr}"
    );
    assert!(stderr.contains("--context / --kubeconfig"), "{stderr}");

    // the same through the environment
    let (code, _, stderr) = run(&["report"], &[("NODEWARDEN_KUBECONFIG", path)]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot reach the cluster"), "{stderr}");
    // kubectl's KUBECONFIG, a list of files
    let list = format!("{path}:{path}");
    let (code, _, stderr) = run(&["report"], &[("KUBECONFIG", &list)]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot reach the cluster"), "{stderr}");
    let list = format!("/nonexistent/other:{path}");
    let (code, _, stderr) = run(&["report"], &[("KUBECONFIG", &list)]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.starts_with("error: cannot load the kubeconfig") && stderr.contains("/nonexistent/other"),
        "{stderr}"
    );
}

#[test]
fn bad_flags_and_contexts_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, KUBECONFIG).expect("write");
    let path = path.to_str().expect("utf-8 path");

    let (code, _, stderr) = run(&["report", "--kubeconfig", path, "-o", "toml"], &[]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("invalid value 'toml'") && stderr.contains("table, wide, json, yaml, csv, html"),
        "{stderr}"
    );

    let (code, _, stderr) = run(&["report", "--kubeconfig", path], &[("NODEWARDEN_OUTPUT", "xml")]);
    assert_eq!(code, 2);
    assert!(stderr.contains("invalid value 'xml'"), "{stderr}");

    let (code, _, stderr) = run(&["report", "--kubeconfig", path, "--context", "nope"], &[]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("cannot load the kubeconfig") && stderr.contains("nope"),
        "{stderr}"
    );

    let (code, _, stderr) = run(&["report", "--kubeconfig", "/nonexistent/kubeconfig"], &[]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("cannot load the kubeconfig: /nonexistent/kubeconfig"),
        "{stderr}"
    );
}

#[test]
fn an_end_that_is_not_a_past_time_is_refused_before_any_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, KUBECONFIG).expect("write");
    let path = path.to_str().expect("utf-8 path");
    let report = |end: &str| {
        run(
            &[
                "report",
                "--kubeconfig",
                path,
                "--prometheus",
                "http://127.0.0.1:1",
                "--end",
                end,
            ],
            &[],
        )
    };
    // in the future: said before the cluster (which is down) is read
    let (code, stdout, stderr) = report("2999-01-01T00:00:00Z");
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("--end 2999-01-01T00:00:00Z is in the future"),
        "{stderr}"
    );
    // not a time
    let (code, _, stderr) = report("yesterday");
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("yesterday is not an RFC 3339 time such as 2026-11-28T06:00:00Z"),
        "{stderr}"
    );
    // only with --prometheus
    let (code, _, stderr) = run(
        &["report", "--kubeconfig", path, "--end", "2026-01-01T00:00:00Z"],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--prometheus"), "{stderr}");
}
