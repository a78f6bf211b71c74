//! The feature-gate metrics text a kubelet or kube-proxy serves (`kubernetes_feature_enabled`),
//! read by the agent: `features::parse` and the component report built from it.
//!
//! Invariants: gates come out sorted by name, one per name, none unnamed, with a stage; the
//! report of a text that parses has its gates and no error, otherwise an error and no gates.
#![no_main]

use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use nodewarden_agent::features::{component, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse(text);
    if let Ok(gates) = &parsed {
        for pair in gates.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "gates not sorted and unique: {pair:?}"
            );
        }
        for gate in gates {
            assert!(!gate.name.is_empty());
            assert!(!gate.stage.is_empty());
        }
    }
    let report = component("kubelet", Ok(text.to_string()), Timestamp::UNIX_EPOCH);
    match parsed {
        Ok(gates) => {
            assert_eq!(report.gates, gates);
            assert_eq!(report.error, None);
        }
        Err(err) => {
            assert!(report.gates.is_empty());
            assert_eq!(report.error, Some(err.to_string()));
        }
    }
});
