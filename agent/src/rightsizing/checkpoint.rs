//! The histograms on disk: `<checkpoint dir>/checkpoint-<node>.json`, versioned JSON, written
//! atomically (temporary file in the same folder, fsync, rename, fsync of the folder). The node's
//! name is in the file's name so that agents sharing one host folder (several kubelets on one
//! machine) never read or overwrite each other's history. A `checkpoint.json` written by an older
//! agent is read when the node has no file of its own yet, and removed once the new one is written.
//!
//! A file that does not parse, or has a version this agent does not know, is renamed to
//! `<file>.corrupt-<unix seconds>` or `<file>.unsupported-<unix seconds>` with a warning, and the
//! agent starts with no history. Loading also tidies the folder: temporary files of saves that
//! never finished are removed, and only the 3 newest files moved aside are kept.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nodewarden_api::rightsizing::AutoscalerRef;
use serde::{Deserialize, Serialize};

use nodewarden_estimator::recommender::StoredHistory;

/// Format version written by this agent. Version 2 stores the memory peaks as a decaying
/// histogram (as VPA keeps them) instead of a list of the last eight.
pub const VERSION: u32 = 2;
/// Versions this agent reads: 1 is converted on load (see `History::from_stored`).
pub const READABLE_VERSIONS: [u32; 2] = [1, 2];
/// The file older agents wrote, one per folder.
pub const LEGACY_FILE_NAME: &str = "checkpoint.json";

/// Why a checkpoint could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Writing the file (or its temporary copy) failed.
    #[error("writing checkpoint {path}: {source} (the checkpoint folder must be writable by the agent)")]
    Write {
        /// The file written.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Serializing the checkpoint to JSON failed.
    #[error("encoding checkpoint: {0}")]
    Encode(#[from] serde_json::Error),
}

/// One (autoscaler, container) history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The autoscaler whose policy the container falls under.
    pub autoscaler: AutoscalerRef,
    /// The container's name.
    pub container: String,
    /// Containers in the pod when last seen (the floors are shared among them).
    #[serde(default = "one")]
    pub containers_per_pod: usize,
    /// The container's usage history.
    pub history: StoredHistory,
}

fn one() -> usize {
    1
}

/// The file's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Format version ([`VERSION`] when written by this agent).
    pub version: u32,
    /// The node the history was measured on.
    pub node: String,
    /// When the file was written, in milliseconds since the Unix epoch.
    pub saved_at_ms: i64,
    /// One entry per (autoscaler, container).
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
    /// A readable checkpoint.
    Found(Checkpoint),
    /// A bad file was moved to `moved_to`; `why` says what was wrong.
    MovedAside {
        /// Where the bad file now is.
        moved_to: PathBuf,
        /// What was wrong with it.
        why: String,
    },
    /// The file exists but cannot be read (permissions); nothing was moved.
    Unreadable {
        /// Why it cannot be read.
        why: String,
    },
}

/// The checkpoint file of `node` in `dir`. Characters other than letters, digits, `-`, `.` and
/// `_` (none in a valid node name) become `_`.
pub fn path(dir: &Path, node: &str) -> PathBuf {
    let safe: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("checkpoint-{safe}.json"))
}

/// Loads `node`'s checkpoint from `dir` (or an older agent's `checkpoint.json` when the node has
/// none yet); moves a corrupt or unknown-version file aside.
pub fn load(dir: &Path, node: &str, now_secs: u64) -> Loaded {
    let loaded = match load_file(&path(dir, node), now_secs) {
        Loaded::Missing => load_file(&dir.join(LEGACY_FILE_NAME), now_secs),
        other => other,
    };
    tidy(dir, node);
    loaded
}

/// Files moved aside (`.corrupt-*`, `.unsupported-*`) kept per checkpoint file, newest first.
pub const KEEP_MOVED_ASIDE: usize = 3;

/// Removes what earlier runs left behind for `node` (and the older agents' `checkpoint.json`):
/// temporary files of saves that never finished (the agent was killed), and all but the
/// [`KEEP_MOVED_ASIDE`] newest files moved aside. Other nodes' files are left alone (agents may
/// share the folder). Returns the files removed; a file that cannot be removed is skipped.
pub fn tidy(dir: &Path, node: &str) -> Vec<PathBuf> {
    let own = path(dir, node)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    let mut moved_aside: Vec<(u64, String)> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        for base in [own.as_str(), LEGACY_FILE_NAME] {
            if name.starts_with(&format!(".{base}.tmp-")) {
                let file = dir.join(&name);
                if fs::remove_file(&file).is_ok() {
                    removed.push(file);
                }
            } else if let Some(rest) = name
                .strip_prefix(&format!("{base}.corrupt-"))
                .or_else(|| name.strip_prefix(&format!("{base}.unsupported-")))
            {
                moved_aside.push((rest.parse().unwrap_or(0), name.clone()));
            }
        }
    }
    // newest first: by the seconds in the name, then by name
    moved_aside.sort_by(|a, b| b.cmp(a));
    for (_, name) in moved_aside.into_iter().skip(KEEP_MOVED_ASIDE) {
        let file = dir.join(name);
        if fs::remove_file(&file).is_ok() {
            removed.push(file);
        }
    }
    removed
}

fn load_file(file: &Path, now_secs: u64) -> Loaded {
    let bytes = match fs::read(file) {
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
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}-{now_secs}"));
    let moved_to = file.with_file_name(name);
    match fs::rename(file, &moved_to) {
        Ok(()) => Loaded::MovedAside { moved_to, why },
        Err(e) => Loaded::Unreadable {
            why: format!("{why}; moving it aside to {} failed: {e}", moved_to.display()),
        },
    }
}

/// Writes `checkpoint` to `dir` atomically, as the file of its node; then removes an older agent's
/// `checkpoint.json`, which the new file replaces.
pub fn save(dir: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    let bytes = serde_json::to_vec(checkpoint)?;
    let target = path(dir, &checkpoint.node);
    let mut tmp_name = target.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(format!(".{}", tmp_name.to_string_lossy()));
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
    } else {
        let _ = fs::remove_file(dir.join(LEGACY_FILE_NAME));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_estimator::recommender::{EstimatorConfig, History, MIB};

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
        assert_eq!(load(dir.path(), "x", 1), Loaded::Missing);
        save(dir.path(), &sample()).unwrap();
        assert_eq!(load(dir.path(), "x", 1), Loaded::Found(sample()));
        // no temporary file left behind
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["checkpoint-x.json".to_string()]);
    }

    #[test]
    fn agents_sharing_a_folder_keep_their_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = sample();
        let mut b = sample();
        b.node = "y".into();
        b.entries.clear();
        save(dir.path(), &a).unwrap();
        save(dir.path(), &b).unwrap();
        assert_eq!(load(dir.path(), "x", 1), Loaded::Found(a));
        assert_eq!(load(dir.path(), "y", 1), Loaded::Found(b));
        assert_eq!(path(dir.path(), "a/b"), dir.path().join("checkpoint-a_b.json"));
    }

    #[test]
    fn an_older_agents_file_is_read_then_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = dir.path().join(LEGACY_FILE_NAME);
        fs::write(&legacy, serde_json::to_vec(&sample()).unwrap()).unwrap();
        assert_eq!(load(dir.path(), "x", 1), Loaded::Found(sample()));
        save(dir.path(), &sample()).unwrap();
        assert!(!legacy.exists(), "the new file replaces the old one");
        assert_eq!(load(dir.path(), "x", 1), Loaded::Found(sample()));
    }

    #[test]
    fn leftovers_are_removed_at_load_and_only_the_three_newest_moved_aside_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let touch = |name: &str| fs::write(d.join(name), b"x").unwrap();
        // a save killed before its rename, by two earlier runs
        touch(".checkpoint-x.json.tmp-41");
        touch(".checkpoint-x.json.tmp-977");
        for secs in [10, 20, 30, 40] {
            touch(&format!("checkpoint-x.json.corrupt-{secs}"));
        }
        touch("checkpoint-x.json.unsupported-25");
        // another node's agent shares the folder: its files are its own
        touch(".checkpoint-y.json.tmp-5");
        touch("checkpoint-y.json.corrupt-1");
        save(d, &sample()).unwrap();
        assert!(matches!(load(d, "x", 50), Loaded::Found(_)));
        let mut left: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".checkpoint-y.json.tmp-5",
                "checkpoint-x.json",
                "checkpoint-x.json.corrupt-30",
                "checkpoint-x.json.corrupt-40",
                "checkpoint-x.json.unsupported-25",
                "checkpoint-y.json.corrupt-1",
            ]
        );
        // a corrupt file moved aside now counts as the newest
        fs::write(path(d, "x"), b"{").unwrap();
        assert!(matches!(load(d, "x", 60), Loaded::MovedAside { .. }));
        let aside = fs::read_dir(d)
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name().to_string_lossy().into_owned();
                n.starts_with("checkpoint-x.json.")
                    && (n.contains(".corrupt-") || n.contains(".unsupported-"))
            })
            .count();
        assert_eq!(aside, KEEP_MOVED_ASIDE);
        assert!(d.join("checkpoint-x.json.corrupt-60").exists());
    }

    #[test]
    fn corrupted_file_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), "x");
        fs::write(&file, b"{\"version\": 1, \"node\": \"x\", \"entr").unwrap();
        match load(dir.path(), "x", 42) {
            Loaded::MovedAside { moved_to, why } => {
                assert_eq!(moved_to, dir.path().join("checkpoint-x.json.corrupt-42"));
                assert!(why.contains("not a checkpoint"), "{why}");
                assert!(moved_to.exists());
            }
            other => panic!("{other:?}"),
        }
        assert!(!file.exists());
        assert_eq!(load(dir.path(), "x", 43), Loaded::Missing);
        // right version, wrong shape
        fs::write(&file, br#"{"version": 1, "entries": 3}"#).unwrap();
        assert!(
            matches!(load(dir.path(), "x", 44), Loaded::MovedAside { why, .. } if why.contains("does not match"))
        );
    }

    #[test]
    fn a_version_1_file_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = serde_json::to_value(sample()).unwrap();
        c["version"] = 1.into();
        fs::write(path(dir.path(), "x"), serde_json::to_vec(&c).unwrap()).unwrap();
        assert!(matches!(load(dir.path(), "x", 42), Loaded::Found(c) if c.version == 1));
    }

    #[test]
    fn unknown_version_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = serde_json::to_value(sample()).unwrap();
        c["version"] = 7.into();
        fs::write(path(dir.path(), "x"), serde_json::to_vec(&c).unwrap()).unwrap();
        match load(dir.path(), "x", 42) {
            Loaded::MovedAside { moved_to, why } => {
                assert_eq!(moved_to, dir.path().join("checkpoint-x.json.unsupported-42"));
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
