//! Serving the fake API server over HTTPS, as a pod reaches the real one: a test CA and
//! its server certificate, and bearer-token checks.

use std::sync::Arc;

use axum::extract::State as AxumState;
use axum::http::{StatusCode, header};
use axum::response::Response;

use crate::Shared;
use crate::http::failure;

/// The fake API server served over HTTPS ([`FakeApiServer::serve_https`]); dropping it
/// stops serving and closes every connection.
pub struct HttpsEndpoint {
    /// Where it listens (a pod's `KUBERNETES_SERVICE_HOST` and `_PORT`).
    pub addr: std::net::SocketAddr,
    /// The test CA's certificate, PEM: a pod's service-account `ca.crt`.
    pub ca_pem: String,
    /// The bearer token requests must carry: a pod's service-account `token`.
    pub token: String,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A CA (self-signed) and a server certificate it issued for `ip` and the in-cluster
/// names of the API service: (CA PEM, server certificate DER, server key DER).
pub(crate) fn test_certificates(
    ip: std::net::IpAddr,
) -> Result<
    (
        String,
        rustls::pki_types::CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ),
    rcgen::Error,
> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "weft test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate()?;
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);

    let names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut server = CertificateParams::new(names.map(String::from).to_vec())?;
    server.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    server.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate()?;
    let cert = server.signed_by(&key, &issuer)?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    Ok((ca_pem, cert.der().clone(), key))
}

/// What [`authorize`] checks requests against.
#[derive(Clone)]
pub(crate) struct Auth {
    pub(crate) shared: Arc<Shared>,
    pub(crate) expected: String,
}

/// Lets a request through only with the expected bearer token, as the API server's
/// authentication does.
pub(crate) async fn authorize(
    AxumState(auth): AxumState<Auth>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if given != Some(auth.expected.as_str()) {
        auth.shared.store().note_plain("unauthorized");
        return failure(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    }
    next.run(request).await
}
