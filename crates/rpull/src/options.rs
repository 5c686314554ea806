use rpull_extract::ExtractOptions;
use rpull_registry::Platform;

use crate::FsyncPolicy;

/// What a pull does, apart from where it connects (that is the registry client's business).
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The platform to choose from an index; the host's by default.
    pub platform: Platform,
    /// How many layer downloads run at once. Each running download also has its own
    /// decompress-and-extract thread.
    pub max_concurrent_downloads: usize,
    /// Replace a destination that exists and is not empty.
    pub force: bool,
    /// How layers are written (ownership, device nodes, I/O backend).
    pub extract: ExtractOptions,
    /// When the tree is made durable; by default one `syncfs` at the end on a disk, none on
    /// tmpfs.
    pub fsync: FsyncPolicy,
    /// Download blobs larger than this as byte ranges over several connections
    /// (`connections_per_blob`), the digest still verified over the whole blob. `None`: one
    /// stream per blob, which is fastest against registries that serve one stream at full speed
    /// (docs/performance.md, "Ranged downloads", has the sweep this default comes from).
    pub chunk_size: Option<u64>,
    /// Connections per blob for ranged downloads: one streams the range being read, the others
    /// fetch the ranges after it ahead.
    pub connections_per_blob: usize,
    /// Bytes that ranged downloads may hold in ranges fetched ahead, across all blobs of a pull
    /// (the range being read is streamed and needs none). This is what keeps a ranged pull within
    /// the memory bound, whatever `chunk_size`, `connections_per_blob` and the number of layers.
    pub range_budget: u64,
    /// How many layers are extracted at once (at least 1); the others wait before they decode,
    /// their downloads held by their bounded buffers. `None` (the default): no limit, since a
    /// limit of N also downloads only N layers at a time once the others' buffers are full,
    /// which costs more than it saves over a network slower than extraction. One per core
    /// measured 4-6% faster into ext4 right after a large delete, where concurrent extractions
    /// contend in its inode allocator (docs/performance.md).
    pub max_concurrent_extractions: Option<usize>,
}

/// The default of `connections_per_blob`.
pub const DEFAULT_CONNECTIONS_PER_BLOB: usize = 4;

/// The default of `range_budget`: with 8 MiB ranges, 4 connections on two blobs at once, or 8 on
/// one.
pub const DEFAULT_RANGE_BUDGET: u64 = 64 * 1024 * 1024;

/// The default for `--max-concurrent-downloads`. Docker's 3 leaves most of a multi-layer
/// image waiting; every download here also feeds its own extraction, so more in flight keeps
/// both cores busy.
pub const DEFAULT_MAX_CONCURRENT_DOWNLOADS: usize = 8;

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            platform: Platform::host(),
            max_concurrent_downloads: DEFAULT_MAX_CONCURRENT_DOWNLOADS,
            force: false,
            extract: ExtractOptions::for_current_user(),
            fsync: FsyncPolicy::Auto,
            chunk_size: None,
            connections_per_blob: DEFAULT_CONNECTIONS_PER_BLOB,
            range_budget: DEFAULT_RANGE_BUDGET,
            max_concurrent_extractions: None,
        }
    }
}
