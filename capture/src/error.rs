//! What can go wrong checkpointing into, or running out of, the store.

use gstore_gpu_dump::GpuDumpError;
use gstore_lazy::LazyError;
use gstore_store::StoreError;

/// Result of this crate's calls.
pub type Result<T> = std::result::Result<T, CaptureError>;

/// Everything that can go wrong, each saying what was being done and what became of the
/// process.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The store failed (opening an image, resolving a reference).
    #[error(transparent)]
    Store(#[from] StoreError),

    /// The capture layer failed before anything was captured (finding CRIU, ...).
    #[error(transparent)]
    Gpu(#[from] GpuDumpError),

    /// A staging directory could not be made.
    #[error("creating staging directory {path}: {source}")]
    Staging {
        /// The directory.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },

    /// CRIU or the CUDA checkpoint failed; the capture layer says what became of the process.
    #[error("checkpoint of pid {pid} failed: {source}{kept_log}")]
    Checkpoint {
        /// The process.
        pid: u32,
        /// The cause.
        source: GpuDumpError,
        /// Where CRIU's log was kept when its staging directory went (empty if it did not).
        kept_log: String,
    },

    /// The push of a checkpoint failed; `after` says what became of the process and image.
    #[error("storing the checkpoint of pid {pid} failed{after}: {source}")]
    PushFailed {
        /// The process checkpointed.
        pid: u32,
        /// E.g. " (the process kept running)".
        after: String,
        /// The cause.
        source: StoreError,
    },

    /// Receiving the image from CRIU failed; `after` says what became of the process.
    #[error("streaming the checkpoint of pid {pid} into the store failed{after}: {source}")]
    Streaming {
        /// The process checkpointed.
        pid: u32,
        /// E.g. " (the process kept running)".
        after: String,
        /// The cause.
        source: Box<CaptureError>,
    },

    /// The image is not a process checkpoint.
    #[error("{reference} is not a process checkpoint ({detail}); restore its files with --to DIR instead")]
    NotAProcess {
        /// The image as named.
        reference: String,
        /// Why.
        detail: String,
    },

    /// This machine cannot run the image.
    #[error("{reference} cannot be restored on this machine: {source}")]
    Incompatible {
        /// The image as named.
        reference: String,
        /// Why.
        source: GpuDumpError,
    },

    /// Writing the image out of the store failed; nothing was started.
    #[error("writing out {reference} failed: {source}")]
    WriteOut {
        /// The image as named.
        reference: String,
        /// The cause.
        source: Box<CaptureError>,
    },

    /// CRIU, the CUDA restore or the lazy fill failed.
    #[error("restoring the process of {reference} failed: {source}")]
    Restore {
        /// The image as named.
        reference: String,
        /// The cause.
        source: Box<CaptureError>,
    },

    /// A process that keeps its weights out of its image did not do as asked
    /// ([`crate::cooperate`]).
    #[error("pid {pid} did not {step} its weights: {detail}")]
    Cooperation {
        /// The process (0: not known).
        pid: u32,
        /// "release", "refill", "ask" or "read".
        step: &'static str,
        /// Why.
        detail: String,
    },

    /// A process could not refill its weights from the store (it ended itself rather than
    /// run without them).
    #[error("pid {pid} could not refill its weights from the store, and ended: {source}")]
    Refill {
        /// The process.
        pid: u32,
        /// What the store said.
        source: StoreError,
    },

    /// The model image a process of the image refills its weights from cannot be read;
    /// nothing was started.
    #[error("pid {pid}'s weights come from {image}, which cannot be read (nothing was started): {source}")]
    WeightsGone {
        /// The process of the image.
        pid: u32,
        /// The model image, named and by id.
        image: String,
        /// What the store said.
        source: StoreError,
    },

    /// The lazy-pages daemon failed.
    #[error(transparent)]
    Lazy(#[from] LazyError),
}

impl CaptureError {
    /// The store's error behind this one, if the store failed (through any wrapping).
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            CaptureError::Store(e)
            | CaptureError::PushFailed { source: e, .. }
            | CaptureError::Refill { source: e, .. }
            | CaptureError::WeightsGone { source: e, .. } => Some(e),
            CaptureError::Lazy(e) => e.store_error(),
            CaptureError::Streaming { source, .. }
            | CaptureError::WriteOut { source, .. }
            | CaptureError::Restore { source, .. } => source.store_error(),
            _ => None,
        }
    }

    /// Whether the image named is not one this command restores (not a process checkpoint).
    pub fn is_wrong_kind(&self) -> bool {
        match self {
            CaptureError::NotAProcess { .. } => true,
            CaptureError::WriteOut { source, .. } | CaptureError::Restore { source, .. } => source.is_wrong_kind(),
            _ => false,
        }
    }

    /// Whether CRIU lost a pid the image needs to another process (see
    /// [`GpuDumpError::is_pid_taken`]).
    pub(crate) fn is_pid_taken(&self) -> bool {
        matches!(self, CaptureError::Gpu(e) if e.is_pid_taken())
    }
}
