//! What can go wrong in the registry, each with the OCI distribution error code a client
//! is answered with.

use gstore_container::ContainerError;
use gstore_store::{ErrorKind, StoreError};

/// Result with a [`RegistryError`].
pub type Result<T> = std::result::Result<T, RegistryError>;

/// Errors of the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A repository name gstore cannot map onto a tag name.
    #[error("{0}")]
    NameInvalid(String),
    /// No tag has this repository's name.
    #[error("no repository {0:?} (its images are the tags named so: `gstore ls`)")]
    NameUnknown(String),
    /// No such manifest (tag or digest), or the image is not a container image.
    #[error("{0}")]
    ManifestUnknown(String),
    /// A manifest that cannot be stored.
    #[error("{0}")]
    ManifestInvalid(String),
    /// A manifest names a blob that was neither uploaded nor is in the store.
    #[error("the manifest names blob {0}, which was not uploaded and is not in the store")]
    ManifestBlobUnknown(String),
    /// No such blob.
    #[error("no blob {0} in the store")]
    BlobUnknown(String),
    /// No such upload (never started, finished, or expired).
    #[error("no upload {0:?} in progress")]
    BlobUploadUnknown(String),
    /// A request's bytes do not start where the upload stands.
    #[error("{0}")]
    RangeInvalid(String),
    /// An upload that would pass the limits on the bytes uploads may hold.
    #[error("{0}")]
    UploadLimit(String),
    /// A digest that is malformed or does not match the bytes.
    #[error("{0}")]
    DigestInvalid(String),
    /// Something the registry does not do.
    #[error("{0}")]
    Unsupported(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading or writing a container image's files failed.
    #[error(transparent)]
    Container(#[from] ContainerError),
    /// Reading or writing bytes failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl From<gstore_store::FormatError> for RegistryError {
    /// A name or object that failed its layout's checks: the store's error for it.
    fn from(e: gstore_store::FormatError) -> Self {
        RegistryError::Store(e.into())
    }
}

impl RegistryError {
    /// An I/O error at `path`.
    pub fn io(action: &'static str, path: &std::path::Path, source: std::io::Error) -> RegistryError {
        RegistryError::Io { action, path: path.display().to_string(), source }
    }

    /// The OCI distribution error code (`errors[].code`) a client is told.
    pub fn code(&self) -> &'static str {
        match self {
            RegistryError::NameInvalid(_) => "NAME_INVALID",
            RegistryError::NameUnknown(_) => "NAME_UNKNOWN",
            RegistryError::ManifestUnknown(_) => "MANIFEST_UNKNOWN",
            RegistryError::ManifestInvalid(_) => "MANIFEST_INVALID",
            RegistryError::ManifestBlobUnknown(_) => "MANIFEST_BLOB_UNKNOWN",
            RegistryError::BlobUnknown(_) => "BLOB_UNKNOWN",
            RegistryError::BlobUploadUnknown(_) => "BLOB_UPLOAD_UNKNOWN",
            RegistryError::UploadLimit(_) => "DENIED",
            RegistryError::RangeInvalid(_) => "BLOB_UPLOAD_INVALID",
            RegistryError::DigestInvalid(_) => "DIGEST_INVALID",
            RegistryError::Unsupported(_) => "UNSUPPORTED",
            RegistryError::Store(StoreError::NotFound { .. }) => "MANIFEST_UNKNOWN",
            RegistryError::Store(e) if e.kind() == ErrorKind::Usage => "NAME_INVALID",
            RegistryError::Container(e) if pushed_wrong(e) => "MANIFEST_INVALID",
            RegistryError::Store(_) | RegistryError::Container(_) | RegistryError::Io { .. } => "UNKNOWN",
        }
    }

    /// The HTTP status a client is answered with.
    pub fn status(&self) -> u16 {
        match self {
            RegistryError::NameUnknown(_)
            | RegistryError::ManifestUnknown(_)
            | RegistryError::BlobUnknown(_)
            | RegistryError::BlobUploadUnknown(_)
            | RegistryError::Store(StoreError::NotFound { .. }) => 404,
            RegistryError::NameInvalid(_)
            | RegistryError::ManifestInvalid(_)
            | RegistryError::ManifestBlobUnknown(_)
            | RegistryError::DigestInvalid(_) => 400,
            RegistryError::Store(e) if e.kind() == ErrorKind::Usage => 400,
            RegistryError::Container(e) if pushed_wrong(e) => 400,
            RegistryError::UploadLimit(_) => 413,
            RegistryError::RangeInvalid(_) => 416,
            RegistryError::Unsupported(_) => 415,
            RegistryError::Store(_) | RegistryError::Container(_) | RegistryError::Io { .. } => 500,
        }
    }
}

/// Whether a pushed layer was refused for what it holds (not a tar, an unsafe path, an entry
/// twice): the client's fault, which sending it again does not mend.
fn pushed_wrong(e: &ContainerError) -> bool {
    match e {
        ContainerError::BadArchive { .. } => true,
        ContainerError::Store(s) => s.kind() == ErrorKind::Usage,
        _ => false,
    }
}
