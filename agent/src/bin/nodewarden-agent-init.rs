//! `nodewarden-agent-init`: the agent's init container. The kubelet creates a missing hostPath
//! folder owned by root; this hands the checkpoint folder to the agent's (non-root) user, once, and
//! does nothing when it already belongs to that user. It ships in the agent's image, so the chart
//! needs no second image (and no shell) for it.
//!
//! ```text
//! nodewarden-agent-init --dir /var/lib/nodewarden --owner 65532:65532
//! ```

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "nodewarden-agent-init",
    version,
    about = "Hands the agent's checkpoint folder (a hostPath) to the agent's user"
)]
struct Args {
    /// The checkpoint folder, as mounted in the init container.
    #[arg(
        long,
        env = "NODEWARDEN_CHECKPOINT_DIR",
        default_value = "/var/lib/nodewarden"
    )]
    dir: PathBuf,
    /// Its owner, `UID:GID` (numbers; the image has no user database to look names up in).
    #[arg(long, value_parser = parse_owner)]
    owner: (u32, u32),
}

fn parse_owner(s: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected UID:GID, e.g. 65532:65532"))?;
    let num = |v: &str, what: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("{s:?}: the {what} {v:?} is not a number (expected UID:GID)"))
    };
    Ok((num(uid, "UID")?, num(gid, "GID")?))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let meta = std::fs::metadata(&args.dir).with_context(|| format!("reading {}", args.dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a folder", args.dir.display());
    }
    let (uid, gid) = args.owner;
    if (meta.uid(), meta.gid()) == (uid, gid) {
        println!("{} already belongs to {uid}:{gid}", args.dir.display());
        return Ok(());
    }
    std::fs::set_permissions(&args.dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod 0700 {}", args.dir.display()))?;
    std::os::unix::fs::chown(&args.dir, Some(uid), Some(gid)).with_context(|| {
        format!(
            "chown {uid}:{gid} {} (the container needs CAP_CHOWN)",
            args.dir.display()
        )
    })?;
    println!("{} now belongs to {uid}:{gid}, mode 0700", args.dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_owner;

    #[test]
    fn owner_is_two_numbers() {
        assert_eq!(parse_owner("65532:65532"), Ok((65532, 65532)));
        assert_eq!(parse_owner("0:10"), Ok((0, 10)));
        for bad in ["65532", "a:b", "1:", ":1", "1:2:3", "-1:0"] {
            let err = parse_owner(bad).expect_err(bad);
            assert!(err.contains("UID:GID"), "{bad}: {err}");
        }
    }
}
