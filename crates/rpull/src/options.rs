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
    /// (see docs/benchmarks.md for the sweep this default comes from).
    pub chunk_size: Option<u64>,
    /// Connections per blob for ranged downloads.
    pub connections_per_blob: usize,
    /// How many layers are extracted at once; the others wait, their downloads held by their
    /// bounded buffers. `None`: one per core on file systems other than tmpfs (concurrent
    /// extractions contend in the disk file system's inode allocator), no limit on tmpfs
    /// (see [`PullOptions::extraction_slots_for`]).
    pub max_concurrent_extractions: Option<usize>,
}

/// The default of `connections_per_blob`.
pub const DEFAULT_CONNECTIONS_PER_BLOB: usize = 4;

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
            max_concurrent_extractions: None,
        }
    }
}

impl PullOptions {
    /// The limit on concurrent layer extractions into `target`: `max_concurrent_extractions`
    /// when set, else none on tmpfs and one per core elsewhere. `None` means no limit.
    pub fn extraction_slots_for(&self, target: &std::path::Path) -> Option<usize> {
        if let Some(slots) = self.max_concurrent_extractions {
            return Some(slots.max(1));
        }
        if crate::durability::is_memory_filesystem(target) {
            None
        } else {
            Some(std::thread::available_parallelism().map_or(1, |cores| cores.get()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extractions_are_limited_to_the_cores_on_disk_only() {
        let options = PullOptions::default();
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let cores = std::thread::available_parallelism().unwrap().get();
        if !crate::durability::is_memory_filesystem(disk.path()) {
            assert_eq!(options.extraction_slots_for(disk.path()), Some(cores));
        }
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() && crate::durability::is_memory_filesystem(shm) {
            assert_eq!(options.extraction_slots_for(shm), None);
        }
        let set = PullOptions {
            max_concurrent_extractions: Some(3),
            ..PullOptions::default()
        };
        assert_eq!(set.extraction_slots_for(shm), Some(3));
        assert_eq!(set.extraction_slots_for(disk.path()), Some(3));
        let zero = PullOptions {
            max_concurrent_extractions: Some(0),
            ..PullOptions::default()
        };
        assert_eq!(zero.extraction_slots_for(disk.path()), Some(1));
    }
}
