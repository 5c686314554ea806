//! Reaching the registry: plain HTTP (flag and loopback fallback), TLS with and without a CA,
//! `--insecure`, and the proxy variables.

use rpull_testing::{RegistryOptions, TestProxy, TestRegistry};

use crate::common::{Sandbox, assert_small_image, registry_with_small_image};

fn start(options: RegistryOptions) -> (TestRegistry, String) {
    registry_with_small_image(TestRegistry::start(options).expect("starting docker-registry"))
}

#[test]
fn plain_http_loopback_registry_works_without_a_flag() {
    let (_registry, reference) = start(RegistryOptions::plain());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox.rpull().arg("-v").pull(&reference, &dest);
    outcome.success();
    assert_small_image(&dest);
    // HTTPS was tried first, and the registry's non-TLS answer led to plain HTTP.
    assert!(outcome.stderr.contains("https://127.0.0.1"), "{outcome}");
    assert!(
        outcome.stderr.contains("falling back to plain HTTP"),
        "{outcome}"
    );
}

#[test]
fn plain_http_flag_works() {
    let (_registry, reference) = start(RegistryOptions::plain());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .args(["pull", "-v", "--plain-http"])
        .arg(&reference)
        .arg(&dest)
        .run();
    outcome.success();
    assert_small_image(&dest);
    // No HTTPS attempt at all.
    assert!(outcome.stderr.contains("http://127.0.0.1"), "{outcome}");
    assert!(!outcome.stderr.contains("https://"), "{outcome}");
}

#[test]
fn tls_registry_with_ca_cert_works() {
    let (registry, reference) = start(RegistryOptions::tls());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let ca = registry.ca_cert_path().expect("a TLS registry has a CA");
    sandbox
        .rpull()
        .arg("--ca-cert")
        .arg(ca)
        .pull(&reference, &dest)
        .success();
    assert_small_image(&dest);
}

#[test]
fn tls_registry_without_ca_cert_fails_with_a_certificate_error() {
    let (registry, reference) = start(RegistryOptions::tls());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox.rpull().pull(&reference, &dest);
    let line = outcome.error_line().to_lowercase();
    assert!(line.contains("certificate"), "{outcome}");
    assert!(
        line.contains(&registry.host()),
        "names the registry\n{outcome}"
    );
    assert!(line.contains("--ca-cert"), "says how to fix it\n{outcome}");
    // A certificate error is never downgraded to plain HTTP, and nothing is left behind.
    assert!(!dest.exists());
    assert!(sandbox.staging_dirs(&dest).is_empty());
}

#[test]
fn tls_registry_trusted_by_the_system_roots_works() {
    // The platform verifier's roots (loaded on a thread of their own since the client no longer
    // waits for them at start) are where a CA the system trusts comes from; rustls-native-certs
    // takes them from SSL_CERT_FILE when it is set, as OpenSSL does.
    let (registry, reference) = start(RegistryOptions::tls());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let ca = registry.ca_cert_path().expect("a TLS registry has a CA");
    let outcome = sandbox
        .rpull()
        .env("SSL_CERT_FILE", ca)
        .args(["-v", "pull"])
        .arg(&reference)
        .arg(&dest)
        .run();
    outcome.success();
    assert_small_image(&dest);
    assert!(
        outcome.stderr.contains("root certificates loaded"),
        "{outcome}"
    );
}

#[test]
fn tls_registry_with_insecure_works() {
    let (_registry, reference) = start(RegistryOptions::tls());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    sandbox
        .rpull()
        .arg("pull")
        .arg("--insecure")
        .arg(&reference)
        .arg(&dest)
        .run()
        .success();
    assert_small_image(&dest);
}

#[test]
fn unreadable_ca_cert_is_an_error_naming_the_file() {
    let (_registry, reference) = start(RegistryOptions::tls());
    let sandbox = Sandbox::new();
    let not_pem = sandbox.write("not-a-cert.pem", "hello\n");
    let outcome = sandbox
        .rpull()
        .arg("pull")
        .arg("--ca-cert")
        .arg(&not_pem)
        .arg(&reference)
        .arg(sandbox.join("rootfs"))
        .run();
    let line = outcome.error_line();
    assert!(line.contains("not-a-cert.pem"), "{outcome}");
}

/// The GETs a pull of `small_image` as `app:1` makes, as a forward proxy sees them.
fn expected_gets(registry: &TestRegistry) -> Vec<String> {
    let image = crate::common::small_image();
    let mut gets = vec![format!("GET {}/v2/app/manifests/1", registry.url())];
    for layer in &image.layers {
        gets.push(format!(
            "GET {}/v2/app/blobs/{}",
            registry.url(),
            layer.digest
        ));
    }
    gets
}

fn assert_proxied(proxy: &TestProxy, registry: &TestRegistry, outcome: &crate::common::Outcome) {
    let log = proxy.request_log();
    for get in expected_gets(registry) {
        assert!(
            log.contains(&get),
            "the proxy did not see {get:?}; it saw {log:#?}\n{outcome}"
        );
    }
}

#[test]
fn http_proxy_variables_are_honoured_for_loopback_registries() {
    let (registry, reference) = start(RegistryOptions::plain());
    for variable in ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
        let proxy = TestProxy::start().expect("starting the proxy");
        let sandbox = Sandbox::new();
        let dest = sandbox.join("rootfs");
        let outcome = sandbox
            .rpull()
            .env(variable, proxy.url())
            .arg("pull")
            .arg("--plain-http")
            .arg(&reference)
            .arg(&dest)
            .run();
        outcome.success();
        assert_small_image(&dest);
        assert_proxied(&proxy, &registry, &outcome);
        assert!(
            proxy
                .request_log()
                .iter()
                .all(|r| r.starts_with("GET http://")),
            "{variable}: {:#?}",
            proxy.request_log()
        );
    }
}

#[test]
fn no_proxy_bypasses_the_proxy() {
    let (_registry, reference) = start(RegistryOptions::plain());
    for (variable, value) in [
        ("NO_PROXY", "127.0.0.1"),
        ("no_proxy", "127.0.0.1"),
        ("NO_PROXY", "example.invalid,127.0.0.0/8"),
    ] {
        let proxy = TestProxy::start().expect("starting the proxy");
        let sandbox = Sandbox::new();
        let dest = sandbox.join("rootfs");
        let outcome = sandbox
            .rpull()
            .env("HTTP_PROXY", proxy.url())
            .env(variable, value)
            .arg("pull")
            .arg("--plain-http")
            .arg(&reference)
            .arg(&dest)
            .run();
        outcome.success();
        assert_small_image(&dest);
        assert_eq!(
            proxy.request_log(),
            Vec::<String>::new(),
            "{variable}={value} must bypass the proxy\n{outcome}"
        );
    }
}

#[test]
fn https_proxy_tunnels_tls_registries() {
    let (registry, reference) = start(RegistryOptions::tls());
    let ca = registry.ca_cert_path().expect("a TLS registry has a CA");
    for variable in ["HTTPS_PROXY", "https_proxy"] {
        let proxy = TestProxy::start().expect("starting the proxy");
        let sandbox = Sandbox::new();
        let dest = sandbox.join("rootfs");
        let outcome = sandbox
            .rpull()
            .env(variable, proxy.url())
            .arg("pull")
            .arg("--ca-cert")
            .arg(ca)
            .arg(&reference)
            .arg(&dest)
            .run();
        outcome.success();
        assert_small_image(&dest);
        let log = proxy.request_log();
        assert!(
            !log.is_empty(),
            "{variable}: the proxy saw nothing\n{outcome}"
        );
        let connect = format!("CONNECT {}", registry.host());
        assert!(log.iter().all(|r| *r == connect), "{variable}: {log:#?}");
    }
}

#[test]
fn http_proxy_alone_does_not_proxy_https() {
    let (registry, reference) = start(RegistryOptions::tls());
    let proxy = TestProxy::start().expect("starting the proxy");
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .env("HTTP_PROXY", proxy.url())
        .arg("pull")
        .arg("--ca-cert")
        .arg(registry.ca_cert_path().expect("CA"))
        .arg(&reference)
        .arg(&dest)
        .run();
    outcome.success();
    assert_eq!(proxy.request_log(), Vec::<String>::new(), "{outcome}");
}

/// `NO_PROXY=*` means "no proxy for any host" (curl, Go's net/http, docker). A registry named by
/// host name bypasses the proxy.
#[test]
fn no_proxy_star_bypasses_the_proxy_for_host_names() {
    let (registry, _) = start(RegistryOptions::plain());
    let reference = format!("localhost:{}/app:1", registry.port());
    let proxy = TestProxy::start().expect("starting the proxy");
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .env("HTTP_PROXY", proxy.url())
        .env("NO_PROXY", "*")
        .args(["pull", "--plain-http", &reference])
        .arg(&dest)
        .run();
    outcome.success();
    assert_eq!(proxy.request_log(), Vec::<String>::new(), "{outcome}");
}

/// The same for a registry named by IP address: `NO_PROXY=*` must bypass the proxy for
/// `127.0.0.1:PORT` too.
#[test]
fn no_proxy_star_bypasses_the_proxy_for_ip_addresses() {
    let (_registry, reference) = start(RegistryOptions::plain());
    let proxy = TestProxy::start().expect("starting the proxy");
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .env("HTTP_PROXY", proxy.url())
        .env("NO_PROXY", "*")
        .args(["pull", "--plain-http", &reference])
        .arg(&dest)
        .run();
    outcome.success();
    assert_eq!(
        proxy.request_log(),
        Vec::<String>::new(),
        "NO_PROXY=* must bypass the proxy for IP hosts\n{outcome}"
    );
}

#[test]
fn ca_cert_is_repeatable() {
    let (first, first_reference) = start(RegistryOptions::tls());
    let (second, second_reference) = start(RegistryOptions::tls());
    let sandbox = Sandbox::new();
    for (index, reference) in [first_reference, second_reference].iter().enumerate() {
        let dest = sandbox.join(&format!("rootfs-{index}"));
        let outcome = sandbox
            .rpull()
            .arg("--ca-cert")
            .arg(first.ca_cert_path().expect("CA"))
            .arg("--ca-cert")
            .arg(second.ca_cert_path().expect("CA"))
            .pull(reference, &dest);
        outcome.success();
        assert_small_image(&dest);
    }
    // Each registry has its own CA: with only the first, the second is refused.
    let outcome = sandbox
        .rpull()
        .arg("--ca-cert")
        .arg(first.ca_cert_path().expect("CA"))
        .pull(&second.reference("app:1"), &sandbox.join("refused"));
    assert!(outcome.error_line().contains("certificate"), "{outcome}");
}

#[test]
fn localhost_registry_falls_back_to_plain_http() {
    let (registry, _) = start(RegistryOptions::plain());
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .pull(&format!("localhost:{}/app:1", registry.port()), &dest);
    outcome.success();
    assert_small_image(&dest);
}
