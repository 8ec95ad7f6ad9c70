//! Where a store lives: a local directory, an S3 bucket, a gstore server, or a caller-built
//! backend; and where this machine keeps its index and caches for it.

use crate::backend::Backend;
use crate::environment;
use crate::error::{Result, StoreError};
use std::path::PathBuf;

/// Where a store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// A directory on local disk (the embedded default).
    Local(PathBuf),
    /// An S3-compatible bucket, `s3://BUCKET[/PREFIX]`.
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix inside the bucket (no leading or trailing `/`; may be empty).
        prefix: String,
    },
    /// A gstore HTTP chunk server, `http://HOST:PORT` (token from `GSTORE_TOKEN`).
    Http {
        /// The server's base URL.
        url: String,
    },
    /// A caller-built backend (tests, embedding), with this machine's index and cache in `dir`.
    Custom {
        /// The backend's description, for messages.
        description: String,
        /// Directory of the index, lock and caches.
        dir: PathBuf,
    },
}

impl StoreLocation {
    /// True for S3 and HTTP stores, whose requests wait on the network; false for a local
    /// directory and for a caller-built backend (where its requests go is not known).
    pub fn over_network(&self) -> bool {
        matches!(self, StoreLocation::S3 { .. } | StoreLocation::Http { .. })
    }

    /// Parses a `--store` value: `s3://BUCKET[/PREFIX]` or a local path. Other URLs are
    /// refused.
    pub fn parse(s: &str) -> Result<StoreLocation> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::Location {
                    location: format!("{s:?}"),
                    why: "no bucket name (expected s3://BUCKET[/PREFIX])".into(),
                });
            }
            return Ok(StoreLocation::S3 { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() });
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(StoreLocation::Http { url: s.trim_end_matches('/').to_string() });
        }
        if let Some((scheme, _)) = s.split_once("://") {
            return Err(StoreError::Location {
                location: format!("{s:?}"),
                why: format!(
                    "store URL scheme {scheme}:// is not supported; give a local directory, s3://BUCKET[/PREFIX] or http://HOST:PORT"
                ),
            });
        }
        if s.is_empty() {
            return Err(StoreError::Location { location: "\"\"".into(), why: "empty store path".into() });
        }
        // `s3:/bucket`, `http:host`, `S3://…`: a URL mistyped, not a directory to make.
        if let Some((scheme, _)) = s.split_once(':') {
            if ["s3", "http", "https"].contains(&scheme.to_ascii_lowercase().as_str()) {
                return Err(StoreError::Location {
                    location: format!("{s:?}"),
                    why: format!(
                        "looks like a mistyped URL: write {}://… (for a local directory of that name, write ./{s})",
                        scheme.to_ascii_lowercase()
                    ),
                });
            }
        }
        Ok(StoreLocation::Local(PathBuf::from(s)))
    }

    /// The store a caller that names none uses: `$GSTORE_STORE` when set and not empty (the
    /// CLI's `--store` reads the same variable), else [`StoreLocation::default_local`].
    pub fn from_env() -> Result<StoreLocation> {
        match environment::store() {
            Some(s) => StoreLocation::parse(&s),
            None => Ok(StoreLocation::default_local()),
        }
    }

    /// The default store: `$XDG_DATA_HOME/gstore`, else `~/.local/share/gstore`.
    pub fn default_local() -> StoreLocation {
        StoreLocation::Local(environment::Dirs::data_home().join("gstore"))
    }

    /// The backend this location names, as it is: an encrypted store's objects sealed. A
    /// remote store's (S3 or HTTP) pack reads go through the caching tiers `GSTORE_TIERS`
    /// names, if any.
    pub fn backend(&self) -> Result<Backend> {
        let tiers = crate::backend::tiers_from_env;
        match self {
            StoreLocation::Local(p) => Backend::local(p),
            StoreLocation::S3 { bucket, prefix } => Backend::s3(bucket, prefix)?.through_tiers(&tiers()?),
            StoreLocation::Http { url } => Backend::http(url)?.through_tiers(&tiers()?),
            StoreLocation::Custom { description, .. } => Err(StoreError::Location {
                location: description.clone(),
                why: "a custom backend is opened with Store::open_backend".into(),
            }),
        }
    }

    /// This machine's directory for a remote store's index and cache:
    /// `$XDG_CACHE_HOME/gstore/<store>` (else `~/.cache/gstore/<store>`).
    pub(super) fn local_dir(&self) -> Option<PathBuf> {
        let name = match self {
            StoreLocation::Local(_) => return None,
            StoreLocation::S3 { bucket, prefix } => format!("s3-{bucket}-{prefix}"),
            StoreLocation::Http { url } => url.replace("://", "-"),
            StoreLocation::Custom { dir, .. } => return Some(dir.clone()),
        };
        let base = environment::Dirs::cache_home();
        let name: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
        Some(base.join("gstore").join(name))
    }

    /// Directory of the local index and its lock.
    pub(super) fn index_dir(&self) -> PathBuf {
        match self {
            StoreLocation::Local(p) => p.join("index"),
            StoreLocation::S3 { .. } | StoreLocation::Http { .. } | StoreLocation::Custom { .. } => {
                self.local_dir().expect("remote").join("index")
            }
        }
    }

    /// Where the store is, for messages.
    pub fn describe(&self) -> String {
        match self {
            StoreLocation::Local(p) => p.display().to_string(),
            StoreLocation::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
            StoreLocation::Http { url } => url.clone(),
            StoreLocation::Custom { description, .. } => description.clone(),
        }
    }

    /// This machine's directory for the store's gc state (its footer and manifest caches):
    /// `STORE/gc-state` for a local store, beside the index otherwise.
    pub fn gc_state_dir(&self) -> PathBuf {
        self.index_dir().with_file_name("gc-state")
    }
}

/// True for a relative path that reads like `HOST:PORT` (a server meant without `http://`).
pub(super) fn looks_like_host_port(p: &std::path::Path) -> bool {
    let Some(s) = p.to_str() else { return false };
    s.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
    })
}
