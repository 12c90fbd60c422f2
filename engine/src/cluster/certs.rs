//! `caudal certs`: a certificate authority of a cluster's own and a certificate per process,
//! for the mutual TLS of [`super::tls`].
//!
//! **In:** an output directory, the processes' names, extra host names or addresses, a
//! validity in days. **Out:** `DIR/ca.pem` (the CA certificate every process trusts) and
//! `DIR/NAME.pem` + `DIR/NAME.key` per name (ECDSA P-256; keys readable by their owner only).
//! The CA's private key is never written: certificates are made together, and adding a
//! process later means a new set (and so a new CA) for the whole cluster.

use super::tls::TlsFiles;
use crate::{Error, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Certificates valid this many days unless told otherwise.
pub const DEFAULT_DAYS: u32 = 365;

/// Makes the CA and one certificate per name in `dir` (created if absent; existing files
/// are never overwritten). Every certificate names `localhost`, `127.0.0.1`, its own name
/// and each of `hosts`. Returns each name's files, in order.
pub fn generate(dir: &Path, names: &[&str], hosts: &[String]) -> Result<Vec<TlsFiles>> {
    generate_for_days(dir, names, hosts, DEFAULT_DAYS)
}

/// [`generate`] with a validity of `days` from yesterday (clocks differ a little).
pub fn generate_for_days(dir: &Path, names: &[&str], hosts: &[String], days: u32) -> Result<Vec<TlsFiles>> {
    if names.is_empty() {
        return Err(Error::config(
            "--name",
            "name at least one process (e.g. --name jobmanager --name tm-1)",
        ));
    }
    for name in names {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(Error::config(
                "--name",
                format!("`{name}` is not a file name of letters, digits, - _ ."),
            ));
        }
    }
    let fail = |what: &str, e: rcgen::Error| Error::config("caudal certs", format!("{what}: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let today = (SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() / 86_400) as i64;
    let validity = |params: &mut CertificateParams| {
        let (y0, m0, d0) = crate::calendar::civil_from_days(today - 1);
        let (y1, m1, d1) = crate::calendar::civil_from_days(today + i64::from(days));
        params.not_before = rcgen::date_time_ymd(y0 as i32, m0 as u8, d0 as u8);
        params.not_after = rcgen::date_time_ymd(y1 as i32, m1 as u8, d1 as u8);
    };

    let ca_key = KeyPair::generate().map_err(|e| fail("making the CA's key", e))?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, "Caudal cluster CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut ca);
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| fail("signing the CA", e))?;
    let issuer = Issuer::new(ca, ca_key);
    let ca_path = dir.join("ca.pem");
    write_new(&ca_path, ca_cert.pem().as_bytes(), 0o644)?;

    let mut made = Vec::new();
    for name in names {
        let mut sans = vec!["localhost".to_string(), "127.0.0.1".to_string(), name.to_string()];
        sans.extend(hosts.iter().cloned());
        sans.dedup();
        let mut params =
            CertificateParams::new(sans).map_err(|e| fail(&format!("the names of {name}"), e))?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, *name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // Every process both accepts connections and makes them.
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params);
        let key = KeyPair::generate().map_err(|e| fail(&format!("making {name}'s key"), e))?;
        let cert = params.signed_by(&key, &issuer).map_err(|e| fail(&format!("signing {name}"), e))?;
        let files = TlsFiles {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
            ca: ca_path.clone(),
        };
        write_new(&files.cert, cert.pem().as_bytes(), 0o644)?;
        write_new(&files.key, key.serialize_pem().as_bytes(), 0o600)?;
        made.push(files);
    }
    Ok(made)
}

/// Writes a file that must not exist yet, with `mode` from its creation on.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|e| {
        Error::io(format!("creating {} (existing certificates are never overwritten)", path.display()), e)
    })?;
    file.write_all(bytes).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_are_made_once_with_private_keys_kept_private() {
        let dir = tempfile::tempdir().unwrap();
        let made =
            generate(dir.path(), &["jobmanager", "tm-1"], &["10.0.0.7".into(), "node-a".into()]).unwrap();
        assert_eq!(made.len(), 2);
        for files in &made {
            assert!(std::fs::read_to_string(&files.cert).unwrap().contains("BEGIN CERTIFICATE"));
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(&files.key).unwrap().permissions().mode();
                assert_eq!(mode & 0o077, 0, "{} is readable by others", files.key.display());
            }
            super::super::tls::ClusterTls::from_files(files.clone()).unwrap();
        }
        assert!(!dir.path().join("ca.key").exists(), "the CA's key is not kept");
        let again = generate(dir.path(), &["tm-2"], &[]).unwrap_err().to_string();
        assert!(again.contains("never overwritten"), "{again}");
        assert!(generate(dir.path(), &["../escape"], &[]).is_err());
    }
}
