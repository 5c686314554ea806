/// Which [`IoBackend`](crate::IoBackend) writes file data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoBackendKind {
    /// Blocking `write(2)` calls with large buffers ([`StdBackend`](crate::StdBackend)).
    #[default]
    Std,
}

/// How layers are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractOptions {
    /// Apply the uid/gid recorded in the layer (`lchown` semantics). Needs `CAP_CHOWN`; when set, a
    /// `security.capability` xattr that cannot be stored is an error rather than a warning.
    pub chown: bool,
    /// Create character/block devices and fifos. When unset they are skipped and counted in
    /// [`LayerSummary::skipped_special_files`](crate::LayerSummary::skipped_special_files).
    pub special_files: bool,
    /// The backend that writes regular files.
    pub backend: IoBackendKind,
}

impl ExtractOptions {
    /// `chown` and `special_files` only when running as root (effective uid 0), the std backend.
    pub fn for_current_user() -> Self {
        let root = rustix::process::geteuid().is_root();
        Self {
            chown: root,
            special_files: root,
            backend: IoBackendKind::Std,
        }
    }
}

impl Default for ExtractOptions {
    fn default() -> Self {
        Self::for_current_user()
    }
}
