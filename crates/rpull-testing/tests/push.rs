//! Fixture images pushed with the real client to every registry variant, read back with plain
//! reqwest (doing the auth dance by hand, so the harness is checked independently of the client).

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use rpull_testing::{
    Compression, ImageBuilder, IndexBuilder, LayerBuilder, ManifestFormat, Platform,
    RegistryOptions, TestRegistry, layer_from_dir, sha256_digest,
};

/// GET `path` on the registry, answering a Basic or Bearer challenge with its credentials.
async fn fetch(registry: &TestRegistry, path: &str, accept: &str) -> Result<(u16, Bytes)> {
    let mut builder = reqwest::Client::builder().no_proxy();
    if let Some(ca) = registry.ca_cert_path() {
        builder = builder.tls_certs_only([reqwest::Certificate::from_pem(&std::fs::read(ca)?)?]);
    }
    let http = builder.build()?;
    let url = format!("{}{path}", registry.url());
    let first = http.get(&url).header("accept", accept).send().await?;
    if first.status() != 401 {
        let status = first.status().as_u16();
        return Ok((status, first.bytes().await?));
    }
    let challenge = first.headers()["www-authenticate"].to_str()?.to_owned();
    let (user, password) = registry
        .credentials()
        .context("401 from a registry without credentials")?;
    let retry = http.get(&url).header("accept", accept);
    let retry = if challenge.starts_with("Basic") {
        retry.basic_auth(user, Some(password))
    } else if let Some(params) = challenge.strip_prefix("Bearer ") {
        let value = |key: &str| {
            params.split(',').find_map(|p| {
                p.trim()
                    .strip_prefix(&format!("{key}=\""))?
                    .strip_suffix('"')
                    .map(str::to_owned)
            })
        };
        let mut realm = url::Url::parse(&value("realm").context("realm")?)?;
        realm
            .query_pairs_mut()
            .append_pair("service", &value("service").context("service")?);
        if let Some(scope) = value("scope") {
            realm.query_pairs_mut().append_pair("scope", &scope);
        }
        let token: serde_json::Value = http
            .get(realm)
            .basic_auth(user, Some(password))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        retry.bearer_auth(token["token"].as_str().context("token")?)
    } else {
        bail!("unexpected challenge {challenge}");
    };
    let response = retry.send().await?;
    let status = response.status().as_u16();
    Ok((status, response.bytes().await?))
}

fn small_image(format: ManifestFormat) -> rpull_testing::Image {
    ImageBuilder::new()
        .format(format)
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/os-release", "ID=fixture\n", 0o644),
            Compression::Gzip,
        )
        .layer(
            LayerBuilder::new()
                .file("hello", "hello world\n", 0o755)
                .whiteout("etc/os-release"),
            Compression::Zstd,
        )
        .cmd(&["/hello"])
        .build()
}

async fn push_and_read_back(options: RegistryOptions) -> Result<()> {
    let registry = TestRegistry::start(options)?;
    let image = small_image(ManifestFormat::Oci);
    let pushed = registry.push_image(&image, "fixtures/small:v1").await?;
    assert_eq!(pushed.as_str(), image.manifest.digest);

    let (status, manifest) = fetch(
        &registry,
        "/v2/fixtures/small/manifests/v1",
        rpull_testing::media_type::OCI_MANIFEST,
    )
    .await?;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&manifest));
    assert_eq!(manifest, image.manifest.bytes);
    for layer in &image.layers {
        let (status, blob) = fetch(
            &registry,
            &format!("/v2/fixtures/small/blobs/{}", layer.digest),
            "*/*",
        )
        .await?;
        assert_eq!(status, 200);
        assert_eq!(sha256_digest(&blob), layer.digest);
    }
    // Pushing again skips existing blobs and yields the same digest.
    assert_eq!(
        registry.push_image(&image, "fixtures/small:v1").await?,
        pushed
    );
    Ok(())
}

#[tokio::test]
async fn push_to_plain_registry() -> Result<()> {
    push_and_read_back(RegistryOptions::plain()).await
}

#[tokio::test]
async fn push_to_htpasswd_registry() -> Result<()> {
    push_and_read_back(RegistryOptions::htpasswd("alice", "s3cret")).await
}

#[tokio::test]
async fn push_to_tls_registry() -> Result<()> {
    push_and_read_back(RegistryOptions::tls()).await
}

#[tokio::test]
async fn push_to_token_registry_counts_token_requests() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::token("bob", "hunter2"))?;
    let image = small_image(ManifestFormat::Oci);
    registry.push_image(&image, "fixtures/small:v1").await?;
    assert!(
        registry.token_requests() >= 1,
        "the client never asked the issuer for a token"
    );
    let scopes = registry.token_issuer().unwrap().scopes_requested();
    assert!(
        scopes
            .iter()
            .any(|s| s.contains("fixtures/small") && s.contains("push")),
        "{scopes:?}"
    );
    let (status, manifest) = fetch(
        &registry,
        "/v2/fixtures/small/manifests/v1",
        rpull_testing::media_type::OCI_MANIFEST,
    )
    .await?;
    assert_eq!(status, 200);
    assert_eq!(manifest, image.manifest.bytes);
    Ok(())
}

#[tokio::test]
async fn push_to_token_tls_registry() -> Result<()> {
    push_and_read_back(RegistryOptions::token("bob", "hunter2").with_tls()).await
}

#[tokio::test]
async fn push_docker_manifest_list() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::plain())?;
    let amd64 = ImageBuilder::new()
        .format(ManifestFormat::Docker)
        .platform(Platform::linux_amd64())
        .layer(
            LayerBuilder::new().file("arch", "amd64", 0o644),
            Compression::Gzip,
        )
        .build();
    let arm64 = ImageBuilder::new()
        .format(ManifestFormat::Docker)
        .platform(Platform::linux_arm64())
        .layer(
            LayerBuilder::new().file("arch", "arm64", 0o644),
            Compression::Gzip,
        )
        .build();
    let index = IndexBuilder::new(ManifestFormat::Docker)
        .image(amd64)
        .image(arm64)
        .build();
    let pushed = registry.push_index(&index, "multi:latest").await?;
    assert_eq!(pushed.as_str(), index.index.digest);

    let (status, body) = fetch(
        &registry,
        "/v2/multi/manifests/latest",
        rpull_testing::media_type::DOCKER_MANIFEST_LIST,
    )
    .await?;
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_slice(&body)?;
    assert_eq!(list["manifests"].as_array().unwrap().len(), 2);
    assert_eq!(list["manifests"][1]["platform"]["architecture"], "arm64");
    let arm_digest = list["manifests"][1]["digest"].as_str().unwrap();
    let (status, _) = fetch(
        &registry,
        &format!("/v2/multi/manifests/{arm_digest}"),
        rpull_testing::media_type::DOCKER_MANIFEST,
    )
    .await?;
    assert_eq!(status, 200);
    Ok(())
}

#[tokio::test]
async fn push_file_layer_chunked() -> Result<()> {
    let registry = TestRegistry::start(RegistryOptions::plain())?;
    let work = tempfile::tempdir()?;
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub"))?;
    // Bigger than one push chunk so the chunked upload really takes several PATCHes.
    let big: Vec<u8> = (0..(20u32 << 20))
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(src.join("sub/big.bin"), &big)?;
    std::fs::write(src.join("small"), "x")?;
    std::fs::hard_link(src.join("small"), src.join("small-link"))?;
    std::os::unix::fs::symlink("sub/big.bin", src.join("link"))?;
    let layer = layer_from_dir(&src, Compression::None, &work.path().join("layer.tar"))?;
    assert!(layer.size > 20 << 20);
    let image = ImageBuilder::new().image_layer(layer.clone()).build();
    registry.push_image(&image, "big:1").await?;
    let (status, blob) =
        fetch(&registry, &format!("/v2/big/blobs/{}", layer.digest), "*/*").await?;
    assert_eq!(status, 200);
    assert_eq!(blob.len() as u64, layer.size);
    assert_eq!(sha256_digest(&blob), layer.digest);
    assert_eq!(
        layer.digest, layer.diff_id,
        "uncompressed: digest == diff_id"
    );
    Ok(())
}
