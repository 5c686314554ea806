//! Pushes a tiny two-platform image to a registry and pulls it back, checking every step.
//!
//! `cargo run -p rpull-registry --example push_and_pull -- 127.0.0.1:5000/demo/tiny [ca.pem|insecure]`

use bytes::Bytes;
use futures_util::StreamExt as _;
use rpull_registry::{
    Client, CredentialStore, Digest, DigestVerifier, MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_MANIFEST,
    Platform, Reference,
};

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let target: Reference = args
        .next()
        .ok_or("usage: push_and_pull <registry/repo> [ca.pem|insecure]")?
        .parse()?;
    let mut builder = Client::builder().credential_store(CredentialStore::from_env());
    match args.next().as_deref() {
        Some("insecure") => builder = builder.insecure(true),
        Some(ca) => builder = builder.ca_cert(ca),
        None => {}
    }
    let client = builder.build()?;

    let layer = Bytes::from(vec![b'x'; 300_000]);
    let layer_digest = Digest::sha256_of(&layer);
    let config = Bytes::from_static(
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
    );
    let config_digest = Digest::sha256_of(&config);

    client
        .push_blob(&target, &config_digest, config.clone())
        .await?;
    client
        .push_blob_chunked(&target, &layer_digest, &layer[..], 64 * 1024)
        .await?;
    assert!(client.blob_exists(&target, &layer_digest).await?);
    println!("pushed blobs");

    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len()}],
    });
    let manifest = Bytes::from(serde_json::to_vec(&manifest)?);
    let manifest_digest = client
        .push_manifest(&target, "single", MEDIA_TYPE_OCI_MANIFEST, manifest.clone())
        .await?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_INDEX,
        "manifests": [
            {"mediaType": MEDIA_TYPE_OCI_MANIFEST, "digest": manifest_digest, "size": manifest.len(),
             "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"mediaType": MEDIA_TYPE_OCI_MANIFEST, "digest": manifest_digest, "size": manifest.len(),
             "platform": {"os": "linux", "architecture": "amd64"}},
        ],
    });
    let index_digest = client
        .push_manifest(
            &target,
            "multi",
            MEDIA_TYPE_OCI_INDEX,
            Bytes::from(serde_json::to_vec(&index)?),
        )
        .await?;
    println!("pushed manifest {manifest_digest} and index {index_digest}");

    let other = Reference::parse(&format!(
        "{}/{}-copy",
        target.registry(),
        target.repository()
    ))?;
    assert!(
        client
            .mount_blob(&other, target.repository(), &layer_digest)
            .await?
    );
    assert!(
        !client
            .mount_blob(&other, "no/such-repo", &config_digest)
            .await?
    );
    println!("mount: mounted from the source repo, fell back for a missing one");

    let amd64 = Platform::new("linux", "amd64", None);
    for tag in ["single", "multi"] {
        let image = client.resolve(&target.with_tag(tag)?, &amd64).await?;
        assert_eq!(image.manifest_digest, manifest_digest);
        println!(
            "{tag}: {} platform={:?} layers={}",
            image.manifest_media_type,
            image.platform,
            image.layers.len()
        );
    }
    let by_digest = client
        .resolve(
            &target.with_digest(index_digest.clone()),
            &Platform::new("linux", "arm64", None),
        )
        .await?;
    assert_eq!(by_digest.index_digest, Some(index_digest));
    match client
        .resolve(
            &target.with_tag("multi")?,
            &Platform::new("linux", "s390x", None),
        )
        .await
    {
        Err(e) => println!("expected error: {e}"),
        Ok(_) => return Err("s390x should not match".into()),
    }
    match client.resolve(&target.with_tag("missing")?, &amd64).await {
        Err(e) => println!("expected error: {e}"),
        Ok(_) => return Err("missing tag should not resolve".into()),
    }

    let mut stream = client.get_blob(&target, &layer_digest).await?;
    println!("content length {:?}", stream.content_length());
    let mut verifier = DigestVerifier::new(&layer_digest, Some(layer.len() as u64));
    while let Some(chunk) = stream.next().await {
        verifier.update(&chunk?);
    }
    verifier.finish()?;
    let mut range = client
        .get_blob_range(&target, &layer_digest, 10..20)
        .await?;
    let mut got = Vec::new();
    while let Some(chunk) = range.next().await {
        got.extend_from_slice(&chunk?);
    }
    assert_eq!(got, &layer[10..20]);
    println!("blob streamed and verified; range ok");
    Ok(())
}
