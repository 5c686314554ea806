//! Self-tests of the registry harness: every variant starts and answers `/v2/` as expected.

use anyhow::Result;
use rpull_testing::{RegistryOptions, TestRegistry, TokenOptions};
use std::time::Duration;

fn client_for(registry: &TestRegistry) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder().no_proxy();
    if let Some(ca) = registry.ca_cert_path() {
        let pem = std::fs::read(ca)?;
        builder = builder.tls_certs_only([reqwest::Certificate::from_pem(&pem)?]);
    }
    Ok(builder.build()?)
}

async fn v2_status(registry: &TestRegistry) -> Result<reqwest::Response> {
    Ok(client_for(registry)?
        .get(format!("{}/v2/", registry.url()))
        .send()
        .await?)
}

#[tokio::test]
async fn plain_registry_answers_200() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::plain())?;
    assert!(registry.url().starts_with("http://127.0.0.1:"));
    assert_eq!(
        registry.reference("a/b:1"),
        format!("127.0.0.1:{}/a/b:1", registry.port())
    );
    let response = v2_status(&registry).await?;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response
            .headers()
            .get("docker-distribution-api-version")
            .map(|v| v.to_str().unwrap()),
        Some("registry/2.0")
    );
    Ok(())
}

#[tokio::test]
async fn htpasswd_registry_wants_basic_and_accepts_the_user() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::htpasswd("alice", "s3cret"))?;
    let response = v2_status(&registry).await?;
    assert_eq!(response.status(), 401);
    let challenge = response.headers()["www-authenticate"].to_str()?.to_owned();
    assert!(challenge.starts_with("Basic "), "{challenge}");

    let client = client_for(&registry)?;
    let url = format!("{}/v2/", registry.url());
    let ok = client
        .get(&url)
        .basic_auth("alice", Some("s3cret"))
        .send()
        .await?;
    assert_eq!(ok.status(), 200);
    let wrong = client
        .get(&url)
        .basic_auth("alice", Some("nope"))
        .send()
        .await?;
    assert_eq!(wrong.status(), 401);
    Ok(())
}

#[tokio::test]
async fn tls_registry_answers_with_the_generated_ca() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::tls())?;
    assert!(registry.url().starts_with("https://"));
    assert!(registry.ca_cert_path().unwrap().exists());
    assert_eq!(v2_status(&registry).await?.status(), 200);

    // The certificate must also be valid for "localhost".
    let localhost = format!("https://localhost:{}/v2/", registry.port());
    assert_eq!(
        client_for(&registry)?.get(localhost).send().await?.status(),
        200
    );

    // Without the CA the handshake fails.
    let untrusting = reqwest::Client::builder().no_proxy().build()?;
    assert!(
        untrusting
            .get(format!("{}/v2/", registry.url()))
            .send()
            .await
            .is_err()
    );
    Ok(())
}

/// Walks the token dance by hand: 401 challenge -> issuer -> bearer token -> 200.
async fn token_dance(registry: &TestRegistry, scope_path: &str) -> Result<(u16, String)> {
    let client = client_for(registry)?;
    let url = format!("{}{scope_path}", registry.url());
    let challenge_response = client.get(&url).send().await?;
    assert_eq!(challenge_response.status(), 401);
    let challenge = challenge_response.headers()["www-authenticate"]
        .to_str()?
        .to_owned();
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    let params = parse_challenge(&challenge);
    let realm = params
        .iter()
        .find(|(k, _)| k == "realm")
        .map(|(_, v)| v.clone())
        .unwrap();
    let mut token_url = url::Url::parse(&realm)?;
    for (key, value) in &params {
        if key == "service" || key == "scope" {
            token_url.query_pairs_mut().append_pair(key, value);
        }
    }
    let (user, password) = registry.credentials().unwrap();

    let anonymous = client.get(token_url.clone()).send().await?;
    assert_eq!(
        anonymous.status(),
        401,
        "anonymous token request must be refused"
    );

    let token_response: serde_json::Value = client
        .get(token_url)
        .basic_auth(user, Some(password))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let token = token_response["token"].as_str().unwrap().to_owned();
    assert!(token_response["expires_in"].as_u64().unwrap() > 0);
    let authorized = client.get(&url).bearer_auth(&token).send().await?;
    let status = authorized.status().as_u16();
    let body = authorized.text().await?;
    Ok((status, body))
}

fn parse_challenge(challenge: &str) -> Vec<(String, String)> {
    let rest = challenge.split_once(' ').map_or("", |(_, rest)| rest);
    let mut params = Vec::new();
    let mut remaining = rest;
    while let Some((key, after)) = remaining.split_once("=\"") {
        let Some((value, after_value)) = after.split_once('"') else {
            break;
        };
        params.push((
            key.trim_start_matches([',', ' ']).to_owned(),
            value.to_owned(),
        ));
        remaining = after_value;
    }
    params
}

#[tokio::test]
async fn token_registry_accepts_issued_jwt() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::token("bob", "hunter2"))?;
    let (status, body) = token_dance(&registry, "/v2/").await?;
    assert_eq!(
        status,
        200,
        "registry refused our token: {body}\nregistry log:\n{}",
        registry.log()
    );
    // A repository scope: the manifest does not exist, so an accepted token gives 404, not 401.
    let (status, body) = token_dance(&registry, "/v2/some/repo/manifests/latest").await?;
    assert_eq!(status, 404, "{body}\nregistry log:\n{}", registry.log());
    let issuer = registry.token_issuer().unwrap();
    assert_eq!(registry.token_requests(), 4);
    assert_eq!(issuer.tokens_issued(), 2);
    assert!(
        issuer
            .scopes_requested()
            .contains(&"repository:some/repo:pull".to_owned())
    );
    issuer.reset_counters();
    assert_eq!(registry.token_requests(), 0);
    Ok(())
}

#[tokio::test]
async fn token_with_tls_registry_accepts_issued_jwt() -> Result<()> {
    let mut options = TokenOptions::new("carol", "pw");
    options.lifetime = Duration::from_secs(1);
    let registry = TestRegistry::start(RegistryOptions::token_with(options).with_tls())?;
    let (status, body) = token_dance(&registry, "/v2/").await?;
    assert_eq!(status, 200, "{body}\nregistry log:\n{}", registry.log());
    Ok(())
}

#[test]
fn registry_is_gone_after_drop() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::plain())?;
    let port = registry.port();
    let storage = registry.storage_dir();
    assert!(storage.exists());
    drop(registry);
    assert!(!storage.exists());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    Ok(())
}

#[test]
fn many_registries_start_concurrently() -> Result<()> {
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| TestRegistry::start(RegistryOptions::plain()).map(|r| r.port()))
        })
        .collect();
    let mut ports = Vec::new();
    for handle in handles {
        ports.push(handle.join().unwrap()?);
    }
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 4);
    Ok(())
}
