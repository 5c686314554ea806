//! The counting proxy forwards plain HTTP (absolute URI) and tunnels HTTPS (CONNECT).

use anyhow::Result;
use rpull_testing::{
    Compression, ImageBuilder, LayerBuilder, RegistryOptions, TestProxy, TestRegistry,
};

fn proxied_client(proxy: &TestProxy, registry: &TestRegistry) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder().proxy(reqwest::Proxy::all(proxy.url())?);
    if let Some(ca) = registry.ca_cert_path() {
        builder = builder.tls_certs_only([reqwest::Certificate::from_pem(&std::fs::read(ca)?)?]);
    }
    Ok(builder.build()?)
}

#[tokio::test]
async fn plain_http_goes_through_the_proxy() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::plain())?;
    let image = ImageBuilder::new()
        .layer(
            LayerBuilder::new().file("f", "proxied", 0o644),
            Compression::Gzip,
        )
        .build();
    registry.push_image(&image, "p:1").await?;
    let proxy = TestProxy::start()?;
    let client = proxied_client(&proxy, &registry)?;

    let url = format!("{}/v2/p/blobs/{}", registry.url(), image.layers[0].digest);
    for _ in 0..2 {
        let response = client.get(&url).send().await?;
        assert_eq!(response.status(), 200);
        assert_eq!(response.bytes().await?, image.layers[0].bytes()?);
    }
    assert_eq!(proxy.requests(), 2);
    assert_eq!(proxy.request_log()[0], format!("GET {url}"));
    // A HEAD (no body) and a 404 pass through too.
    let head = client
        .head(format!("{}/v2/p/manifests/nope", registry.url()))
        .send()
        .await?;
    assert_eq!(head.status(), 404);
    assert_eq!(proxy.requests(), 3);
    proxy.reset();
    assert_eq!(proxy.requests(), 0);
    Ok(())
}

#[tokio::test]
async fn https_is_tunnelled_with_connect() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::tls())?;
    let proxy = TestProxy::start()?;
    let client = proxied_client(&proxy, &registry)?;
    let response = client.get(format!("{}/v2/", registry.url())).send().await?;
    assert_eq!(response.status(), 200);
    assert_eq!(
        proxy.request_log(),
        [format!("CONNECT {}", registry.host())]
    );
    Ok(())
}

#[tokio::test]
async fn push_through_the_proxy_forwards_bodies() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::plain())?;
    let proxy = TestProxy::start()?;
    let client = proxied_client(&proxy, &registry)?;
    // A monolithic blob upload: POST, then PUT with a body.
    let body = b"blob through the proxy".to_vec();
    let digest = rpull_testing::sha256_digest(&body);
    let start = client
        .post(format!("{}/v2/up/blobs/uploads/", registry.url()))
        .send()
        .await?;
    assert_eq!(start.status(), 202);
    let location = start.headers()["location"].to_str()?.to_owned();
    let location = if location.starts_with("http") {
        location
    } else {
        format!("{}{location}", registry.url())
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    let put = client
        .put(format!("{location}{separator}digest={digest}"))
        .body(body.clone())
        .send()
        .await?;
    assert_eq!(put.status(), 201, "{}", put.text().await?);
    let got = client
        .get(format!("{}/v2/up/blobs/{digest}", registry.url()))
        .send()
        .await?
        .bytes()
        .await?;
    assert_eq!(got, body);
    assert_eq!(proxy.requests(), 3);
    Ok(())
}
