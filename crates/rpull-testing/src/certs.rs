//! Certificates made at test time with rcgen: a CA plus a server certificate for the TLS
//! registry, and a CA plus a token-signing certificate for the token issuer.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Files for the registry's `http.tls` section and for the client's `--ca-cert`.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

/// Key material for signing registry tokens: the registry trusts `root_bundle`, tokens carry
/// `x5c = [signing cert, root cert]` and are signed with `signing_key_der` (PKCS#8, P-256).
#[derive(Debug, Clone)]
pub(crate) struct TokenKeys {
    pub root_bundle: PathBuf,
    pub signing_key_der: Vec<u8>,
    pub x5c_chain_der: Vec<Vec<u8>>,
}

fn new_ca(common_name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

pub(crate) fn write_tls_files(dir: &Path) -> Result<TlsFiles> {
    let ca = new_ca("rpull-testing CA")?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params
        .signed_by(&key, &ca)
        .context("signing the server certificate")?;

    let files = TlsFiles {
        ca_cert: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
    };
    fs_err::write(&files.ca_cert, ca.pem())?;
    fs_err::write(&files.server_cert, cert.pem())?;
    fs_err::write(&files.server_key, key.serialize_pem())?;
    Ok(files)
}

pub(crate) fn write_token_keys(dir: &Path) -> Result<TokenKeys> {
    let root = new_ca("rpull-testing token root")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "rpull-testing token signer");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate()?;
    let cert = params
        .signed_by(&key, &root)
        .context("signing the token certificate")?;

    let root_bundle = dir.join("token-root.pem");
    fs_err::write(&root_bundle, root.pem())?;
    Ok(TokenKeys {
        root_bundle,
        signing_key_der: key.serialize_der(),
        x5c_chain_der: vec![cert.der().to_vec(), root.der().to_vec()],
    })
}
