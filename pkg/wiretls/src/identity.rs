//! Whether a peer's certificate names the node at the address it connects from.

use std::net::IpAddr;

use rustls::pki_types::{CertificateDer, ServerName};

/// Whether `cert` (already verified against the CA) names the node at `remote`: by
/// `node_name`, the name the Node objects give that address (a DNS SAN), or by the
/// address itself (an IP SAN). A certificate naming any other node is refused, so a
/// node's key cannot be used to speak for another node.
pub fn names_node(cert: &CertificateDer<'_>, remote: IpAddr, node_name: Option<&str>) -> bool {
    let Ok(ee) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    let by_name = node_name
        .and_then(|n| ServerName::try_from(n).ok())
        .is_some_and(|n| ee.verify_is_valid_for_subject_name(&n).is_ok());
    by_name
        || ee
            .verify_is_valid_for_subject_name(&ServerName::IpAddress(remote.into()))
            .is_ok()
}
