//! The feature-gate metrics a kubelet or kube-proxy serves (`kubernetes_feature_enabled`), read
//! by the agent: the body as bytes (`read_bounded`: size limit, UTF-8), `features::parse`, and
//! the component report built from it.
//!
//! Invariants: a body over the limit or not UTF-8 is an error, any other is read as it is;
//! gates come out sorted by name, one per name, none unnamed, with a stage; the report of a
//! text that parses has its gates and no error, otherwise an error and no gates.
#![no_main]

use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use nodewarden_agent::features::{component, parse, read_bounded};

/// A limit below the fuzzer's longest input, so both sides of it are reached.
const LIMIT: u64 = 4096;

fuzz_target!(|data: &[u8]| {
    let read = futures::executor::block_on(read_bounded(futures::io::Cursor::new(data), LIMIT));
    let Ok(text) = read.as_deref() else {
        assert!(data.len() as u64 > LIMIT || std::str::from_utf8(data).is_err());
        return;
    };
    assert_eq!(text.as_bytes(), data);
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
