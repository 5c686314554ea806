use std::path::Path;
use std::sync::Arc;

use rpull_registry::{Client, Reference};

use crate::pipeline;
use crate::{PullError, PullEvent, PullOptions, PullReport};

type EventSink = Arc<dyn Fn(&PullEvent) + Send + Sync>;

/// Pulls images into root filesystems. Cheap to clone; one `Puller` can run many pulls.
#[derive(Clone)]
pub struct Puller {
    pub(crate) client: Client,
    pub(crate) options: PullOptions,
    pub(crate) events: Option<EventSink>,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Puller`].
#[derive(Default)]
pub struct PullerBuilder {
    client: Option<Client>,
    options: PullOptions,
    events: Option<EventSink>,
}

impl std::fmt::Debug for PullerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullerBuilder")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl PullerBuilder {
    /// The registry client to use (transport, TLS, credentials). Without one, a client with
    /// the defaults (HTTPS, system roots, credentials from the docker/podman files) is built.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// What the pull does (platform, concurrency, force, extraction options).
    pub fn options(mut self, options: PullOptions) -> Self {
        self.options = options;
        self
    }

    /// Called with every [`PullEvent`], from the pull's tasks; keep it quick.
    pub fn on_event(mut self, f: impl Fn(&PullEvent) + Send + Sync + 'static) -> Self {
        self.events = Some(Arc::new(f));
        self
    }

    /// The puller. Fails only when the default registry client cannot be built.
    pub fn build(self) -> Result<Puller, PullError> {
        let client = match self.client {
            Some(client) => client,
            None => Client::builder().build()?,
        };
        let mut options = self.options;
        options.max_concurrent_downloads = options.max_concurrent_downloads.max(1);
        Ok(Puller {
            client,
            options,
            events: self.events,
        })
    }
}

impl Puller {
    /// A builder with the default options.
    pub fn builder() -> PullerBuilder {
        PullerBuilder::default()
    }

    /// Pulls `reference` into `dest`, which must not exist, be an empty directory, or (with
    /// `force`) be replaceable. `dest` appears only when the whole pull succeeded; dropping the
    /// returned future cancels the pull and removes everything it wrote.
    pub async fn pull(&self, reference: &Reference, dest: &Path) -> Result<PullReport, PullError> {
        pipeline::pull(self, reference, dest).await
    }

    /// The options this puller uses.
    pub fn options(&self) -> &PullOptions {
        &self.options
    }

    pub(crate) fn emit(&self, event: PullEvent) {
        if let Some(sink) = &self.events {
            sink(&event);
        }
    }
}
