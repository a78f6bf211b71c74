//! The webhook's serving certificates: files that reload without a restart ([`tls`]), and
//! managed certificates kept in a Secret with the `caBundle` injected into the webhook
//! configurations ([`manager`]).

pub mod manager;
pub mod tls;

pub use manager::{CertArgs, CertManagerOptions, CertMode};
pub use tls::{
    CertReloader, CertResolver, ClientVerifier, Reload, ReloadObserver, certified_key, server_config,
    server_config_with,
};
