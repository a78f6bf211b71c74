//! The histograms on disk: `<checkpoint dir>/checkpoint.json`, versioned JSON, written
//! atomically (temporary file in the same folder, fsync, rename, fsync of the folder).
//!
//! A file that does not parse, or has a version this agent does not know, is renamed to
//! `checkpoint.json.corrupt-<unix seconds>` or `checkpoint.json.unsupported-<unix seconds>`
//! with a warning, and the agent starts with no history.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nodewarden_api::rightsizing::AutoscalerRef;
use serde::{Deserialize, Serialize};

use crate::recommender::StoredHistory;

/// Format version written by this agent. Version 2 stores the memory peaks as a decaying
/// histogram (as VPA keeps them) instead of a list of the last eight.
pub const VERSION: u32 = 2;
/// Versions this agent reads: 1 is converted on load (see `History::from_stored`).
pub const READABLE_VERSIONS: [u32; 2] = [1, 2];
pub const FILE_NAME: &str = "checkpoint.json";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("writing checkpoint {path}: {source} (the checkpoint folder must be writable by the agent)")]
    Write { path: PathBuf, source: io::Error },
    #[error("encoding checkpoint: {0}")]
    Encode(#[from] serde_json::Error),
}

/// One (autoscaler, container) history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub autoscaler: AutoscalerRef,
    pub container: String,
    /// Containers in the pod when last seen (the floors are shared among them).
    #[serde(default = "one")]
    pub containers_per_pod: usize,
    pub history: StoredHistory,
}

fn one() -> usize {
    1
}

/// The file's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub version: u32,
    pub node: String,
    pub saved_at_ms: i64,
    pub entries: Vec<Entry>,
}

#[derive(Deserialize)]
struct VersionOnly {
    version: Option<serde_json::Value>,
}

/// What loading found.
#[derive(Debug, PartialEq)]
pub enum Loaded {
    /// No file: a first start.
    Missing,
    Found(Checkpoint),
    /// A bad file was moved to `moved_to`; `why` says what was wrong.
    MovedAside {
        moved_to: PathBuf,
        why: String,
    },
    /// The file exists but cannot be read (permissions); nothing was moved.
    Unreadable {
        why: String,
    },
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Loads the checkpoint from `dir`; moves a corrupt or unknown-version file aside.
pub fn load(dir: &Path, now_secs: u64) -> Loaded {
    let file = path(dir);
    let bytes = match fs::read(&file) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Loaded::Missing,
        Err(e) => {
            return Loaded::Unreadable {
                why: format!("reading {}: {e}", file.display()),
            };
        }
    };
    let (suffix, why) = match serde_json::from_slice::<VersionOnly>(&bytes) {
        Err(e) => ("corrupt", format!("not a checkpoint: {e}")),
        Ok(VersionOnly { version }) => match version.as_ref().and_then(|v| v.as_u64()) {
            Some(v) if READABLE_VERSIONS.iter().any(|&r| u64::from(r) == v) => {
                match serde_json::from_slice::<Checkpoint>(&bytes) {
                    Ok(c) => return Loaded::Found(c),
                    Err(e) => (
                        "corrupt",
                        format!("version {v} but the content does not match it: {e}"),
                    ),
                }
            }
            _ => (
                "unsupported",
                format!(
                    "version {} is not supported (this agent reads versions {READABLE_VERSIONS:?})",
                    version.map_or_else(|| "missing".to_string(), |v| v.to_string())
                ),
            ),
        },
    };
    let moved_to = dir.join(format!("{FILE_NAME}.{suffix}-{now_secs}"));
    match fs::rename(&file, &moved_to) {
        Ok(()) => Loaded::MovedAside { moved_to, why },
        Err(e) => Loaded::Unreadable {
            why: format!("{why}; moving it aside to {} failed: {e}", moved_to.display()),
        },
    }
}

/// Writes `checkpoint` to `dir` atomically.
pub fn save(dir: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    let bytes = serde_json::to_vec(checkpoint)?;
    let target = path(dir);
    let tmp = dir.join(format!(".{FILE_NAME}.tmp-{}", std::process::id()));
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Write { path, source }
    };
    let result = (|| {
        let mut f = File::create(&tmp).map_err(werr(&tmp))?;
        f.write_all(&bytes).map_err(werr(&tmp))?;
        f.sync_all().map_err(werr(&tmp))?;
        drop(f);
        fs::rename(&tmp, &target).map_err(werr(&target))?;
        // the rename is durable once the folder is
        File::open(dir).and_then(|d| d.sync_all()).map_err(werr(dir))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recommender::{EstimatorConfig, History, MIB};

    fn sample() -> Checkpoint {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_cpu(&cfg, 1_700_000_000_000, 0.2);
        h.add_memory(&cfg, 1_700_000_000_000, 300.0 * MIB);
        Checkpoint {
            version: VERSION,
            node: "x".into(),
            saved_at_ms: 1_700_000_000_000,
            entries: vec![Entry {
                autoscaler: AutoscalerRef {
                    namespace: "mon".into(),
                    name: "agent".into(),
                },
                container: "app".into(),
                containers_per_pod: 1,
                history: h.to_stored(),
            }],
        }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path(), 1), Loaded::Missing);
        save(dir.path(), &sample()).unwrap();
        assert_eq!(load(dir.path(), 1), Loaded::Found(sample()));
        // no temporary file left behind
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![FILE_NAME.to_string()]);
    }

    #[test]
    fn corrupted_file_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(path(dir.path()), b"{\"version\": 1, \"node\": \"x\", \"entr").unwrap();
        match load(dir.path(), 42) {
            Loaded::MovedAside { moved_to, why } => {
                assert_eq!(moved_to, dir.path().join("checkpoint.json.corrupt-42"));
                assert!(why.contains("not a checkpoint"), "{why}");
                assert!(moved_to.exists());
            }
            other => panic!("{other:?}"),
        }
        assert!(!path(dir.path()).exists());
        assert_eq!(load(dir.path(), 43), Loaded::Missing);
        // right version, wrong shape
        fs::write(path(dir.path()), br#"{"version": 1, "entries": 3}"#).unwrap();
        assert!(
            matches!(load(dir.path(), 44), Loaded::MovedAside { why, .. } if why.contains("does not match"))
        );
    }

    #[test]
    fn a_version_1_file_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = serde_json::to_value(sample()).unwrap();
        c["version"] = 1.into();
        fs::write(path(dir.path()), serde_json::to_vec(&c).unwrap()).unwrap();
        assert!(matches!(load(dir.path(), 42), Loaded::Found(c) if c.version == 1));
    }

    #[test]
    fn unknown_version_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = serde_json::to_value(sample()).unwrap();
        c["version"] = 7.into();
        fs::write(path(dir.path()), serde_json::to_vec(&c).unwrap()).unwrap();
        match load(dir.path(), 42) {
            Loaded::MovedAside { moved_to, why } => {
                assert_eq!(moved_to, dir.path().join("checkpoint.json.unsupported-42"));
                assert!(why.contains("version 7 is not supported"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unwritable_folder_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = save(&missing, &sample()).unwrap_err().to_string();
        assert!(err.contains("must be writable"), "{err}");
    }
}
