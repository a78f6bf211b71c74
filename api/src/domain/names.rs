//! Names as Kubernetes checks them (RFC 1123 DNS labels and subdomains), and service accounts
//! as nodewarden's flags name them: `namespace:name` or `system:serviceaccount:namespace:name`.

use std::fmt;
use std::str::FromStr;

/// Longest DNS label.
pub const MAX_LABEL_CHARS: usize = 63;
/// Longest DNS subdomain (and object name).
pub const MAX_SUBDOMAIN_CHARS: usize = 253;
/// How the user names of service accounts start.
pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// Checks an RFC 1123 DNS label as Kubernetes defines it.
pub fn check_dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("is empty".to_string());
    }
    check_label_chars(s)?;
    if s.len() > MAX_LABEL_CHARS {
        return Err(format!(
            "is {} characters long, at most {MAX_LABEL_CHARS} allowed",
            s.len()
        ));
    }
    Ok(())
}

fn check_label_chars(label: &str) -> Result<(), String> {
    if let Some(c) = label
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "contains {c:?}; only lowercase letters, digits and '-' are allowed"
        ));
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err("must start and end with a lowercase letter or digit".to_string());
    }
    Ok(())
}

/// Checks a label key as Kubernetes defines it (a qualified name): an optional DNS subdomain
/// prefix and `/`, then a name of at most 63 characters of letters, digits, `-`, `_` and `.`
/// that starts and ends with a letter or digit.
pub fn check_label_key(s: &str) -> Result<(), String> {
    let name = match s.split_once('/') {
        Some((prefix, name)) => {
            check_dns_subdomain(prefix, MAX_SUBDOMAIN_CHARS).map_err(|e| format!("has a prefix that {e}"))?;
            name
        }
        None => s,
    };
    if name.is_empty() {
        return Err("has an empty name".to_string());
    }
    if name.len() > MAX_LABEL_CHARS {
        return Err(format!(
            "has a name of {} characters, at most {MAX_LABEL_CHARS} allowed",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "contains {c:?}; a name has only letters, digits, '-', '_' and '.'"
        ));
    }
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !ends(name.chars().next()) || !ends(name.chars().last()) {
        return Err("has a name that does not start and end with a letter or digit".to_string());
    }
    Ok(())
}

/// Checks an RFC 1123 DNS subdomain as Kubernetes defines it, at most `max` characters.
pub fn check_dns_subdomain(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("is empty".to_string());
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(format!(
            "contains {c:?}; only lowercase letters, digits, '-' and '.' are allowed"
        ));
    }
    for label in s.split('.') {
        if label.is_empty() {
            return Err("has an empty part between dots".to_string());
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("has a part that starts or ends with '-'".to_string());
        }
    }
    if s.len() > max {
        return Err(format!("is {} characters long, at most {max} allowed", s.len()));
    }
    Ok(())
}

/// A service account named on the command line: `namespace:name` or
/// `system:serviceaccount:namespace:name`; the namespace a DNS label, the name a DNS subdomain.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceAccountName {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// Why a service account name was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceAccountError {
    /// No `:` between namespace and name.
    NoNamespace(String),
    /// The namespace or the name is not a valid DNS name; the message says which and why.
    Invalid(String),
}

impl fmt::Display for ServiceAccountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceAccountError::NoNamespace(m) | ServiceAccountError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ServiceAccountError {}

impl ServiceAccountName {
    /// The user name its tokens authenticate as.
    pub fn username(&self) -> String {
        format!("{SERVICE_ACCOUNT_PREFIX}{}:{}", self.namespace, self.name)
    }

    /// Parses either syntax, saying which part is wrong and what is accepted.
    pub fn parse(s: &str) -> Result<Self, ServiceAccountError> {
        let s = s.trim();
        let rest = s.strip_prefix(SERVICE_ACCOUNT_PREFIX).unwrap_or(s);
        let accepted = "expected <namespace>:<name> or system:serviceaccount:<namespace>:<name>";
        let (namespace, name) = rest
            .split_once(':')
            .ok_or_else(|| ServiceAccountError::NoNamespace(format!("service account {s:?}: {accepted}")))?;
        if let Err(why) = check_dns_label(namespace) {
            return Err(ServiceAccountError::Invalid(format!(
                "service account {s:?}: namespace {why}; {accepted}"
            )));
        }
        if let Err(why) = check_dns_subdomain(name, MAX_SUBDOMAIN_CHARS) {
            return Err(ServiceAccountError::Invalid(format!(
                "service account {s:?}: name {why}; {accepted}"
            )));
        }
        Ok(ServiceAccountName {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

impl FromStr for ServiceAccountName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys() {
        for ok in [
            "node.kubernetes.io/instance-type",
            "pool",
            "example.com/Pool_2",
            "topology.kubernetes.io/zone",
        ] {
            assert_eq!(check_label_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/pool",
            "-pool",
            "pool-",
            "a/b/c",
            "Example.com/pool",
            "pool name",
            &"p".repeat(64),
        ] {
            assert!(check_label_key(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn both_syntaxes_name_the_same_account() {
        let short = ServiceAccountName::parse("nodewarden:nodewarden-agent").expect("short");
        let long =
            ServiceAccountName::parse("system:serviceaccount:nodewarden:nodewarden-agent").expect("long");
        assert_eq!(short, long);
        assert_eq!(
            short.username(),
            "system:serviceaccount:nodewarden:nodewarden-agent"
        );
        assert!(matches!(
            ServiceAccountName::parse("nodewarden"),
            Err(ServiceAccountError::NoNamespace(_))
        ));
        assert!(matches!(
            ServiceAccountName::parse("Bad:sa"),
            Err(ServiceAccountError::Invalid(m)) if m.contains("namespace contains 'B'")
        ));
    }
}
