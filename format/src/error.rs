//! The format's error: bytes that fail a layout's checks, and input a layout cannot take.

/// Result alias for the format's decoders and checks.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// What kind of object an error is about: what callers match on (the CLI's advice to run
/// `verify` after damage in stored data), and the first word of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A chunk of an image.
    Chunk,
    /// A chunk a delta chunk is stored against.
    DeltaBase,
    /// A pack object.
    Pack,
    /// An image's manifest.
    Manifest,
    /// A tag record.
    Tag,
    /// A tag's name (every version of it).
    TagName,
    /// A push's or tag copy's lease.
    Lease,
    /// The store's `config.json`.
    Config,
    /// An image's restore profile.
    Profile,
    /// A record of damage `verify` found.
    DamageRecord,
    /// A key record of an encrypted store.
    KeyRecord,
    /// The retired keys of an encrypted store.
    RetiredKeys,
    /// The store's retention policies (`policies.json`).
    Policies,
    /// A key of an encrypted store.
    Key,
    /// A sealed object of an encrypted store.
    SealedObject,
    /// A store.
    Store,
    /// A backend object of any kind.
    Object,
    /// A file in an image.
    ImageFile,
    /// An image named by its id.
    ImageId,
    /// An image a `gstore hold` process holds.
    HeldImage,
    /// A device buffer read back.
    DeviceBuffer,
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ObjectKind::Chunk => "chunk",
            ObjectKind::DeltaBase => "delta base chunk",
            ObjectKind::Pack => "pack",
            ObjectKind::Manifest => "manifest",
            ObjectKind::Tag => "tag",
            ObjectKind::TagName => "tag name",
            ObjectKind::Lease => "lease",
            ObjectKind::Config => "config",
            ObjectKind::Profile => "profile",
            ObjectKind::DamageRecord => "damage record",
            ObjectKind::KeyRecord => "key record",
            ObjectKind::RetiredKeys => "retired keys",
            ObjectKind::Policies => "retention policies",
            ObjectKind::Key => "key",
            ObjectKind::SealedObject => "sealed object",
            ObjectKind::Store => "store",
            ObjectKind::Object => "object",
            ObjectKind::ImageFile => "file in the image",
            ObjectKind::ImageId => "image id",
            ObjectKind::HeldImage => "held image",
            ObjectKind::DeviceBuffer => "device buffer",
        })
    }
}

/// What a layout's decoder or check found wrong. The store turns each into its own error of
/// the same name and kind.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
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
    /// Something named is not there (a file of an image, a delta's base).
    #[error("{what} not found: {key}")]
    NotFound {
        /// What kind of object.
        what: ObjectKind,
        /// Its key or name.
        key: String,
    },
    /// A name does not parse: a tag, an object id.
    #[error("{name}: {why}")]
    Name {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// A setting is wrong (a codec level).
    #[error("{name}: {why}")]
    Setting {
        /// The setting, as given.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// An entry of an image cannot be read as asked (bytes past a file's end).
    #[error("{entry}: {why}")]
    Entry {
        /// The entry, as named in the image.
        entry: String,
        /// What is wrong with it.
        why: String,
    },
    /// A layout refuses what it is asked to encode (an image that cannot be stored).
    #[error("{0}")]
    Refused(String),
    /// Store parameters that do not fit the layout's limits or each other.
    #[error("{0}")]
    Invalid(String),
    /// A reader of delta bases failed; its own error, kept whole.
    #[error("{0}")]
    Bases(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A delta chunk reached a decoder that cannot look up bases.
    #[error("{0}")]
    NoBases(String),
}

impl FormatError {
    /// Builds a [`FormatError::Corrupt`].
    pub fn corrupt(what: ObjectKind, key: impl Into<String>, detail: impl Into<String>) -> Self {
        FormatError::Corrupt { what, key: key.into(), detail: detail.into() }
    }
}
