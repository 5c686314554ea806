//! Credentials: `--username` + `--password-stdin`, the docker and podman auth files in their
//! order, credential helpers, and token auth.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use rpull_testing::{Compression, ImageBuilder, LayerBuilder, RegistryOptions, TestRegistry};

use crate::common::{
    Outcome, SYSTEM_PATH, Sandbox, assert_small_image, auth_file, basic_auth, block_on,
    registry_with_small_image,
};

const USER: &str = "rpull-user";
const PASSWORD: &str = "s3cret-Pass-7781";
const WRONG: &str = "wrong-Pass-4402";

fn htpasswd_registry() -> (TestRegistry, String) {
    registry_with_small_image(
        TestRegistry::start(RegistryOptions::htpasswd(USER, PASSWORD))
            .expect("starting docker-registry"),
    )
}

/// Neither the secret nor its Basic encoding appears anywhere in what rpull printed.
fn assert_no_secret(outcome: &Outcome, secret: &str) {
    let encoded = basic_auth(USER, secret);
    for (name, text) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
        assert!(
            !text.contains(secret),
            "{name} shows the password\n{outcome}"
        );
        assert!(
            !text.contains(&encoded),
            "{name} shows the Basic credentials\n{outcome}"
        );
    }
}

#[test]
fn username_and_password_stdin() {
    let (_registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .args(["pull", "--username", USER, "--password-stdin"])
        .arg(&reference)
        .arg(&dest)
        .stdin(format!("{PASSWORD}\n"))
        .run();
    outcome.success();
    assert_small_image(&dest);
    assert_no_secret(&outcome, PASSWORD);
}

#[test]
fn anonymous_pull_from_an_htpasswd_registry_is_unauthorized() {
    let (registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox.rpull().pull(&reference, &dest);
    let line = outcome.error_line();
    assert!(line.contains("unauthorized"), "{outcome}");
    assert!(line.contains(&registry.host()), "{outcome}");
    assert!(!dest.exists());
}

#[test]
fn wrong_password_is_refused_without_showing_it() {
    let (registry, reference) = htpasswd_registry();
    for verbosity in [None, Some("-v"), Some("-vv")] {
        let sandbox = Sandbox::new();
        let dest = sandbox.join("rootfs");
        let mut rpull = sandbox.rpull();
        if let Some(flag) = verbosity {
            rpull = rpull.arg(flag);
        }
        let outcome = rpull
            .args(["pull", "-u", USER, "--password-stdin"])
            .arg(&reference)
            .arg(&dest)
            .stdin(WRONG)
            .run();
        assert_eq!(outcome.code, Some(1), "{outcome}");
        let error = outcome
            .stderr
            .lines()
            .find(|line| line.starts_with("rpull: error: "))
            .unwrap_or_else(|| panic!("no error line\n{outcome}"));
        assert!(error.contains("unauthorized"), "{outcome}");
        assert!(error.contains(&registry.host()), "{outcome}");
        if verbosity.is_none() {
            outcome.error_line();
        } else {
            assert!(
                outcome.stderr.lines().count() > 1,
                "{verbosity:?} must log something\n{outcome}"
            );
        }
        assert_no_secret(&outcome, WRONG);
        assert!(!dest.exists());
    }
}

#[test]
fn empty_password_stdin_is_refused() {
    let (_registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    let outcome = sandbox
        .rpull()
        .args(["pull", "-u", USER, "--password-stdin"])
        .arg(&reference)
        .arg(sandbox.join("rootfs"))
        .run();
    assert!(
        outcome.error_line().contains("--password-stdin"),
        "{outcome}"
    );
}

#[test]
fn username_without_password_stdin_is_refused_by_clap() {
    let sandbox = Sandbox::new();
    for args in [
        vec!["pull", "--username", USER, "r/x:1", "d"],
        vec!["pull", "--password-stdin", "r/x:1", "d"],
    ] {
        let outcome = sandbox.rpull().args(&args).run();
        assert_eq!(outcome.code, Some(2), "clap's usage error\n{outcome}");
        assert!(outcome.stderr.contains("--password-stdin"), "{outcome}");
        assert!(outcome.stderr.contains("--username"), "{outcome}");
        assert!(!sandbox.join("d").exists());
    }
}

/// Pulls with the given environment (plus PATH/HOME) and returns the outcome.
fn pull_with_env(sandbox: &Sandbox, reference: &str, env: &[(&str, &Path)]) -> Outcome {
    let dest = sandbox.join(&format!("rootfs-{}", rand_suffix()));
    let mut rpull = sandbox.rpull();
    for (key, value) in env {
        rpull = rpull.env(key, value);
    }
    let outcome = rpull.pull(reference, &dest);
    if outcome.code == Some(0) {
        assert_small_image(&dest);
    }
    outcome
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

#[test]
fn docker_config_dir() {
    let (registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    let config = sandbox.write(
        "docker/config.json",
        auth_file(&registry.host(), USER, PASSWORD),
    );
    let outcome = pull_with_env(
        &sandbox,
        &reference,
        &[("DOCKER_CONFIG", config.parent().unwrap())],
    );
    outcome.success();
    assert_no_secret(&outcome, PASSWORD);
    // A DOCKER_CONFIG without an entry for the registry: anonymous, refused.
    let other = sandbox.write(
        "other/config.json",
        auth_file("example.invalid", USER, PASSWORD),
    );
    let outcome = pull_with_env(
        &sandbox,
        &reference,
        &[("DOCKER_CONFIG", other.parent().unwrap())],
    );
    assert!(outcome.error_line().contains("unauthorized"), "{outcome}");
}

#[test]
fn home_docker_config_when_docker_config_is_unset() {
    let (registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    sandbox.write(
        "home/.docker/config.json",
        auth_file(&registry.host(), USER, PASSWORD),
    );
    pull_with_env(&sandbox, &reference, &[]).success();
    // With DOCKER_CONFIG set (to a directory without the entry), ~/.docker is not read.
    let empty = sandbox.join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let outcome = pull_with_env(&sandbox, &reference, &[("DOCKER_CONFIG", &empty)]);
    assert!(outcome.error_line().contains("unauthorized"), "{outcome}");
}

#[test]
fn username_and_password_fields_in_auths() {
    let (registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    let file = serde_json::json!({
        "auths": { registry.host(): { "username": USER, "password": PASSWORD } }
    });
    let config = sandbox.write("docker/config.json", file.to_string());
    pull_with_env(
        &sandbox,
        &reference,
        &[("DOCKER_CONFIG", config.parent().unwrap())],
    )
    .success();
}

#[test]
fn registry_auth_file() {
    let (registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    let file = sandbox.write("auth.json", auth_file(&registry.host(), USER, PASSWORD));
    pull_with_env(&sandbox, &reference, &[("REGISTRY_AUTH_FILE", &file)]).success();
}

#[test]
fn xdg_runtime_dir_containers_auth_json() {
    let (registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    sandbox.write(
        "run/containers/auth.json",
        auth_file(&registry.host(), USER, PASSWORD),
    );
    pull_with_env(
        &sandbox,
        &reference,
        &[("XDG_RUNTIME_DIR", &sandbox.join("run"))],
    )
    .success();
}

#[test]
fn credential_sources_are_tried_in_the_documented_order() {
    let (registry, reference) = htpasswd_registry();
    let host = registry.host();
    let sandbox = Sandbox::new();
    let right = |name: &str| sandbox.write(name, auth_file(&host, USER, PASSWORD));
    let wrong = |name: &str| sandbox.write(name, auth_file(&host, USER, WRONG));

    // REGISTRY_AUTH_FILE > XDG_RUNTIME_DIR > DOCKER_CONFIG: in each pair the first one decides.
    let cases = [
        (
            "a/auth.json",
            "a/run/containers/auth.json",
            "REGISTRY_AUTH_FILE",
            "XDG_RUNTIME_DIR",
        ),
        (
            "b/auth.json",
            "b/docker/config.json",
            "REGISTRY_AUTH_FILE",
            "DOCKER_CONFIG",
        ),
        (
            "c/run/containers/auth.json",
            "c/docker/config.json",
            "XDG_RUNTIME_DIR",
            "DOCKER_CONFIG",
        ),
    ];
    for (first_file, second_file, first_var, second_var) in cases {
        let var_value = |var: &str, file: &Path| match var {
            "REGISTRY_AUTH_FILE" => file.to_owned(),
            "XDG_RUNTIME_DIR" => file.parent().unwrap().parent().unwrap().to_owned(),
            _ => file.parent().unwrap().to_owned(),
        };
        // First right, second wrong: works.
        let first = right(first_file);
        let second = wrong(second_file);
        let env = [
            (first_var, var_value(first_var, &first)),
            (second_var, var_value(second_var, &second)),
        ];
        let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
        let outcome = pull_with_env(&sandbox, &reference, &env);
        assert_eq!(
            outcome.code,
            Some(0),
            "{first_var} must win over {second_var}\n{outcome}"
        );
        // First wrong, second right: refused (the first entry found is used, not tried in turn).
        wrong(first_file);
        right(second_file);
        let outcome = pull_with_env(&sandbox, &reference, &env);
        assert_eq!(
            outcome.code,
            Some(1),
            "{first_var} must win over {second_var}\n{outcome}"
        );
        assert!(outcome.stderr.contains("unauthorized"), "{outcome}");
        assert_no_secret(&outcome, WRONG);
    }

    // --username with --password-stdin wins over every file.
    let file = wrong("d/auth.json");
    let outcome = sandbox
        .rpull()
        .env("REGISTRY_AUTH_FILE", &file)
        .args(["pull", "-u", USER, "--password-stdin"])
        .arg(&reference)
        .arg(sandbox.join("rootfs-flags"))
        .stdin(PASSWORD)
        .run();
    outcome.success();
}

/// Writes `docker-credential-rpulltest` into `bin/`: it logs its argument and the server it was
/// asked about to `helper.log`, answers for `host` and says "credentials not found" otherwise.
fn write_helper(sandbox: &Sandbox, host: &str) -> std::path::PathBuf {
    let log = sandbox.join("helper.log");
    let script = format!(
        r#"#!/bin/sh
read -r server || true
echo "$1 $server" >> '{log}'
if [ "$1" = get ] && [ "$server" = '{host}' ]; then
    printf '{{"ServerURL":"%s","Username":"{USER}","Secret":"{PASSWORD}"}}\n' "$server"
    exit 0
fi
echo "credentials not found in native keychain"
exit 1
"#,
        log = log.display()
    );
    let helper = sandbox.write("bin/docker-credential-rpulltest", script);
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    helper.parent().unwrap().to_owned()
}

fn helper_log(sandbox: &Sandbox) -> String {
    std::fs::read_to_string(sandbox.join("helper.log")).unwrap_or_default()
}

#[test]
fn cred_helpers_run_the_named_helper() {
    let (registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    let bin = write_helper(&sandbox, &registry.host());
    let path = format!("{}:{SYSTEM_PATH}", bin.display());
    let config = serde_json::json!({ "credHelpers": { registry.host(): "rpulltest" } });
    let config = sandbox.write("docker/config.json", config.to_string());
    let outcome = sandbox
        .rpull()
        .env("PATH", &path)
        .env("DOCKER_CONFIG", config.parent().unwrap())
        .pull(&reference, &sandbox.join("rootfs"));
    outcome.success();
    assert_small_image(&sandbox.join("rootfs"));
    assert_no_secret(&outcome, PASSWORD);
    assert_eq!(helper_log(&sandbox), format!("get {}\n", registry.host()));

    // The helper missing from PATH: an error naming it.
    let outcome = sandbox
        .rpull()
        .env("DOCKER_CONFIG", config.parent().unwrap())
        .pull(&reference, &sandbox.join("rootfs-2"));
    let line = outcome.error_line();
    assert!(line.contains("docker-credential-rpulltest"), "{outcome}");
}

#[test]
fn creds_store_runs_the_default_helper() {
    let (registry, reference) = htpasswd_registry();
    let sandbox = Sandbox::new();
    let bin = write_helper(&sandbox, &registry.host());
    let path = format!("{}:{SYSTEM_PATH}", bin.display());
    let config = sandbox.write("docker/config.json", r#"{"credsStore":"rpulltest"}"#);
    let outcome = sandbox
        .rpull()
        .env("PATH", &path)
        .env("DOCKER_CONFIG", config.parent().unwrap())
        .pull(&reference, &sandbox.join("rootfs"));
    outcome.success();
    assert_small_image(&sandbox.join("rootfs"));
    assert_eq!(helper_log(&sandbox), format!("get {}\n", registry.host()));
}

#[test]
fn token_auth_pull_asks_the_issuer_once_per_scope() {
    let registry = TestRegistry::start(RegistryOptions::token(USER, PASSWORD))
        .expect("starting docker-registry with a token issuer");
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("one", "1\n", 0o644),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new().file("two", "2\n", 0o644),
            Compression::Zstd,
        )
        .layer(
            LayerBuilder::new().file("three", "3\n", 0o644),
            Compression::None,
        )
        .build();
    block_on(registry.push_image(&image, "tok:1")).expect("pushing tok:1");
    let issuer = registry
        .token_issuer()
        .expect("token registry has an issuer");
    issuer.reset_counters();

    let sandbox = Sandbox::new();
    let dest = sandbox.join("rootfs");
    let outcome = sandbox
        .rpull()
        .args(["pull", "-u", USER, "--password-stdin"])
        .arg(registry.reference("tok:1"))
        .arg(&dest)
        .stdin(PASSWORD)
        .run();
    outcome.success();
    for (name, content) in [("one", "1\n"), ("two", "2\n"), ("three", "3\n")] {
        assert_eq!(
            std::fs::read_to_string(dest.join(name)).expect("read"),
            content
        );
    }
    let requests = registry.token_requests();
    // One repository, one scope: one token serves the manifest and all three blobs.
    assert_eq!(
        requests,
        1,
        "one pull of 3 layers asked for {requests} tokens (scopes {:?})",
        issuer.scopes_requested()
    );
    assert_no_secret(&outcome, PASSWORD);

    // Without credentials the issuer refuses: a one-line error.
    let outcome = sandbox
        .rpull()
        .pull(&registry.reference("tok:1"), &sandbox.join("anon"));
    outcome.error_line();
}
