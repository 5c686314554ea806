//! A client configured for a `TestRegistry`, and pushing fixture images to it.

use anyhow::Result;
use rpull_image::{Image, ImageIndex};
use rpull_registry::{Client, CredentialStore, Credentials, Digest};

use crate::registry::TestRegistry;

impl TestRegistry {
    /// A client set up for this registry: plain HTTP or its CA, its credentials, and no
    /// credentials from the user's docker/podman files.
    pub fn client(&self) -> Result<Client> {
        let mut builder = Client::builder()
            .plain_http(!self.is_tls())
            .credential_store(CredentialStore::empty());
        if let Some(ca) = self.ca_cert_path() {
            builder = builder.ca_cert(ca);
        }
        if let Some((user, password)) = self.credentials() {
            builder = builder.credentials(&self.host(), Credentials::basic(user, password));
        }
        Ok(builder.build()?)
    }

    /// Pushes `image` as `repo_tag` (e.g. `"app:1.0"`) with `client()`.
    pub async fn push_image(&self, image: &Image, repo_tag: &str) -> Result<Digest> {
        Ok(image
            .push(&self.client()?, &self.reference(repo_tag))
            .await?)
    }

    /// Pushes `index` as `repo_tag` with `client()`.
    pub async fn push_index(&self, index: &ImageIndex, repo_tag: &str) -> Result<Digest> {
        Ok(index
            .push(&self.client()?, &self.reference(repo_tag))
            .await?)
    }
}
