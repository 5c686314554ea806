//! The TLS configuration of the client: the platform's certificate verifier, with its root
//! certificates loaded on a thread of their own while the pull starts.
//!
//! reqwest builds `rustls_platform_verifier::Verifier` in `ClientBuilder::build`, which reads
//! every root certificate of the system (on Debian the bundle and each of the ~300 files of
//! /etc/ssl/certs). With a cold page cache, as `rpull bench` runs every pull, that took 20 ms on
//! this machine before the first request could leave, and a plain-HTTP registry never needs it.
//! [`LazyPlatformVerifier`] starts the same load on a thread and waits for it at the first
//! certificate to verify; everything else of the configuration is what reqwest would build.
//! A client that speaks plain HTTP to every registry reaches TLS only through a redirect (a
//! blob store, a token realm), so it loads the roots at the first certificate instead.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_platform_verifier::Verifier;

/// When a [`LazyPlatformVerifier`] loads its roots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadRoots {
    /// On a thread started now: the client will verify a certificate soon.
    Ahead,
    /// At the first certificate to verify: the client may never see one (plain HTTP).
    AtFirstUse,
}

/// A rustls configuration as reqwest would build it for a verifying client (its default crypto
/// provider, TLS 1.2 and 1.3, ALPN `h2` then `http/1.1`), trusting the platform's roots plus
/// `extra_roots`, loaded as `when` says.
pub(crate) fn client_config(
    extra_roots: Vec<CertificateDer<'static>>,
    when: LoadRoots,
) -> Result<ClientConfig, rustls::Error> {
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    let verifier = LazyPlatformVerifier::new(extra_roots, provider.clone(), when);
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

type Loaded = Result<Arc<Verifier>, rustls::Error>;

/// How the roots of a [`LazyPlatformVerifier`] are still to be loaded.
enum Pending {
    /// By this thread, to be joined.
    Thread(JoinHandle<Loaded>),
    /// By the first verification, with these extra roots.
    AtFirstUse(Vec<CertificateDer<'static>>),
}

/// `rustls_platform_verifier::Verifier`, built on a thread started with it (or at its first
/// use) and waited for when first needed.
pub(crate) struct LazyPlatformVerifier {
    provider: Arc<CryptoProvider>,
    /// The loading still to finish, until the first verification finishes it.
    loading: Mutex<Option<Pending>>,
    loaded: OnceLock<Loaded>,
}

impl LazyPlatformVerifier {
    /// Loads the platform's roots (and `extra_roots`) as `when` says; where no thread can be
    /// started, loads them now, as reqwest would.
    pub(crate) fn new(
        extra_roots: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
        when: LoadRoots,
    ) -> Self {
        let loaded = OnceLock::new();
        let loading = match when {
            LoadRoots::AtFirstUse => Some(Pending::AtFirstUse(extra_roots)),
            LoadRoots::Ahead => {
                let background = {
                    let (roots, provider) = (extra_roots.clone(), provider.clone());
                    move || load(roots, provider)
                };
                match std::thread::Builder::new()
                    .name("rpull-tls-roots".to_owned())
                    .spawn(background)
                {
                    Ok(handle) => Some(Pending::Thread(handle)),
                    Err(error) => {
                        tracing::debug!(%error, "no thread for loading the root certificates; loading them now");
                        let _ = loaded.set(load(extra_roots, provider.clone()));
                        None
                    }
                }
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
            let pending = self
                .loading
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            // `loaded` is set whenever nothing is pending, so something always is here.
            match pending {
                Some(Pending::Thread(handle)) => handle.join().unwrap_or_else(|_| {
                    Err(rustls::Error::General(
                        "loading the root certificates panicked".to_owned(),
                    ))
                }),
                Some(Pending::AtFirstUse(extra_roots)) => load(extra_roots, self.provider.clone()),
                None => Err(rustls::Error::General(
                    "the root certificates were not loaded".to_owned(),
                )),
            }
        });
        match loaded {
            Ok(verifier) => Ok(verifier),
            Err(error) => Err(error.clone()),
        }
    }

    /// Whether the roots are loaded (or their loading failed).
    #[cfg(test)]
    fn is_loaded(&self) -> bool {
        self.loaded.get().is_some()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::aws_lc_rs::default_provider())
    }

    fn verify_garbage(verifier: &LazyPlatformVerifier) -> rustls::Error {
        let name = ServerName::try_from("registry.example").unwrap();
        verifier
            .verify_server_cert(
                &CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]),
                &[],
                &name,
                &[],
                UnixTime::now(),
            )
            .expect_err("not a certificate")
    }

    #[test]
    fn roots_wanted_at_first_use_are_loaded_then_and_used() {
        let verifier = LazyPlatformVerifier::new(Vec::new(), provider(), LoadRoots::AtFirstUse);
        assert!(!verifier.is_loaded());
        assert!(matches!(
            *verifier.loading.lock().unwrap(),
            Some(Pending::AtFirstUse(_))
        ));
        // The first certificate loads the roots and is verified against them: refused here
        // as a bad certificate, not for want of roots.
        let error = verify_garbage(&verifier);
        assert!(verifier.is_loaded());
        assert!(verifier.verifier().is_ok(), "the roots loaded: {error}");
        assert!(!error.to_string().contains("root certificates"), "{error}");
    }

    #[test]
    fn roots_wanted_ahead_load_on_a_thread_started_at_once() {
        let verifier = LazyPlatformVerifier::new(Vec::new(), provider(), LoadRoots::Ahead);
        assert!(matches!(
            *verifier.loading.lock().unwrap(),
            Some(Pending::Thread(_))
        ));
        verify_garbage(&verifier);
        assert!(verifier.verifier().is_ok());
        assert!(verifier.loading.lock().unwrap().is_none());
    }
}
