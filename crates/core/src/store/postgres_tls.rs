//! TLS to the PostgreSQL of many machines (`--database`, `--database-ca`).
//!
//! TLS is on when the URL says `sslmode=require` (or libpq's `verify-full` / `verify-ca`) or
//! when a CA file is given, and then it is always verified as libpq's `verify-full` is: the
//! server's certificate must chain to one of the system's CAs or of the given file, and name the
//! host the URL names. Airlock never settles for a TLS connection it could not verify, so
//! `sslmode=prefer` (the default) means plain text here, as it did before TLS existed.

use super::StoreError;
use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::path::Path;
use std::sync::Arc;
use tokio_postgres::config::SslMode;

/// How the store's connections to PostgreSQL are made.
pub(super) enum Tls {
    Plain,
    Verified(tokio_postgres_rustls::MakeRustlsConnect),
}

/// The PostgreSQL configuration that `url` names, with libpq's verifying modes read as
/// `require` (tokio-postgres knows only `disable`, `prefer` and `require`; ours verifies anyway).
pub(super) fn parse_url(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    let url = url
        .replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require");
    Ok(url.parse()?)
}

/// How to connect to what `config` names: verified TLS if it asks for TLS or `ca` is given
/// (which turns `sslmode` to `require`), else plain.
pub(super) fn tls_for(
    config: &mut tokio_postgres::Config,
    ca: Option<&Path>,
) -> Result<Tls, StoreError> {
    if let Some(ca) = ca {
        if config.get_ssl_mode() == SslMode::Disable {
            return Err(StoreError::Tls(format!(
                "a CA for the database's certificate ({}) is given, but its URL says \
                 sslmode=disable",
                ca.display()
            )));
        }
        config.ssl_mode(SslMode::Require);
    }
    if config.get_ssl_mode() != SslMode::Require {
        let remote = config.get_hosts().iter().any(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => !is_loopback(name),
            tokio_postgres::config::Host::Unix(_) => false,
        });
        if remote {
            tracing::warn!(
                "the connection to PostgreSQL is plain text: add sslmode=require to its URL (and \
                 --database-ca if your own CA signs its certificate) to make it TLS"
            );
        }
        return Ok(Tls::Plain);
    }
    let extra_roots = match ca {
        Some(ca) => read_ca(ca)?,
        None => Vec::new(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra_roots, provider.clone())
            .map_err(|e| StoreError::Tls(format!("loading the CAs to trust: {e}")))?;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Tls(e.to_string()))?
        .dangerous() // a verifier of our choosing, which verifies as the platform's does
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(Tls::Verified(
        tokio_postgres_rustls::MakeRustlsConnect::new(client),
    ))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The certificates in the PEM file `path`; at least one.
fn read_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let unreadable = |e: rustls::pki_types::pem::Error| {
        StoreError::Tls(format!(
            "reading CA certificates from {}: {e}",
            path.display()
        ))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(unreadable)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(unreadable)?;
    if certs.is_empty() {
        return Err(StoreError::Tls(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(url: &str, ca: Option<&Path>) -> Result<(SslMode, bool), String> {
        let mut config = parse_url(url).map_err(|e| e.to_string())?;
        let tls = tls_for(&mut config, ca).map_err(|e| e.to_string())?;
        Ok((config.get_ssl_mode(), matches!(tls, Tls::Verified(_))))
    }

    /// A CA certificate in PEM, made by `openssl` (which Debian's ca-certificates depends on).
    fn ca_file(dir: &Path) -> std::path::PathBuf {
        let (key, cert) = (dir.join("ca.key"), dir.join("ca.pem"));
        let made = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
            .args(["-subj", "/CN=airlock-test-ca", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        cert
    }

    #[test]
    fn tls_is_verified_when_asked_for_and_plain_otherwise() {
        let url = "host=db user=airlock";
        assert_eq!(mode(url, None), Ok((SslMode::Prefer, false)));
        for asked in ["require", "verify-full", "verify-ca"] {
            let got = mode(&format!("{url} sslmode={asked}"), None);
            assert_eq!(got, Ok((SslMode::Require, true)), "{asked}");
        }
        let got = mode("postgres://airlock@db/state?sslmode=verify-full", None);
        assert_eq!(got, Ok((SslMode::Require, true)));

        // A CA file means TLS, verified against it.
        let dir = tempfile::tempdir().unwrap();
        let ca = ca_file(dir.path());
        assert_eq!(mode(url, Some(&ca)), Ok((SslMode::Require, true)));
        let refused = mode(&format!("{url} sslmode=disable"), Some(&ca)).unwrap_err();
        assert!(refused.contains("sslmode=disable"), "{refused}");
    }

    #[test]
    fn a_ca_file_that_holds_no_certificate_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let url = "host=db user=airlock";
        let missing = dir.path().join("missing.pem");
        let err = mode(url, Some(&missing)).unwrap_err();
        assert!(err.contains("missing.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = mode(url, Some(&empty)).unwrap_err();
        assert!(err.contains("holds no PEM certificate"), "{err}");
    }
}
