//! `nodewarden-certs`: generate and check nodewarden's webhook certificates from the command line.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Parser, Subcommand};
use nodewarden_certs::{
    Ca, CaConfig, ServingSpec, format_duration, needs_renewal, parse_certificate_info, parse_duration,
    service_dns_names, validate_dns_name,
};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

const EXIT_RENEWAL_DUE: u8 = 1;
const EXIT_ERROR: u8 = 2;

const AFTER_HELP: &str = "Durations are numbers with a unit such as d, h, m or s (90d, 2160h, 30m), or several of \
                          them (1h30m).\nEvery flag can also be set through the environment variable shown \
                          with it.\nExit status: 0 success; 1 `check` found the certificate due for renewal; 2 \
                          wrong flags or unusable input (unreadable files, invalid certificates or keys).";

/// Generate and check nodewarden's webhook certificates.
#[derive(Parser, Debug)]
#[command(
    name = "nodewarden-certs",
    version,
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write ca.crt, tls.crt and tls.key for a webhook Service into a directory.
    ///
    /// Issues a serving certificate for <service>, <service>.<namespace>, <service>.<namespace>.svc and
    /// <service>.<namespace>.svc.cluster.local plus any --dns-name / --ip-address, from a new CA or from the
    /// one given with --ca-cert/--ca-key. Each file is replaced atomically (temporary file, then rename);
    /// tls.key and ca.key are written with mode 0600.
    #[command(after_help = AFTER_HELP)]
    Generate(GenerateArgs),
    /// Show a certificate's subject, names and expiry; exit 1 if it is due for renewal.
    #[command(after_help = AFTER_HELP)]
    Check(CheckArgs),
}

#[derive(Args, Debug)]
struct GenerateArgs {
    /// Name of the webhook's Service.
    #[arg(long, env = "NODEWARDEN_CERTS_SERVICE", value_name = "NAME")]
    service: String,

    /// Namespace of the webhook's Service.
    #[arg(long, env = "NODEWARDEN_CERTS_NAMESPACE", value_name = "NAMESPACE")]
    namespace: String,

    /// Directory to write the files to; created if missing.
    #[arg(long, env = "NODEWARDEN_CERTS_OUT_DIR", value_name = "DIR")]
    out_dir: PathBuf,

    /// Extra DNS name for the serving certificate (repeat the flag; comma-separated in the variable).
    #[arg(
        long = "dns-name",
        env = "NODEWARDEN_CERTS_DNS_NAMES",
        value_name = "NAME",
        value_delimiter = ','
    )]
    dns_names: Vec<String>,

    /// IP address for the serving certificate (repeat the flag; comma-separated in the variable).
    #[arg(
        long = "ip-address",
        env = "NODEWARDEN_CERTS_IP_ADDRESSES",
        value_name = "IP",
        value_delimiter = ','
    )]
    ip_addresses: Vec<IpAddr>,

    /// Validity of a newly generated CA (ignored with --ca-cert).
    #[arg(
        long,
        env = "NODEWARDEN_CERTS_CA_VALIDITY",
        value_name = "DURATION",
        default_value = "8760h",
        value_parser = parse_duration
    )]
    ca_validity: Duration,

    /// Common name of a newly generated CA (ignored with --ca-cert).
    #[arg(
        long,
        env = "NODEWARDEN_CERTS_CA_COMMON_NAME",
        value_name = "NAME",
        default_value = "nodewarden-ca"
    )]
    ca_common_name: String,

    /// Validity of the serving certificate (never beyond the CA's expiry).
    #[arg(
        long,
        env = "NODEWARDEN_CERTS_CERT_VALIDITY",
        value_name = "DURATION",
        default_value = "2160h",
        value_parser = parse_duration
    )]
    cert_validity: Duration,

    /// Existing CA certificate (PEM) to issue from instead of generating a new CA; needs --ca-key.
    #[arg(
        long,
        env = "NODEWARDEN_CERTS_CA_CERT",
        value_name = "FILE",
        requires = "ca_key"
    )]
    ca_cert: Option<PathBuf>,

    /// Private key (unencrypted PKCS#8 PEM) of --ca-cert.
    #[arg(
        long,
        env = "NODEWARDEN_CERTS_CA_KEY",
        value_name = "FILE",
        requires = "ca_cert"
    )]
    ca_key: Option<PathBuf>,

    /// Also write the CA private key as ca.key (mode 0600), so that a later run can reuse the CA.
    #[arg(long, env = "NODEWARDEN_CERTS_WRITE_CA_KEY")]
    write_ca_key: bool,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// Certificate file (PEM) to check; with several certificates, the first one.
    #[arg(long, env = "NODEWARDEN_CERTS_CERT", value_name = "FILE")]
    cert: PathBuf,

    /// Renewal is due when the certificate expires within this time.
    #[arg(
        long,
        env = "NODEWARDEN_CERTS_RENEW_BEFORE",
        value_name = "DURATION",
        default_value = "720h",
        value_parser = parse_duration
    )]
    renew_before: Duration,
}

fn main() -> ExitCode {
    // clap prints usage errors itself and exits with status 2.
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate(&args).map(|()| ExitCode::SUCCESS),
        Command::Check(args) => check(&args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(EXIT_ERROR)
    })
}

fn read_text(path: &Path, what: &str) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("cannot read {what} file {}", path.display()))
}

fn generate(args: &GenerateArgs) -> Result<()> {
    for (flag, value) in [("--service", &args.service), ("--namespace", &args.namespace)] {
        let checked = validate_dns_name(value).with_context(|| format!("{flag} {value:?}"))?;
        if checked.contains('.') || checked.starts_with('*') {
            bail!(
                "{flag} {value:?} must be a single DNS label (letters, digits and '-'), without '.' or '*'"
            );
        }
    }
    let ca = match (&args.ca_cert, &args.ca_key) {
        (Some(cert), Some(key)) => {
            let cert_pem = read_text(cert, "--ca-cert")?;
            let key_pem = read_text(key, "--ca-key")?;
            Ca::from_pem(&cert_pem, &key_pem)
                .with_context(|| format!("cannot use CA {} / {}", cert.display(), key.display()))?
        }
        // clap enforces that the two flags come together.
        _ => Ca::generate(&CaConfig {
            common_name: args.ca_common_name.clone(),
            validity: args.ca_validity,
        })
        .context("cannot generate the CA (--ca-common-name / --ca-validity)")?,
    };
    let mut dns_names = service_dns_names(&args.service, &args.namespace);
    dns_names.extend(args.dns_names.iter().cloned());
    let serving = ca
        .issue_serving(&ServingSpec {
            dns_names,
            ip_addresses: args.ip_addresses.clone(),
            validity: args.cert_validity,
        })
        .context("cannot issue the serving certificate (--dns-name / --ip-address / --cert-validity)")?;

    let dir = &args.out_dir;
    fs::create_dir_all(dir).with_context(|| format!("cannot create --out-dir {}", dir.display()))?;
    // The CA first: whoever picks up the new serving certificate can already verify it.
    if args.write_ca_key {
        write_atomic(dir, "ca.key", &ca.key_pem, 0o600)?;
    }
    write_atomic(dir, "ca.crt", &ca.cert_pem, 0o644)?;
    write_atomic(dir, "tls.key", &serving.key_pem, 0o600)?;
    write_atomic(dir, "tls.crt", &serving.cert_pem, 0o644)?;
    let not_after = serving
        .not_after
        .format(&Rfc3339)
        .unwrap_or_else(|_| serving.not_after.to_string());
    println!(
        "wrote {}: ca.crt, tls.crt, tls.key{} (serving certificate valid until {not_after})",
        dir.display(),
        if args.write_ca_key { ", ca.key" } else { "" },
    );
    Ok(())
}

/// Replaces `dir/name` atomically: a temporary file in the same directory, created with `mode`, synced,
/// then renamed over the target, and the directory synced.
fn write_atomic(dir: &Path, name: &str, contents: &str, mode: u32) -> Result<()> {
    let target = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        // A leftover from a crashed run with the same process id would make create_new fail.
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options.open(&tmp)?;
        file.write_all(contents.as_bytes())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, &target)?;
        #[cfg(unix)]
        File::open(dir)?.sync_all()?;
        Ok(())
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("cannot write {}", target.display()))
    })
}

fn check(args: &CheckArgs) -> Result<ExitCode> {
    let pem = read_text(&args.cert, "--cert")?;
    let info = parse_certificate_info(&pem).with_context(|| format!("--cert {}", args.cert.display()))?;
    let now = OffsetDateTime::now_utc();
    let due = needs_renewal(&pem, args.renew_before, now)?;
    let time = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_else(|_| t.to_string());
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(", ")
        }
    };
    let remaining = if info.not_after > now {
        format!(
            "expires in {}",
            format_duration((info.not_after - now).unsigned_abs())
        )
    } else {
        format!(
            "expired {} ago",
            format_duration((now - info.not_after).unsigned_abs())
        )
    };
    println!("subject:      {}", info.subject);
    println!("issuer:       {}", info.issuer);
    println!("dns names:    {}", list(info.dns_names));
    println!(
        "ip addresses: {}",
        list(info.ip_addresses.iter().map(IpAddr::to_string).collect())
    );
    println!("ca:           {}", info.is_ca);
    println!("not before:   {}", time(info.not_before));
    println!("not after:    {} ({remaining})", time(info.not_after));
    println!(
        "renewal due:  {} (renew before {})",
        if due { "yes" } else { "no" },
        format_duration(args.renew_before)
    );
    Ok(if due {
        ExitCode::from(EXIT_RENEWAL_DUE)
    } else {
        ExitCode::SUCCESS
    })
}
