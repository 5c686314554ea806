//! The TLS configuration of the client: the platform's certificate verifier, with its root
//! certificates loaded on a thread of their own while the pull starts.
//!
//! reqwest builds `rustls_platform_verifier::Verifier` in `ClientBuilder::build`, which reads
//! every root certificate of the system (on Debian the bundle and each of the ~300 files of
//! /etc/ssl/certs). With a cold page cache, as `rpull bench` runs every pull, that took 20 ms on
//! this machine before the first request could leave, and a plain-HTTP registry never needs it.
//! [`LazyPlatformVerifier`] starts the same load on a thread and waits for it at the first
//! certificate to verify; everything else of the configuration is what reqwest would build.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_platform_verifier::Verifier;

/// A rustls configuration as reqwest would build it for a verifying client (its default crypto
/// provider, TLS 1.2 and 1.3, ALPN `h2` then `http/1.1`), trusting the platform's roots plus
/// `extra_roots`.
pub(crate) fn client_config(
    extra_roots: Vec<CertificateDer<'static>>,
) -> Result<ClientConfig, rustls::Error> {
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    let verifier = LazyPlatformVerifier::start(extra_roots, provider.clone());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

type Loaded = Result<Arc<Verifier>, rustls::Error>;

/// `rustls_platform_verifier::Verifier`, built on a thread started with it and waited for when
/// first needed.
pub(crate) struct LazyPlatformVerifier {
    provider: Arc<CryptoProvider>,
    /// The loading thread, until the first verification joins it.
    loading: Mutex<Option<JoinHandle<Loaded>>>,
    loaded: OnceLock<Loaded>,
}

impl LazyPlatformVerifier {
    /// Starts loading the platform's roots (and `extra_roots`) on a thread; where no thread can
    /// be started, loads them now, as reqwest would.
    pub(crate) fn start(
        extra_roots: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        let background = {
            let (roots, provider) = (extra_roots.clone(), provider.clone());
            move || load(roots, provider)
        };
        let loaded = OnceLock::new();
        let loading = match std::thread::Builder::new()
            .name("rpull-tls-roots".to_owned())
            .spawn(background)
        {
            Ok(handle) => Some(handle),
            Err(error) => {
                tracing::debug!(%error, "no thread for loading the root certificates; loading them now");
                let _ = loaded.set(load(extra_roots, provider.clone()));
                None
            }
        };
        Self {
            provider,
            loading: Mutex::new(loading),
            loaded,
        }
    }

    /// The verifier, once its roots are loaded (waiting for them the first time).
    fn verifier(&self) -> Result<&Verifier, rustls::Error> {
        let loaded = self.loaded.get_or_init(|| {
            let handle = self
                .loading
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            // `loaded` is set whenever no thread was started, so a handle is always there.
            let Some(handle) = handle else {
                return Err(rustls::Error::General(
                    "the root certificates were not loaded".to_owned(),
                ));
            };
            handle.join().unwrap_or_else(|_| {
                Err(rustls::Error::General(
                    "loading the root certificates panicked".to_owned(),
                ))
            })
        });
        match loaded {
            Ok(verifier) => Ok(verifier),
            Err(error) => Err(error.clone()),
        }
    }
}

fn load(extra_roots: Vec<CertificateDer<'static>>, provider: Arc<CryptoProvider>) -> Loaded {
    let started = std::time::Instant::now();
    let verifier = if extra_roots.is_empty() {
        Verifier::new(provider)
    } else {
        Verifier::new_with_extra_roots(extra_roots, provider)
    }?;
    tracing::debug!(
        seconds = started.elapsed().as_secs_f64(),
        "root certificates loaded"
    );
    Ok(Arc::new(verifier))
}

impl fmt::Debug for LazyPlatformVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyPlatformVerifier")
            .field("loaded", &self.loaded.get().map(Result::is_ok))
            .finish_non_exhaustive()
    }
}

impl ServerCertVerifier for LazyPlatformVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls13_signature(message, cert, dss)
    }

    /// What the platform verifier offers, known without its roots: the provider's algorithms.
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
