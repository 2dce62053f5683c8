//! Making certificates for the wire port: a CA, and node certificates naming a node by
//! its name and its addresses, for both TLS roles (each node dials and accepts). The
//! lab uses this for its nodes; `weftctl certs` for clusters without cert-manager.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

use crate::{CA_FILE, CERT_FILE, KEY_FILE, TlsError};

/// Where an [`Authority`] keeps its key beside [`CA_FILE`] (never copied to nodes).
pub const CA_KEY_FILE: &str = "ca.key";

fn err(e: rcgen::Error) -> TlsError {
    TlsError::Issue(e.to_string())
}

/// A CA that issues node certificates.
pub struct Authority {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A node's certificate and key, PEM.
#[derive(Debug, Clone)]
pub struct NodeCert {
    /// The certificate (`tls.crt`).
    pub cert_pem: String,
    /// Its private key (`tls.key`).
    pub key_pem: String,
}

impl Authority {
    /// A new self-signed CA called `name`.
    pub fn generate(name: &str) -> Result<Self, TlsError> {
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.distinguished_name.push(DnType::CommonName, name);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(err)?;
        let cert_pem = ca.self_signed(&key).map_err(err)?.pem();
        Ok(Self {
            cert_pem,
            issuer: Issuer::new(ca, key),
        })
    }

    /// The CA of `dir` ([`CA_FILE`] and [`CA_KEY_FILE`]).
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let read = |f: &str| {
            let path = dir.join(f);
            std::fs::read_to_string(&path).map_err(|source| TlsError::Read { path, source })
        };
        let cert_pem = read(CA_FILE)?;
        let key = KeyPair::from_pem(&read(CA_KEY_FILE)?).map_err(|e| TlsError::Pem {
            path: dir.join(CA_KEY_FILE),
            msg: e.to_string(),
        })?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| TlsError::Pem {
            path: dir.join(CA_FILE),
            msg: e.to_string(),
        })?;
        Ok(Self { cert_pem, issuer })
    }

    /// Writes the CA's certificate and key into `dir` (created, 0700; the key 0600).
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        make_private_dir(dir)?;
        write_file(&dir.join(CA_FILE), self.cert_pem.as_bytes(), 0o644)?;
        write_file(
            &dir.join(CA_KEY_FILE),
            self.issuer.key().serialize_pem().as_bytes(),
            0o600,
        )
    }

    /// The CA certificate (`ca.crt`), PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate for node `name` at `addresses`: its SANs are the name (DNS) and
    /// each address (IP), for server and client use, valid for a year.
    pub fn issue(&self, name: &str, addresses: &[IpAddr]) -> Result<NodeCert, TlsError> {
        let mut p = CertificateParams::new(vec![name.to_string()]).map_err(err)?;
        p.subject_alt_names
            .extend(addresses.iter().map(|a| SanType::IpAddress(*a)));
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = std::time::SystemTime::now();
        p.not_before = (now - std::time::Duration::from_secs(3600)).into();
        p.not_after = (now + std::time::Duration::from_secs(365 * 24 * 3600)).into();
        let key = KeyPair::generate().map_err(err)?;
        let cert = p.signed_by(&key, &self.issuer).map_err(err)?;
        Ok(NodeCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Writes a node's TLS directory as a Secret volume would hold it: [`CA_FILE`],
/// [`CERT_FILE`], [`KEY_FILE`] (the key 0600, the directory 0700). Each file is
/// replaced atomically, the key and certificate last, so a daemon reading the
/// directory sees either version of each file, never half of one.
pub fn write_tls_dir(dir: &Path, ca_pem: &str, node: &NodeCert) -> Result<(), TlsError> {
    make_private_dir(dir)?;
    write_file(&dir.join(CA_FILE), ca_pem.as_bytes(), 0o644)?;
    write_file(&dir.join(KEY_FILE), node.key_pem.as_bytes(), 0o600)?;
    write_file(&dir.join(CERT_FILE), node.cert_pem.as_bytes(), 0o644)
}

/// A Kubernetes `kubernetes.io/tls` Secret holding a node's files (what the DaemonSet
/// mounts at `--wire-tls-dir`), as YAML.
pub fn secret_yaml(name: &str, namespace: &str, ca_pem: &str, node: &NodeCert) -> String {
    let block = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {namespace}\ntype: kubernetes.io/tls\nstringData:\n  ca.crt: |\n{}  tls.crt: |\n{}  tls.key: |\n{}",
        block(ca_pem),
        block(&node.cert_pem),
        block(&node.key_pem)
    )
}

fn make_private_dir(dir: &Path) -> Result<(), TlsError> {
    let io = |source| TlsError::Read {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), TlsError> {
    let io = |source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(data).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}
