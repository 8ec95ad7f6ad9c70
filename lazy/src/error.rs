//! One error type for the lazy restore.

use gstore_store::StoreError;

/// What went wrong while serving a restore's memory.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    /// This machine or image cannot be restored lazily (the caller falls back to the eager
    /// path and says why).
    #[error("{0}")]
    Unsupported(String),
    /// The store failed: a chunk or pack is damaged, missing or unreachable.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Chunks could not be fetched from the store (unreachable, refused, cut off).
    #[error("fetching chunk {chunk} of image file {file} (and {more} stored after it) failed: {source}")]
    Fetch {
        /// The first chunk of the read.
        chunk: String,
        /// Further chunks the same read fetched.
        more: usize,
        /// The image file they belong to.
        file: String,
        /// What the store said.
        #[source]
        source: Box<StoreError>,
    },
    /// A CRIU image file is malformed.
    #[error("image file {file}: {detail}")]
    Image {
        /// The file inside the image.
        file: String,
        /// What is wrong.
        detail: String,
    },
    /// CRIU's side of the lazy-pages protocol misbehaved or went away.
    #[error("lazy-pages protocol: {0}")]
    Protocol(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Filling the memory of a restored process failed; the restored tree was killed.
    #[error("filling the memory of pid {pid} failed ({cause}); the restored processes were killed so that none runs on missing memory")]
    Fill {
        /// The process whose memory was being filled.
        pid: i32,
        /// What failed.
        cause: Box<LazyError>,
    },
    /// The restore was called off (CRIU failed) before the daemon finished.
    #[error("the lazy restore was called off")]
    Aborted,
}

impl LazyError {
    /// The store's error behind this one, if the store failed.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            LazyError::Store(e) => Some(e),
            LazyError::Fetch { source, .. } => Some(source),
            LazyError::Fill { cause, .. } => cause.store_error(),
            _ => None,
        }
    }

    /// An OS error with what was being done.
    pub fn os(what: impl Into<String>, source: std::io::Error) -> LazyError {
        LazyError::Os { what: what.into(), source }
    }
}

/// Result with [`LazyError`].
pub type Result<T> = std::result::Result<T, LazyError>;
