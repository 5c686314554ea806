use std::path::PathBuf;

/// What [`extract_layer`](crate::extract_layer) recorded about one layer: what the merge and the
/// finalization still have to do, and counts for reports.
///
/// All paths are relative to the layer root, normalised (no `.`/`..` components, no leading `/`),
/// and may be non-UTF-8. The empty path is the root itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerSummary {
    /// Paths deleted from lower layers by `.wh.NAME` entries (the path of NAME, not of the marker).
    pub whiteouts: Vec<PathBuf>,
    /// Directories whose lower content is hidden by a `.wh..wh..opq` marker.
    pub opaque_dirs: Vec<PathBuf>,
    /// Hardlinks whose target was not written by this layer (a file of an earlier layer); they are
    /// linked by [`merge_layer`](crate::merge_layer). For a layer extracted straight into the root
    /// (layer 0) they can never be satisfied: callers should treat a non-empty list as an error there.
    pub deferred_hardlinks: Vec<DeferredHardlink>,
    /// Directories that had their own entry in the layer, in tar order (a later duplicate wins).
    /// Directories absent from this list were only created as parents of other entries: the merge
    /// writes their content through a symlink of an earlier layer at their path, while a listed
    /// directory replaces such a symlink.
    pub directories: Vec<DirectoryMetadata>,
    /// Tar entries read, excluding pax/GNU extension headers.
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Directory entries.
    pub dirs: u64,
    /// Symlinks created.
    pub symlinks: u64,
    /// Hardlinks created or deferred.
    pub hardlinks: u64,
    /// Character/block devices and fifos created.
    pub special_files: u64,
    /// Character/block devices and fifos skipped because `special_files` was off.
    pub skipped_special_files: u64,
    /// Bytes of regular file data written.
    pub bytes_written: u64,
}

/// A hardlink to be created by the merge: `link` becomes another name of `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeferredHardlink {
    /// The new name.
    pub link: PathBuf,
    /// The existing file it points to, resolved inside the root.
    pub target: PathBuf,
}

/// Metadata of an explicit directory entry, applied by [`finalize_tree`](crate::finalize_tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryMetadata {
    /// The directory.
    pub path: PathBuf,
    /// Permission bits including setuid/setgid/sticky.
    pub mode: u32,
    /// Owner, applied only with [`ExtractOptions::chown`](crate::ExtractOptions::chown).
    pub uid: u32,
    /// Group, applied only with [`ExtractOptions::chown`](crate::ExtractOptions::chown).
    pub gid: u32,
    /// Modification time (the access time is set to the same value).
    pub mtime: Timestamp,
    /// Extended attributes from `SCHILY.xattr.*` records.
    pub xattrs: Vec<Xattr>,
}

/// Seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Whole seconds (may be negative).
    pub seconds: i64,
    /// Nanoseconds, `0..1_000_000_000`.
    pub nanoseconds: u32,
}

/// One extended attribute (name and value are raw bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    /// e.g. `user.foo`, `security.capability`.
    pub name: Vec<u8>,
    /// The raw value.
    pub value: Vec<u8>,
}

/// What [`merge_layer`](crate::merge_layer) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeStats {
    /// Staged entries moved into the root with one rename (a whole subtree counts once),
    /// including non-directories that replaced a non-directory of the root in that rename.
    pub renamed: u64,
    /// Directories present on both sides and merged recursively.
    pub merged_dirs: u64,
    /// Root entries removed before a staged entry took their place: a directory of the root
    /// replaced by a non-directory, or a non-directory replaced by a directory.
    pub replaced: u64,
    /// Whiteouts that removed something.
    pub whiteouts_applied: u64,
    /// Opaque directories emptied.
    pub opaque_dirs_applied: u64,
    /// Deferred hardlinks created.
    pub hardlinks_linked: u64,
}
