//! The lab's certificate authority and each node's wire certificate (mutual TLS on the wire port).

use std::path::{Path, PathBuf};

use super::Lab;
use crate::LabError;

impl Lab {
    /// The directory of a node's wire TLS files (`--wire-tls-dir`).
    pub fn wire_tls_dir(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("wire-tls")
    }

    /// The lab's CA (certificate and key), made on first use.
    pub fn authority(&self) -> Result<weft_wiretls::issue::Authority, LabError> {
        let dir = self.state.join("ca");
        let tls = |e: weft_wiretls::TlsError| LabError::Command {
            what: "the lab's wire CA".into(),
            detail: e.to_string(),
        };
        if dir.join(weft_wiretls::issue::CA_KEY_FILE).exists() {
            return weft_wiretls::issue::Authority::load(&dir).map_err(tls);
        }
        let ca =
            weft_wiretls::issue::Authority::generate(&format!("weft lab {} wire CA", self.spec.name)).map_err(tls)?;
        ca.save(&dir).map_err(tls)?;
        Ok(ca)
    }

    /// Gives node `node` at `addr` a certificate of the lab's CA in `dir`, unless it
    /// has one there already (a restarted daemon keeps its identity).
    pub(super) fn issue_node_cert(&self, node: &str, addr: &str, dir: &Path) -> Result<(), LabError> {
        if dir.join(weft_wiretls::CERT_FILE).exists() {
            return Ok(());
        }
        let ca = self.authority()?;
        let tls = |e: weft_wiretls::TlsError| LabError::Command {
            what: format!("issuing {node}'s wire certificate"),
            detail: e.to_string(),
        };
        let ip: std::net::IpAddr = addr.parse().map_err(|_| LabError::Command {
            what: format!("issuing {node}'s wire certificate"),
            detail: format!("{addr:?} is not an address"),
        })?;
        let cert = ca.issue(node, &[ip]).map_err(tls)?;
        weft_wiretls::issue::write_tls_dir(dir, ca.cert_pem(), &cert).map_err(tls)
    }
}
