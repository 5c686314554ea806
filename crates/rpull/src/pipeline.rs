//! Wires the stages: resolve -> per layer (download + verify -> decompress -> extract into
//! staging, concurrently) -> merge in layer order -> finalize -> commit by rename.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use rpull_decompress::Codec;
use rpull_extract::{
    CreateGate, ExtractOptions, LayerSummary, extract_layer_from, finalize_tree, merge_layer,
};
use rpull_registry::{BackgroundVerifier, Descriptor, RangeBudget, Reference};
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span};

use crate::channel_reader::{ChannelReader, CountingReader};
use crate::decoding::{LayerDecoding, Metered};
use crate::durability::{WRITEBACK_STEP, Writeback, WritebackCounter, fsync_dir, syncfs};
use crate::staging::{DestinationState, Staging, destination_state};
use crate::{FsyncPolicy, LayerReport, LayerState, PullError, PullEvent, PullReport, Puller};

/// Chunks in flight between a download and its extraction thread. reqwest hands out chunks of
/// up to a few tens of KiB, so this bounds a layer's buffered bytes to about a MiB.
const CHANNEL_DEPTH: usize = 32;
/// Bytes between two progress events of one layer.
const PROGRESS_STEP: u64 = 256 * 1024;

pub(crate) async fn pull(
    puller: &Puller,
    reference: &Reference,
    dest: &Path,
) -> Result<PullReport, PullError> {
    let started = Instant::now();
    let options = &puller.options;
    if !options.force && matches!(destination_state(dest)?, DestinationState::Occupied) {
        return Err(PullError::DestinationNotEmpty {
            path: dest.to_owned(),
        });
    }

    let image = puller.client.resolve(reference, &options.platform).await?;
    let reference_name = image.reference.to_string();
    let codecs = image
        .layers
        .iter()
        .enumerate()
        .map(|(index, layer)| {
            Codec::from_media_type(&layer.media_type)
                .map(|(codec, _)| codec)
                .map_err(|source| PullError::UnsupportedLayer {
                    reference: reference_name.clone(),
                    index,
                    digest: layer.digest.clone(),
                    source,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let platform = image
        .platform
        .as_ref()
        .unwrap_or(&options.platform)
        .to_string();
    puller.emit(PullEvent::Resolved {
        reference: reference_name.clone(),
        manifest_digest: image.manifest_digest.clone(),
        platform: platform.clone(),
        layers: image
            .layers
            .iter()
            .map(|l| (l.digest.clone(), l.size))
            .collect(),
    });

    // Drop order matters on error and cancellation: the tasks are aborted first, then the
    // threads are cancelled and joined, and only then is the staging directory removed.
    let staging = Staging::create(dest)?;
    let fsync = options.fsync.resolve(&staging.rootfs());
    let mut sync_seconds = 0.0;
    // A durable pull starts writing back while it extracts; `none` leaves it to the kernel.
    let writeback = if matches!(fsync, FsyncPolicy::End | FsyncPolicy::Layer) {
        Some(
            Writeback::start(&staging.rootfs(), WRITEBACK_STEP).map_err(|source| {
                PullError::Io {
                    action: "starting the write-back of",
                    path: staging.rootfs(),
                    source,
                }
            })?,
        )
    } else {
        None
    };
    let threads = Threads::new();
    let mut tasks = JoinSet::new();

    let semaphore = Arc::new(Semaphore::new(options.max_concurrent_downloads));
    // Layers extracted at once, when limited (`max_concurrent_extractions`).
    let extraction_slots = options
        .max_concurrent_extractions
        .map(|slots| Arc::new(Semaphore::new(slots.max(1))));
    // Layers extracted at once into ext4 without a journal contend in its inode allocator. One
    // gate for the whole pull makes their inodes one at a time on every file system but those
    // where creating from several threads was measured faster (tmpfs, ramfs, ext4 with a
    // journal), unless the caller gave a gate.
    let range_budget = RangeBudget::new(options.range_budget);
    let create_gate =
        CreateGate::shared_for(options.extract.create_gate.as_ref(), &staging.rootfs());
    debug!(
        parallel_creation = ?rpull_extract::parallel_creation_scales(&staging.rootfs()),
        gate = create_gate.is_some(),
        backend = ?options.extract.backend,
        write_threads_with_std = options.extract.write_threads_for(&staging.rootfs()),
        files_made_on_extracting_thread = options.extract.creates_on_extracting_thread(&staging.rootfs()),
        "inode creation"
    );
    // The biggest layer is the pipeline's critical path: layers much smaller than it run their
    // decode and extract threads at a lower priority, filling the cores around it instead of
    // taking turns with it.
    let background = background_layers(&image.layers.iter().map(|l| l.size).collect::<Vec<_>>());
    for (index, (descriptor, codec)) in image.layers.iter().zip(codecs).enumerate() {
        let target = if index == 0 {
            staging.rootfs()
        } else {
            staging.new_layer_dir(index)?
        };
        let job = LayerJob {
            index,
            descriptor: descriptor.clone(),
            codec,
            target,
            background: background[index],
            writeback: writeback.as_ref().map(Writeback::counter),
            create_gate: create_gate.clone(),
            range_budget: range_budget.clone(),
        };
        let span = info_span!("layer", index, digest = %descriptor.digest);
        tasks.spawn(
            layer_task(
                job,
                puller.clone(),
                image.reference.clone(),
                semaphore.clone(),
                extraction_slots.clone(),
                threads.spawner(),
            )
            .instrument(span),
        );
    }

    let layer_count = image.layers.len();
    let mut ready: Vec<Option<LayerOutcome>> = (0..layer_count).map(|_| None).collect();
    let mut summaries = Vec::with_capacity(layer_count);
    let mut layers = Vec::with_capacity(layer_count);
    while summaries.len() < layer_count {
        let outcome = match tasks.join_next().await {
            Some(Ok(outcome)) => outcome?,
            Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Some(Err(_)) | None => return Err(PullError::Cancelled),
        };
        let index = outcome.index;
        ready[index] = Some(outcome);
        // Merge every layer whose predecessors are all merged; later layers keep downloading.
        while let Some(outcome) = ready.get_mut(summaries.len()).and_then(Option::take) {
            let LayerOutcome {
                index,
                target,
                summary,
                report,
            } = outcome;
            let summary = if index == 0 {
                summary
            } else {
                merge(&threads, &staging, target, summary, &options.extract)
                    .await?
                    .map_err(|source| PullError::Extract {
                        index,
                        digest: report.digest.clone(),
                        source,
                    })?
            };
            puller.emit(PullEvent::LayerState {
                index,
                digest: report.digest.clone(),
                state: LayerState::Merged,
            });
            if fsync == FsyncPolicy::Layer {
                sync_seconds += sync(&threads, staging.rootfs(), false).await?;
            }
            summaries.push(summary);
            layers.push(report);
        }
    }

    let skipped: u64 = summaries.iter().map(|s| s.skipped_special_files).sum();
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "skipped device nodes and fifos of the image: creating them needs root (run as root to get them)"
        );
    }
    let root = staging.rootfs();
    let extract_options = options.extract.clone();
    threads
        .spawner()
        .spawn("rpull-finalize", move || {
            finalize_tree(&root, &summaries, &extract_options)
        })?
        .await
        .map_err(|_| threads.lost())?
        .map_err(|source| PullError::Extract {
            index: layer_count.saturating_sub(1),
            digest: image.manifest_digest.clone(),
            source,
        })?;

    if let Some(writeback) = writeback {
        sync_seconds += finish_writeback(&threads, writeback, staging.rootfs()).await?;
    }
    staging.commit(dest, options.force)?;
    if matches!(fsync, FsyncPolicy::End | FsyncPolicy::Layer) {
        // The rename itself is durable once the directory holding DIR is.
        let parent = std::path::absolute(dest)
            .ok()
            .and_then(|d| d.parent().map(Path::to_owned))
            .unwrap_or_else(|| PathBuf::from("."));
        sync_seconds += sync(&threads, parent, true).await?;
    }
    puller.emit(PullEvent::Committed {
        path: dest.display().to_string(),
    });
    drop(tasks);
    drop(threads);
    drop(staging);

    Ok(PullReport {
        reference: reference_name,
        manifest_digest: image.manifest_digest.clone(),
        platform,
        destination: dest.to_owned(),
        compressed_bytes: layers.iter().map(|l| l.compressed_bytes).sum(),
        uncompressed_bytes: layers.iter().map(|l| l.uncompressed_bytes).sum(),
        layers,
        seconds: started.elapsed().as_secs_f64(),
        fsync,
        sync_seconds,
    })
}

/// `syncfs` of the filesystem holding `path` (or, with `directory_only`, an `fsync` of the
/// directory), on a thread of the pull; returns the seconds it took.
async fn sync(threads: &Threads, path: PathBuf, directory_only: bool) -> Result<f64, PullError> {
    let target = path.clone();
    timed_sync(threads, path, move || {
        if directory_only {
            fsync_dir(&target)
        } else {
            syncfs(&target)
        }
    })
    .await
}

/// The final `syncfs` of a pull, on the early write-back's descriptor (so an error it saw is not
/// lost); returns the seconds it took.
async fn finish_writeback(
    threads: &Threads,
    writeback: Writeback,
    path: PathBuf,
) -> Result<f64, PullError> {
    timed_sync(threads, path, move || writeback.finish()).await
}

/// Runs `work` (a sync of `path`) on a thread of the pull; returns the seconds it took.
async fn timed_sync(
    threads: &Threads,
    path: PathBuf,
    work: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> Result<f64, PullError> {
    threads
        .spawner()
        .spawn("rpull-sync", move || {
            let started = Instant::now();
            work()
                .map(|()| started.elapsed().as_secs_f64())
                .map_err(|source| PullError::Io {
                    action: "syncing",
                    path,
                    source,
                })
        })?
        .await
        .map_err(|_| threads.lost())?
}

struct LayerJob {
    index: usize,
    descriptor: Descriptor,
    codec: Codec,
    target: PathBuf,
    /// A layer much smaller than the biggest: its threads run [`BACKGROUND_NICE_STEPS`] lower.
    background: bool,
    /// Where the extracted bytes are counted for the early write-back, if the pull has one.
    writeback: Option<WritebackCounter>,
    /// The pull's gate on inode creation, shared by all its layers, if it has one.
    create_gate: Option<CreateGate>,
    /// The pull's budget for byte ranges fetched ahead, shared by all its layers.
    range_budget: RangeBudget,
}

/// Which layers run their threads at the lower priority: those under half the biggest layer's
/// size. A layer nearly as big as the biggest is about as long a chain of decoding, so it keeps
/// the normal priority too; equal layers all do (four equal layers with the first ahead of the
/// others pulled 3% slower than all at one priority: docs/performance.md). A single layer is the
/// biggest, so it never runs in the background.
fn background_layers(sizes: &[u64]) -> Vec<bool> {
    let biggest = sizes.iter().copied().max().unwrap_or(0);
    sizes.iter().map(|&size| size < biggest / 2).collect()
}

/// How many steps of nice value the decode, extract and write threads of a background layer run
/// below the pull's own priority (capped at 19, the lowest). 10 rather than 5: medians of eight
/// alternating cold pulls of the realistic image into tmpfs 2.24 s against 2.35 s, with the cores
/// idle 0.14 CPU-s against 0.22; into this VM's ext4, no difference (docs/performance.md, "What
/// changed").
const BACKGROUND_NICE_STEPS: i32 = 10;

/// The lowest priority a nice value can give.
const LOWEST_NICE: i32 = 19;

/// Lowers the calling thread's priority (Linux: per thread) by [`BACKGROUND_NICE_STEPS`],
/// relative to its own, so a pull started under `nice` keeps every thread at least as low as it
/// was asked. Raising a nice value needs no privilege; a failure only costs the scheduling hint.
fn run_in_background() {
    let tid = Some(rustix::thread::gettid());
    let result = rustix::process::getpriority_process(tid).and_then(|own| {
        let lowered = own.saturating_add(BACKGROUND_NICE_STEPS).min(LOWEST_NICE);
        if lowered > own {
            rustix::process::setpriority_process(tid, lowered)?;
        }
        Ok(())
    });
    if let Err(errno) = result {
        debug!(%errno, "could not lower the priority of a layer thread");
    }
}

struct LayerOutcome {
    index: usize,
    target: PathBuf,
    summary: LayerSummary,
    report: LayerReport,
}

/// Merges a staged layer into the root on a thread of the pull. The outer error is the
/// pipeline's (cancelled), the inner one the merge's.
async fn merge(
    threads: &Threads,
    staging: &Staging,
    staged: PathBuf,
    summary: LayerSummary,
    options: &ExtractOptions,
) -> Result<Result<LayerSummary, rpull_extract::ExtractError>, PullError> {
    let (root, options) = (staging.rootfs(), options.clone());
    threads
        .spawner()
        .spawn("rpull-merge", move || {
            merge_layer(&root, &staged, &summary, &options).map(|_| summary)
        })?
        .await
        .map_err(|_| threads.lost())
}

/// Downloads one layer and feeds its extraction thread; the result is ready when both ended.
async fn layer_task(
    job: LayerJob,
    puller: Puller,
    repository: Reference,
    semaphore: Arc<Semaphore>,
    extraction_slots: Option<Arc<Semaphore>>,
    threads: ThreadSpawner,
) -> Result<LayerOutcome, PullError> {
    let digest = job.descriptor.digest.clone();
    let permit = semaphore
        .acquire_owned()
        .await
        .map_err(|_| PullError::Cancelled)?;
    puller.emit(PullEvent::LayerState {
        index: job.index,
        digest: digest.clone(),
        state: LayerState::Downloading,
    });

    let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
    let worker = {
        let (target, codec, writeback) = (job.target.clone(), job.codec, job.writeback.clone());
        let options = ExtractOptions {
            create_gate: job.create_gate.clone(),
            // A pull that syncs writes big files past the page cache (where that measured faster).
            direct_writes: writeback.is_some(),
            ..puller.options.extract.clone()
        };
        let (cancel, runtime) = (threads.cancel_token(), Handle::current());
        let background = job.background;
        threads.spawn(format!("rpull-layer-{}", job.index), move || {
            if background {
                // Inherited by the decode and write threads this one starts.
                run_in_background();
            }
            let layer = Layer {
                codec,
                target: &target,
                options: &options,
                writeback,
                slots: extraction_slots,
            };
            extract_worker(rx, layer, cancel, runtime)
        })?
    };
    let download = download(&puller, &repository, &job, tx).await;
    drop(permit);
    let worker = worker.await.map_err(|_| threads.lost())?;

    let wrap_extract = |error: WorkerError| match error {
        WorkerError::Decompress(source) => PullError::Decompress {
            index: job.index,
            digest: digest.clone(),
            source,
        },
        WorkerError::Extract(source) => PullError::Extract {
            index: job.index,
            digest: digest.clone(),
            source,
        },
    };
    // A verification failure explains a decompression failure, so it is reported first.
    let downloaded = download?;
    let extracted = worker.map_err(wrap_extract)?;
    if !downloaded.complete {
        return Err(PullError::Cancelled);
    }
    if job.index == 0 {
        // Layer 0 is extracted straight into the root: a hardlink whose target it did not write
        // points at nothing.
        if let Some(link) = extracted.summary.deferred_hardlinks.first() {
            return Err(wrap_extract(WorkerError::Extract(
                rpull_extract::ExtractError::Invalid {
                    entry: link.link.clone(),
                    detail: format!(
                        "hardlink to {}, which no earlier entry created",
                        link.target.display()
                    ),
                },
            )));
        }
    }
    puller.emit(PullEvent::LayerState {
        index: job.index,
        digest: digest.clone(),
        state: LayerState::Extracted,
    });
    debug!(
        seconds = extracted.seconds,
        entries = extracted.summary.entries,
        bytes = extracted.uncompressed_bytes,
        decode_thread = extracted.decode_thread,
        "layer extracted"
    );
    Ok(LayerOutcome {
        index: job.index,
        target: job.target,
        report: LayerReport {
            digest,
            media_type: job.descriptor.media_type.clone(),
            codec: extracted.codec.to_string(),
            compressed_bytes: job.descriptor.size,
            uncompressed_bytes: extracted.uncompressed_bytes,
            entries: extracted.summary.entries,
            download_seconds: downloaded.seconds,
            extract_seconds: extracted.seconds,
        },
        summary: extracted.summary,
    })
}

struct Downloaded {
    /// False when the extraction side went away before the blob ended (cancellation).
    complete: bool,
    seconds: f64,
}

async fn download(
    puller: &Puller,
    repository: &Reference,
    job: &LayerJob,
    tx: mpsc::Sender<Bytes>,
) -> Result<Downloaded, PullError> {
    let started = Instant::now();
    let (index, descriptor) = (job.index, &job.descriptor);
    let download_error = |source: rpull_registry::Error| PullError::Download {
        index,
        digest: descriptor.digest.clone(),
        source: Box::new(source),
    };
    let verify_error = |source: rpull_registry::VerifyError| PullError::Verify {
        index,
        digest: descriptor.digest.clone(),
        source,
    };

    let mut stream = blob_stream(puller, repository, descriptor, &job.range_budget)
        .await
        .map_err(download_error)?;
    // Hashed on another thread: receiving and hashing a fast blob would each take most of a
    // core (docs/design.md, "Hashing beside the receive").
    let mut verifier = BackgroundVerifier::spawn(&descriptor.digest, Some(descriptor.size));
    let mut reported = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(download_error)?;
        verifier.update(chunk.clone()).await;
        if verifier.overran() {
            // A registry that sends more than the descriptor says is stopped right away.
            return Err(verify_error(
                verifier.finish().await.expect_err("size already exceeded"),
            ));
        }
        let downloaded = verifier.bytes_seen();
        if downloaded - reported >= PROGRESS_STEP {
            reported = downloaded;
            puller.emit(PullEvent::LayerProgress {
                index,
                downloaded,
                total: descriptor.size,
            });
        }
        if tx.send(chunk).await.is_err() {
            return Ok(Downloaded {
                complete: false,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
    }
    puller.emit(PullEvent::LayerProgress {
        index,
        downloaded: verifier.bytes_seen(),
        total: descriptor.size,
    });
    verifier.finish().await.map_err(verify_error)?;
    puller.emit(PullEvent::LayerState {
        index,
        digest: descriptor.digest.clone(),
        state: LayerState::Verified,
    });
    Ok(Downloaded {
        complete: true,
        seconds: started.elapsed().as_secs_f64(),
    })
}

type ByteStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<Bytes, rpull_registry::Error>> + Send>,
>;

/// The blob's bytes in order: one stream, or ranges over several connections when the blob is
/// larger than `chunk_size`. A registry that ignores `Range` gets one stream instead.
async fn blob_stream(
    puller: &Puller,
    repository: &Reference,
    descriptor: &Descriptor,
    budget: &RangeBudget,
) -> Result<ByteStream, rpull_registry::Error> {
    let options = &puller.options;
    let whole = || async {
        let stream = puller
            .client
            .get_blob(repository, &descriptor.digest)
            .await?;
        Ok::<ByteStream, rpull_registry::Error>(Box::pin(stream))
    };
    let Some(chunk_size) = options.chunk_size.filter(|&c| c > 0 && descriptor.size > c) else {
        return whole().await;
    };
    let mut ranged = puller.client.get_blob_ranged(
        repository,
        &descriptor.digest,
        descriptor.size,
        chunk_size,
        options.connections_per_blob,
        budget,
    );
    match ranged.next().await {
        Some(Err(rpull_registry::Error::Protocol { message, .. })) => {
            debug!(%message, "ranged download refused; falling back to one stream");
            whole().await
        }
        first => Ok(Box::pin(futures_util::stream::iter(first).chain(ranged))),
    }
}

struct Extracted {
    summary: LayerSummary,
    uncompressed_bytes: u64,
    codec: Codec,
    /// Whether the layer was decoded on a thread of its own.
    decode_thread: bool,
    seconds: f64,
}

enum WorkerError {
    Decompress(io::Error),
    Extract(rpull_extract::ExtractError),
}

/// What one layer's extraction thread works with.
struct Layer<'a> {
    codec: Codec,
    target: &'a Path,
    options: &'a ExtractOptions,
    /// Where the extracted bytes are counted for the early write-back, if any.
    writeback: Option<WritebackCounter>,
    /// The pull's extraction slots, if extractions are limited.
    slots: Option<Arc<Semaphore>>,
}

/// Runs on the layer's own thread: decode the stream and extract it into `target`, once it has
/// an extraction slot. Decoding starts on this thread and moves to a second, scoped one when
/// the layer turns out to inflate, so that decoding and extraction overlap ([`LayerDecoding`]).
/// On failure the blob is still read to its end, so the digest check (which explains most
/// failures of a corrupted stream) gets to run.
fn extract_worker(
    rx: mpsc::Receiver<Bytes>,
    layer: Layer<'_>,
    cancel: CancellationToken,
    runtime: Handle,
) -> Result<Extracted, WorkerError> {
    let Layer {
        codec,
        target,
        options,
        writeback,
        slots,
    } = layer;
    let started = Instant::now();
    // Held until this layer is extracted; waiting for it ends when the pull is cancelled.
    let _slot = match slots {
        Some(slots) => Some(runtime.block_on(async {
            tokio::select! {
                biased;
                // As the channel reader reports it: the pull's own error is `Cancelled`.
                _ = cancel.cancelled() => Err(WorkerError::Decompress(io::Error::other("pull cancelled"))),
                permit = slots.acquire_owned() => Ok(permit.expect("the slots are never closed")),
            }
        })?),
        None => None,
    };
    let mut reader = ChannelReader::new(rx, cancel, runtime);
    let compressed = &mut reader;
    let result = std::thread::scope(move |scope| {
        let metered = Metered::new(compressed);
        let consumed = metered.counter();
        let decoder = rpull_decompress::decoder(codec, metered).map_err(|e| match e {
            rpull_decompress::DecompressError::Read(e) => WorkerError::Decompress(e),
            other => WorkerError::Decompress(io::Error::other(other)),
        })?;
        let codec = decoder.codec();
        let mut decoding = LayerDecoding::new(scope, decoder, consumed);

        let mut tar = CountingReader::new(&mut decoding, writeback);
        let extracted = extract_layer_from(&mut tar, target, options).map(|summary| {
            // End-of-archive padding and anything after it: the decoder must reach its end
            // (and check the gzip CRC) before the layer counts as extracted.
            let rest = io::copy(&mut tar, &mut io::sink());
            (summary, rest)
        });
        let uncompressed_bytes = tar.count();
        let decode_thread = decoding.on_own_thread();
        // The decoder's own error explains an extraction that ran out of bytes.
        decoding.finish().map_err(WorkerError::Decompress)?;
        let (summary, rest) = extracted.map_err(WorkerError::Extract)?;
        rest.map_err(WorkerError::Decompress)?;
        Ok(Extracted {
            summary,
            uncompressed_bytes,
            codec,
            decode_thread,
            seconds: started.elapsed().as_secs_f64(),
        })
    });
    // A stream that continues after the codec's data, or that extraction stopped reading, still
    // has to reach the digest check whole.
    let _ = reader.drain();
    result
}

/// The pull's threads (extraction, merge, finalize). Dropping it cancels them and waits for
/// them, so nothing writes into the staging directory while it is being removed.
struct Threads {
    spawner: ThreadSpawner,
}

#[derive(Clone)]
struct ThreadSpawner {
    inner: Arc<ThreadsInner>,
}

struct ThreadsInner {
    cancel: CancellationToken,
    /// `true` once the owner is dropped: no new threads after that.
    handles: Mutex<(bool, Vec<JoinHandle<()>>)>,
}

impl Threads {
    fn new() -> Threads {
        Threads {
            spawner: ThreadSpawner {
                inner: Arc::new(ThreadsInner {
                    cancel: CancellationToken::new(),
                    handles: Mutex::new((false, Vec::new())),
                }),
            },
        }
    }

    fn spawner(&self) -> ThreadSpawner {
        self.spawner.clone()
    }

    fn lost(&self) -> PullError {
        self.spawner.lost()
    }
}

impl ThreadSpawner {
    fn cancel_token(&self) -> CancellationToken {
        self.inner.cancel.clone()
    }

    /// What a thread's result channel closing without a value means.
    fn lost(&self) -> PullError {
        if self.inner.cancel.is_cancelled() {
            PullError::Cancelled
        } else {
            PullError::Io {
                action: "a worker thread panicked while pulling into",
                path: PathBuf::new(),
                source: io::Error::other("worker thread panicked"),
            }
        }
    }

    fn spawn<T: Send + 'static>(
        &self,
        name: impl Into<String>,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<oneshot::Receiver<T>, PullError> {
        let mut handles = self.inner.handles.lock().unwrap_or_else(|p| p.into_inner());
        if handles.0 {
            return Err(PullError::Cancelled);
        }
        let (tx, rx) = oneshot::channel();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _ = tx.send(work());
            })
            .map_err(|source| PullError::Io {
                action: "starting a worker thread",
                path: PathBuf::new(),
                source,
            })?;
        handles.1.push(handle);
        Ok(rx)
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.spawner.inner.cancel.cancel();
        let handles = {
            let mut guard = self
                .spawner
                .inner
                .handles
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            guard.0 = true;
            std::mem::take(&mut guard.1)
        };
        for handle in handles {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_under_half_the_biggest_run_in_the_background() {
        assert_eq!(background_layers(&[]), [false; 0]);
        assert_eq!(background_layers(&[10]), [false]);
        assert_eq!(background_layers(&[10, 30, 20]), [true, false, false]);
        assert_eq!(background_layers(&[30, 10, 30]), [false, true, false]);
        assert_eq!(background_layers(&[14, 30, 15]), [true, false, false]);
        assert_eq!(
            background_layers(&[256, 256, 256, 256]),
            [false; 4],
            "equal layers keep the normal priority"
        );
    }

    #[test]
    fn background_threads_get_a_lower_priority_and_only_they() {
        let before = rustix::process::getpriority_process(None).unwrap();
        let priorities = |start_nice: i32| {
            std::thread::spawn(move || {
                let tid = Some(rustix::thread::gettid());
                rustix::process::setpriority_process(tid, start_nice).unwrap();
                run_in_background();
                let own = rustix::process::getpriority_process(tid).unwrap();
                // A thread started from a background thread inherits its priority.
                let child = std::thread::spawn(|| {
                    rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
                })
                .join()
                .unwrap();
                (own, child)
            })
            .join()
            .unwrap()
        };
        // Relative to the thread's own nice value (raising it needs no privilege), capped at 19.
        for start in [before.max(0), (LOWEST_NICE - 3).max(before), LOWEST_NICE] {
            let (own, child) = priorities(start);
            assert_eq!(
                own,
                (start + BACKGROUND_NICE_STEPS).min(LOWEST_NICE),
                "from nice {start}"
            );
            assert_eq!(child, own);
        }
        assert_eq!(
            rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap(),
            before,
            "the calling thread keeps its priority"
        );
    }
}
