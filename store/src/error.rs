//! The store's error type: every failure names what it was doing and on which object.

use std::path::PathBuf;

/// Result alias for store operations.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What sort of failure an error is: what callers decide by (the CLI's exit status, the
/// Python exception), never its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller's input or request is wrong (a bad name, option or key): the same call fails
    /// again.
    Usage,
    /// Something named does not exist (a tag, an image, a store).
    NotFound,
    /// Stored bytes are damaged, or an object they need is missing.
    Damage,
    /// Another writer (or gc) changed something first; nothing was overwritten: try again.
    Conflict,
    /// The store did not answer or failed in transit: try again later; nothing was damaged.
    Unavailable,
    /// Local I/O, the index, a device or gstore itself failed.
    Failure,
}

use gstore_format::FormatError;
pub use gstore_format::ObjectKind;

/// Everything that can go wrong inside the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A local file or directory could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("reading", "creating", ...).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The backend (object store) failed.
    #[error("{action} {key}: {message}")]
    Backend {
        /// What was being done.
        action: &'static str,
        /// The object key involved.
        key: String,
        /// The backend's message.
        message: String,
    },
    /// The store did not answer, or failed in transit (connection refused, reset or stalled,
    /// server errors), after the client's retries: worth trying again later; nothing was
    /// damaged by it.
    #[error("{action} {key}: {message}")]
    Unavailable {
        /// What was being done.
        action: &'static str,
        /// The object key (or URL) involved.
        key: String,
        /// What went wrong on the way.
        message: String,
        /// Whether the store was reached at all: a connection was made (a server answering
        /// 5xx, or cutting an answer off, exists); false when none could be made.
        reached: bool,
    },
    /// An object that must exist does not.
    #[error("{what} not found: {key}")]
    NotFound {
        /// What kind of object.
        what: ObjectKind,
        /// Its key or name.
        key: String,
    },
    /// An object that must not exist already does.
    #[error("{what} already exists: {key}")]
    AlreadyExists {
        /// What kind of object.
        what: ObjectKind,
        /// Its key or name.
        key: String,
    },
    /// Stored bytes failed a check: wrong hash, bad magic, truncated, unparsable.
    #[error("corrupt {what} {key}: {detail}")]
    Corrupt {
        /// What kind of object.
        what: ObjectKind,
        /// Its key or id.
        key: String,
        /// What exactly is wrong.
        detail: String,
    },
    /// A device (GPU) operation failed while loading or restoring into it. The source is the
    /// device layer's own error (gstore-gpu-dump's `GpuDumpError`), kept whole so callers can
    /// look into it ([`StoreError::device`]).
    #[error("GPU: {0}")]
    Device(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A conditional write lost a race: someone else changed the object first.
    #[error("{0}")]
    Conflict(String),
    /// The store directory holds no gstore store.
    #[error("no gstore store at {0}: create one with `gstore init` (Python: `Store.init`), or name another store")]
    NotInitialized(String),
    /// A setting is wrong: an environment variable, an option of the store's backend, a
    /// codec level.
    #[error("{name}: {why}")]
    Setting {
        /// The setting, as the user wrote it (`GSTORE_TIERS`, `GSTORE_CACHE_BYTES=12x`).
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// A store location names no place gstore can keep a store.
    #[error("{location}: {why}")]
    Location {
        /// The location as given (a path or URL).
        location: String,
        /// What is wrong with it.
        why: String,
    },
    /// A name does not parse or names nothing for certain: a tag, an object id, a pattern.
    #[error("{name}: {why}")]
    Name {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// A local path is not what the command needs (a directory, a file, a socket).
    #[error("{path}: {why}")]
    Path {
        /// The path.
        path: PathBuf,
        /// What it is, or is not.
        why: String,
    },
    /// An entry of an image cannot be stored or read as asked: a path given twice, bytes
    /// past a file's end, a path that is not UTF-8.
    #[error("{entry}: {why}")]
    Entry {
        /// The entry, as named in the image (or on disk).
        entry: String,
        /// What is wrong with it.
        why: String,
    },
    /// The store refuses a request that is well-formed but would do harm or make no sense
    /// here (removing the last key, treating an unencrypted store as encrypted, options
    /// that contradict each other): the message says which and what to do instead.
    #[error("{0}")]
    Refused(String),
    /// User input was invalid, in a way none of the variants above names.
    #[error("{0}")]
    Invalid(String),
    /// A failure inside gstore or its host that is neither the caller's input nor damage in
    /// the store: a thread or buffer that could not be made, a broken internal invariant.
    #[error("internal error: {0}")]
    Internal(String),
    /// A streamed push's feeder stopped before it said the stream was complete (the feeder's
    /// own error says why); nothing was tagged.
    #[error("the stream stopped before it was complete; nothing was tagged")]
    StreamStopped,
    /// The store is encrypted and no key was given.
    #[error("{0} is encrypted: give its key with GSTORE_KEY_FILE (a key file) or GSTORE_PASSPHRASE, or run from a terminal to be asked")]
    KeyRequired(String),
    /// No key record of the encrypted store opens with the key given.
    #[error(
        "the key given does not open {0}: no key record of the store opens with it (`gstore key list` shows them)"
    )]
    KeyRejected(String),
    /// `source` stopped a command: said with what it stopped and what to do about it. Its
    /// kind is `source`'s.
    #[error("{stopped}: {source}; {guidance}")]
    Stopped {
        /// What stopped, and how far it had got ("gc stopped before deleting anything").
        stopped: &'static str,
        /// What stopped it.
        source: Box<StoreError>,
        /// What to do about it.
        guidance: String,
    },
    /// The local RocksDB index failed.
    #[error("index {path}: {message}")]
    Index {
        /// The index directory.
        path: PathBuf,
        /// RocksDB's message.
        message: String,
    },
}

impl From<FormatError> for StoreError {
    /// A layout's error as the store's of the same name and kind; a delta-base reader's error
    /// (the store's own, boxed by the codec) comes back as it was.
    fn from(e: FormatError) -> Self {
        match e {
            FormatError::Corrupt { what, key, detail } => StoreError::Corrupt { what, key, detail },
            FormatError::NotFound { what, key } => StoreError::NotFound { what, key },
            FormatError::Name { name, why } => StoreError::Name { name, why },
            FormatError::Setting { name, why } => StoreError::Setting { name, why },
            FormatError::Entry { entry, why } => StoreError::Entry { entry, why },
            FormatError::Refused(m) => StoreError::Refused(m),
            FormatError::Invalid(m) => StoreError::Invalid(m),
            FormatError::NoBases(m) => StoreError::Internal(m),
            FormatError::Bases(e) => match e.downcast::<StoreError>() {
                Ok(e) => *e,
                Err(e) => StoreError::Internal(e.to_string()),
            },
        }
    }
}

impl From<StoreError> for FormatError {
    /// The store's error met while reading a delta base for a decoder, kept whole: the
    /// conversion back ([`StoreError::from`]) returns it as it was.
    fn from(e: StoreError) -> Self {
        FormatError::Bases(Box::new(e))
    }
}

/// The kind of a layout's error: that of the store's error it becomes (for callers that hold
/// one behind a reference, as an error chain does).
pub fn format_kind(e: &FormatError) -> ErrorKind {
    match e {
        FormatError::Corrupt { .. } => ErrorKind::Damage,
        FormatError::NotFound { .. } => ErrorKind::NotFound,
        FormatError::Name { .. }
        | FormatError::Setting { .. }
        | FormatError::Entry { .. }
        | FormatError::Refused(_)
        | FormatError::Invalid(_) => ErrorKind::Usage,
        FormatError::Bases(e) => e.downcast_ref::<StoreError>().map_or(ErrorKind::Failure, StoreError::kind),
        FormatError::NoBases(_) => ErrorKind::Failure,
    }
}

impl StoreError {
    /// Wraps an I/O error with the action and path it happened on.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io { action, path: path.into(), source }
    }

    /// A device (GPU) failure, kept whole as the source of a [`StoreError::Device`].
    pub fn device(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Device(Box::new(source))
    }

    /// The [`StoreError::Conflict`] of a compare-and-swap write that lost a race on `what`
    /// (an object key, or "tag NAME:VERSION").
    pub fn lost_race(what: impl std::fmt::Display) -> Self {
        StoreError::Conflict(format!(
            "{what} was changed by another writer at the same time; nothing was overwritten: retry"
        ))
    }

    /// Builds a [`StoreError::Corrupt`].
    pub fn corrupt(what: ObjectKind, key: impl Into<String>, detail: impl Into<String>) -> Self {
        StoreError::Corrupt { what, key: key.into(), detail: detail.into() }
    }

    /// This error with where the damaged object was found (`pack P, file F`) added to a
    /// [`StoreError::Corrupt`]'s detail, so the user learns which stored object is damaged;
    /// other errors unchanged.
    pub fn found_in(self, place: impl std::fmt::Display) -> Self {
        match self {
            StoreError::Corrupt { what, key, detail } => {
                StoreError::Corrupt { what, key, detail: format!("{detail} (in {place})") }
            }
            other => other,
        }
    }

    /// `self`, as what stopped `stopped`, with `guidance` (see [`StoreError::Stopped`]).
    pub fn stopped(self, stopped: &'static str, guidance: impl Into<String>) -> Self {
        StoreError::Stopped { stopped, source: Box::new(self), guidance: guidance.into() }
    }

    /// What sort of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Stopped { source, .. } => source.kind(),
            StoreError::NotFound { .. } | StoreError::NotInitialized(_) => ErrorKind::NotFound,
            StoreError::Corrupt { .. } => ErrorKind::Damage,
            StoreError::Conflict(_) | StoreError::AlreadyExists { .. } => ErrorKind::Conflict,
            StoreError::Invalid(_)
            | StoreError::Setting { .. }
            | StoreError::Location { .. }
            | StoreError::Name { .. }
            | StoreError::Path { .. }
            | StoreError::Entry { .. }
            | StoreError::Refused(_)
            | StoreError::KeyRequired(_)
            | StoreError::KeyRejected(_) => ErrorKind::Usage,
            StoreError::Unavailable { .. } => ErrorKind::Unavailable,
            StoreError::Io { .. }
            | StoreError::Backend { .. }
            | StoreError::Device(_)
            | StoreError::Internal(_)
            | StoreError::StreamStopped
            | StoreError::Index { .. } => ErrorKind::Failure,
        }
    }

    /// True when the store failed in transit ([`StoreError::Unavailable`]): the same request
    /// may well succeed later.
    pub fn is_transient(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }

    /// True when the error means an object is damaged or missing (as opposed to a usage error).
    pub fn is_damage(&self) -> bool {
        match self {
            StoreError::Stopped { source, .. } => source.is_damage(),
            other => matches!(other, StoreError::Corrupt { .. } | StoreError::NotFound { .. }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_what_went_wrong_not_the_words() {
        assert_eq!(StoreError::lost_race("tag a:b").kind(), ErrorKind::Conflict);
        assert_eq!(StoreError::corrupt(ObjectKind::Chunk, "ab", "hash").kind(), ErrorKind::Damage);
        assert_eq!(StoreError::NotFound { what: ObjectKind::Tag, key: "a".into() }.kind(), ErrorKind::NotFound);
        assert_eq!(StoreError::Invalid("bad".into()).kind(), ErrorKind::Usage);
        assert_eq!(StoreError::KeyRequired("s".into()).kind(), ErrorKind::Usage);
        let gone =
            StoreError::Unavailable { action: "reading", key: "k".into(), message: "reset".into(), reached: true };
        assert!(gone.is_transient() && gone.kind() == ErrorKind::Unavailable);
        assert_eq!(StoreError::Internal("x".into()).kind(), ErrorKind::Failure);
        let stopped = StoreError::corrupt(ObjectKind::Manifest, "m", "hash").stopped("gc stopped", "run gstore verify");
        assert!(stopped.kind() == ErrorKind::Damage && stopped.is_damage(), "{stopped}");
        assert_eq!(stopped.to_string(), "gc stopped: corrupt manifest m: hash; run gstore verify");
        let gone =
            StoreError::Unavailable { action: "reading", key: "k".into(), message: "reset".into(), reached: true };
        assert!(gone.stopped("gc stopped", "retry").is_transient());
    }

    #[test]
    fn a_layouts_error_keeps_its_kind_as_the_stores() {
        let errors = [
            FormatError::corrupt(ObjectKind::Pack, "p", "magic"),
            FormatError::NotFound { what: ObjectKind::ImageFile, key: "f".into() },
            FormatError::Name { name: "bad tag".into(), why: "spaces".into() },
            FormatError::Refused("no".into()),
            FormatError::NoBases("delta".into()),
            FormatError::Bases(Box::new(StoreError::lost_race("tag a:b"))),
        ];
        for e in errors {
            let kind = format_kind(&e);
            assert_eq!(StoreError::from(e).kind(), kind);
        }
    }
}
