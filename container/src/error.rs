//! What can go wrong with containers, archives and their runtime.

use gstore_store::StoreError;
use std::path::PathBuf;

/// Result with a [`ContainerError`].
pub type Result<T> = std::result::Result<T, ContainerError>;

/// Errors of container checkpoints, restores and archives.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// No usable container runtime on this machine.
    #[error("no container runtime: {0}")]
    NoRuntime(String),
    /// The runtime knows no such container.
    #[error("no container {0:?} (`podman ps -a` or `runc list` lists them)")]
    NoSuchContainer(String),
    /// A runtime command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Runtime {
        /// The command line.
        command: String,
        /// How it ended.
        status: String,
        /// The end of what it wrote to standard error.
        stderr: String,
    },
    /// This machine cannot restore the image; nothing was started.
    #[error("cannot restore {image} here: {why}")]
    Incompatible {
        /// The image.
        image: String,
        /// What is missing, and what to do.
        why: String,
    },
    /// The name (runc: the id) a restore would give the container is taken; nothing was
    /// started.
    #[error("cannot restore {image}: {taken}")]
    NameTaken {
        /// The image.
        image: String,
        /// Which container has the name, and what to do.
        taken: String,
    },
    /// The image is not a container checkpoint.
    #[error("{0}")]
    NotACheckpoint(String),
    /// The input is not a usable archive.
    #[error("{what}: {why}")]
    BadArchive {
        /// What was being read.
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// Reading or writing a local file or stream.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Serving the restored container's memory from the store failed: its processes were
    /// killed (none runs on missing memory).
    #[error("filling the memory of the restored container {container} from the store failed, and its processes were killed: {source}")]
    Fill {
        /// The container.
        container: String,
        /// The cause.
        #[source]
        source: gstore_lazy::LazyError,
    },
    /// Storing the checkpoint failed after the runtime dumped the container; `after` says what
    /// became of the container.
    #[error("storing the checkpoint of container {container} failed{after}: {source}")]
    PushFailed {
        /// The container.
        container: String,
        /// What became of the container.
        after: String,
        /// The cause.
        #[source]
        source: Box<ContainerError>,
    },
}

impl From<gstore_store::FormatError> for ContainerError {
    /// An object of the store that failed its layout's checks: the store's error for it.
    fn from(e: gstore_store::FormatError) -> Self {
        ContainerError::Store(e.into())
    }
}

impl ContainerError {
    /// An I/O error at `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> ContainerError {
        ContainerError::Io { action, path: path.into(), source }
    }

    /// The store error behind this one, if any (for exit codes).
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            ContainerError::Store(e) => Some(e),
            ContainerError::PushFailed { source, .. } => source.store_error(),
            ContainerError::Fill { source, .. } => source.store_error(),
            _ => None,
        }
    }
}
