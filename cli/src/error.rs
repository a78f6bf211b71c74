//! What can go wrong, each with what to do about it.

/// An error of `kubectl nodewarden`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "cannot load the kubeconfig: {0}; pass --kubeconfig <file> (or set KUBECONFIG) and --context <name>"
    )]
    /// No client could be built from the kubeconfig (or the in-cluster config); why.
    Config(String),
    #[error(
        "cannot reach the cluster while listing {what}: {message}; check that the cluster is up and that \
         --context / --kubeconfig point at it"
    )]
    /// The request failed before the API server answered (connection, TLS, timeout).
    Unreachable {
        /// What was being listed, e.g. `daemonsets.apps`.
        what: String,
        /// The client's error.
        message: String,
    },
    #[error(
        "the nodewarden CRDs are not installed in this cluster ({what} is not served); install the nodewarden \
         chart first"
    )]
    /// A nodewarden resource is not served (HTTP 404): the CRDs are not installed.
    MissingCrds {
        /// The resource that is not served, e.g. `noderecommendations.nodewarden.io`.
        what: String,
    },
    #[error(
        "permission denied listing {what}: {message}; the report needs list on daemonsetautoscalers and \
         noderecommendations (nodewarden.io), get on daemonsets (apps) and list on pods"
    )]
    /// The API server refused the credentials (HTTP 401 or 403).
    Forbidden {
        /// What was being listed.
        what: String,
        /// The API server's message.
        message: String,
    },
    #[error("the API server refused to list {what} (HTTP {code}): {message}")]
    /// Any other error status from the API server.
    Api {
        /// What was being listed.
        what: String,
        /// The HTTP status code.
        code: u16,
        /// The API server's message.
        message: String,
    },
    #[error("{}", no_daemonset(name, namespace.as_deref()))]
    /// A DaemonSet named with `--daemonset` does not exist.
    NoDaemonSet {
        /// Its name.
        name: String,
        /// The namespace read (none: every namespace).
        namespace: Option<String>,
    },
    #[error("{0}")]
    /// Prometheus could not give the history (`--prometheus`): unreachable, refused, a limit, a
    /// missing series; the message says which and what to do.
    Prometheus(#[from] nodewarden_history::Error),
    #[error("{0}")]
    /// Flags that parse but do not go together (e.g. an `--end` after now).
    Usage(String),
    #[error("cannot write the report: {0}")]
    /// The report could not be written to the output; the I/O error.
    Output(String),
}

impl Error {
    /// The process exit code: 2 for configuration and access problems, 1 for the rest.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Output(_) | Error::Api { .. } => 1,
            _ => 2,
        }
    }
}

fn no_daemonset(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("DaemonSet {ns}/{name} does not exist (-A for every namespace)"),
        None => format!("no DaemonSet {name} in any namespace"),
    }
}

/// Sorts a client error into what the user should do.
pub fn classify(what: &str, err: kube::Error) -> Error {
    let what = what.to_string();
    match err {
        kube::Error::Api(status) => match status.code {
            404 if what.ends_with("nodewarden.io") => Error::MissingCrds { what },
            401 | 403 => Error::Forbidden {
                what,
                message: status.message.clone(),
            },
            code => Error::Api {
                what,
                code,
                message: status.message.clone(),
            },
        },
        other => Error::Unreachable {
            what,
            message: nodewarden_history::error_chain(&other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "message": message, "reason": "x"
        }))
        .expect("status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn errors_say_what_to_do() {
        let cases = [
            (
                404,
                "daemonsetautoscalers.nodewarden.io",
                "CRDs are not installed",
            ),
            (404, "daemonsets.apps", "HTTP 404"),
            (
                403,
                "pods",
                "permission denied listing pods: no; the report needs",
            ),
            (401, "pods", "permission denied"),
            (500, "pods", "refused to list pods (HTTP 500): no"),
        ];
        for (code, what, want) in cases {
            let got = classify(what, api_error(code, "no")).to_string();
            assert!(got.contains(want), "{code} {what}: {got}");
        }
    }
}
