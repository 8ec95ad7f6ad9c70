//! The store: a backend holding packs, manifests and tags, plus the local index.

use crate::backend::{self, Backend};
use crate::codec::{decode_base, BaseSource, Decoder, DeltaBases};
use crate::crypto::{keyring, MasterKey, Secret};
use crate::environment;
use crate::error::{Result, StoreError};
use crate::format::config::StoreConfig;
use crate::format::id::{ChunkIds, ObjectId};
use crate::format::key::{Family, ObjectKey};
use crate::format::manifest::Manifest;
use crate::format::pack::{self, PackEntry};
use crate::format::tag::{SetTime, TagRecord, TagRef};
use crate::repo::bases::BaseCache;
use crate::repo::cache::RangeCache;
use crate::repo::index::{ChunkLocation, Index};
use crate::repo::lock::StoreLock;
use crate::repo::seen::SeenTags;
use crate::ObjectKind;
use bytes::Bytes;
use rayon::prelude::*;
use std::collections::HashSet;
use std::path::PathBuf;

/// Pack footers read at once while indexing: a remote store's round trips overlap.
const TAIL_READS: usize = 16;

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
    /// directory and for a caller-built backend (a simulation orders its requests itself).
    pub fn over_network(&self) -> bool {
        matches!(self, StoreLocation::S3 { .. } | StoreLocation::Http { .. })
    }

    /// Parses a `--store` value: `s3://BUCKET[/PREFIX]` or a local path. Other URLs are
    /// refused.
    pub fn parse(s: &str) -> Result<StoreLocation> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::Invalid(format!("{s:?}: no bucket name (expected s3://BUCKET[/PREFIX])")));
            }
            return Ok(StoreLocation::S3 { bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string() });
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(StoreLocation::Http { url: s.trim_end_matches('/').to_string() });
        }
        if let Some((scheme, _)) = s.split_once("://") {
            return Err(StoreError::Invalid(format!(
                "store URL scheme {scheme}:// is not supported; give a local directory, s3://BUCKET[/PREFIX] or http://HOST:PORT"
            )));
        }
        if s.is_empty() {
            return Err(StoreError::Invalid("empty store path".into()));
        }
        // `s3:/bucket`, `http:host`, `S3://…`: a URL mistyped, not a directory to make.
        if let Some((scheme, _)) = s.split_once(':') {
            if ["s3", "http", "https"].contains(&scheme.to_ascii_lowercase().as_str()) {
                return Err(StoreError::Invalid(format!(
                    "{s:?} looks like a mistyped URL: write {}://… (for a local directory of that name, write ./{s})",
                    scheme.to_ascii_lowercase()
                )));
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
            StoreLocation::Custom { description, .. } => {
                Err(StoreError::Invalid(format!("{description}: a custom backend is opened with Store::open_backend")))
            }
        }
    }

    /// This machine's directory for a remote store's index and cache:
    /// `$XDG_CACHE_HOME/gstore/<store>` (else `~/.cache/gstore/<store>`).
    fn local_dir(&self) -> Option<PathBuf> {
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
    fn index_dir(&self) -> PathBuf {
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
fn looks_like_host_port(p: &std::path::Path) -> bool {
    let Some(s) = p.to_str() else { return false };
    s.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
    })
}

/// The manifest id prefix a reference is, lowercased: [`crate::format::tag::ID_LIKE_MIN_LEN`] to 64 hex
/// digits and nothing else (no `:VERSION`).
fn id_prefix(reference: &str) -> Option<String> {
    let hex = reference.bytes().all(|b| b.is_ascii_hexdigit());
    (hex && (crate::format::tag::ID_LIKE_MIN_LEN..=64).contains(&reference.len()))
        .then(|| reference.to_ascii_lowercase())
}

/// An open store. Commands that read or write chunks open it with its index (which takes the
/// store lock); commands that only read tags and manifests do not.
pub struct Store {
    backend: Backend,
    config: StoreConfig,
    location: StoreLocation,
    index: Option<Index>,
    _lock: Option<StoreLock>,
    cache: Option<RangeCache>,
    /// Set by [`Store::with_salt_seed`]: pack salts derive from it and a counter.
    salt_seed: Option<u64>,
    salts_made: std::sync::atomic::AtomicU64,
    /// Delta bases read lately.
    bases: BaseCache,
    /// For an encrypted remote store: the newest value of each tag this machine has seen.
    seen_tags: Option<SeenTags>,
    /// How the store names chunks.
    chunk_ids: ChunkIds,
    /// Which of this machine's indexes of the store to use ([`Store::with_index_slot`]).
    index_slot: Option<u32>,
}

/// A pack too short for the bytes a read needs.
fn truncated(key: String, size: u64, needed: u64) -> StoreError {
    StoreError::corrupt(
        ObjectKind::Pack,
        key,
        format!("{size} bytes long but bytes up to {needed} are needed: truncated"),
    )
}

/// Checks that a remote store honours conditional writes (If-None-Match and If-Match), which
/// tag updates rely on; refuses with a clear error otherwise.
fn probe_conditional_writes(backend: &Backend) -> Result<()> {
    let key = ObjectKey::Probe(format!("conditional-{}", ObjectId::unique().short())).to_string();
    let refuse = |what: &str| {
        StoreError::Invalid(format!(
            "{} does not honour {what}: two machines updating one tag could lose an update, so gstore will not keep a store there",
            backend.description()
        ))
    };
    let r = (|| {
        backend.put_if(&key, b"1".to_vec(), None)?;
        match backend.put_if(&key, b"2".to_vec(), None) {
            Err(StoreError::Conflict(_)) => {}
            Ok(()) => return Err(refuse("If-None-Match (create-only writes)")),
            Err(e) => return Err(e),
        }
        let (_, v) = backend.get_versioned(&key)?.ok_or_else(|| refuse("reads after writes"))?;
        backend.put(&key, b"3".to_vec())?;
        match backend.put_if(&key, b"4".to_vec(), Some(&v)) {
            Err(StoreError::Conflict(_)) => Ok(()),
            Ok(()) => Err(refuse("If-Match (compare-and-swap writes)")),
            Err(e) => Err(e),
        }
    })();
    let _ = backend.delete(&key);
    r
}

impl Store {
    /// Creates a new store at `location` with `config`. Fails if one is already there.
    pub fn init(location: &StoreLocation, config: &StoreConfig) -> Result<()> {
        Self::init_backend(&Self::backend_to_init(location, config)?, location, config)
    }

    /// The backend of a store about to be made at `location` with `config`, both checked (an
    /// S3 store's conditional writes included).
    fn backend_to_init(location: &StoreLocation, config: &StoreConfig) -> Result<Backend> {
        config.validate()?;
        let backend = location.backend()?;
        if matches!(location, StoreLocation::S3 { .. }) {
            probe_conditional_writes(&backend)?;
        }
        Ok(backend)
    }

    /// Creates a new encrypted store at `location` with `config` (docs/SECURITY.md): a random
    /// master key, wrapped by `secret` in the store's first key record. Returns that record's id.
    pub fn init_encrypted(location: &StoreLocation, config: &StoreConfig, secret: &Secret) -> Result<String> {
        let backend = Self::backend_to_init(location, config)?;
        if backend.get_opt(&ObjectKey::Config.to_string())?.is_some() {
            return Err(StoreError::AlreadyExists { what: ObjectKind::Store, key: location.describe() });
        }
        let master = MasterKey::generate();
        let config = config.clone().encrypted(&master);
        config.validate()?;
        // The record first: a config without a record that opens it would be a store nobody
        // can open. An init that then loses the race deletes its record; one killed first
        // leaves a record whose master key checks neither the config nor the record check,
        // so it is passed over and never counts as a key (keyring::remove).
        let id = keyring::add(&backend, &master, secret)?;
        if let Err(e) = Self::init_backend(&backend, location, &config) {
            backend.delete(&ObjectKey::KeyRecord(id).to_string())?;
            return Err(e);
        }
        Ok(id)
    }

    /// Creates a new store in `backend` (described by `location`). Fails if one is there.
    pub fn init_backend(backend: &Backend, location: &StoreLocation, config: &StoreConfig) -> Result<()> {
        config.validate()?;
        let json = serde_json::to_vec_pretty(config).expect("config serializes");
        match backend.put_new(&ObjectKey::Config.to_string(), json) {
            Err(StoreError::AlreadyExists { .. }) => {
                Err(StoreError::AlreadyExists { what: ObjectKind::Store, key: location.describe() })
            }
            other => other,
        }
    }

    /// Opens an existing store without its index. An unencrypted store that holds key records
    /// is refused: its config was replaced by an unencrypted one.
    pub fn open(location: &StoreLocation) -> Result<Store> {
        // Checked before the backend is built: building it creates the directory.
        if let StoreLocation::Local(p) = location {
            let config = p.join(ObjectKey::Config.to_string());
            match std::fs::metadata(&config) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    return Err(StoreError::io("opening the store at", p, e));
                }
                Err(_) if looks_like_host_port(p) => {
                    return Err(StoreError::NotInitialized(format!(
                        "{} (for a gstore server, write --store http://{})",
                        location.describe(),
                        p.display()
                    )));
                }
                Err(_) => return Err(StoreError::NotInitialized(location.describe())),
            }
        }
        let backend = location.backend()?;
        let config = Self::read_config(&backend, location)?;
        Self::refuse_downgrade(&backend, &config, location)?;
        Self::open_configured(backend, config, location)
    }

    /// Opens an existing store in `backend` without its index; `location` says where this
    /// machine keeps the index and caches (a [`StoreLocation::Custom`] for a caller-built backend).
    pub fn open_backend(backend: Backend, location: &StoreLocation) -> Result<Store> {
        let config = Self::read_config(&backend, location)?;
        Self::open_configured(backend, config, location)
    }

    /// Opens the store in `backend` whose config is `config`.
    fn open_configured(backend: Backend, config: StoreConfig, location: &StoreLocation) -> Result<Store> {
        let (backend, chunk_ids) = Self::unlocked(backend, &config, location)?;
        let seen_tags = location
            .local_dir()
            .filter(|_| config.encryption.is_some())
            .map(|d| SeenTags::at(d.join("seen-tags.json")));
        // Ranges are cached as read, in plain bytes: never for an encrypted store.
        let limit = environment::cache_bytes()?.unwrap_or(crate::repo::cache::DEFAULT_LIMIT);
        let cache = location
            .local_dir()
            .filter(|_| config.encryption.is_none())
            .and_then(|d| RangeCache::new(d.join("ranges"), limit));
        Ok(Store {
            backend,
            config,
            location: location.clone(),
            index: None,
            _lock: None,
            cache,
            salt_seed: None,
            salts_made: Default::default(),
            bases: BaseCache::default(),
            seen_tags,
            chunk_ids,
            index_slot: None,
        })
    }

    /// The config of the store in `backend` (described by `location`), without opening it:
    /// for a server, which serves an encrypted store without its key, and for key management.
    pub fn read_config(backend: &Backend, location: &StoreLocation) -> Result<StoreConfig> {
        let bytes = backend
            .get_opt(&ObjectKey::Config.to_string())?
            .ok_or_else(|| StoreError::NotInitialized(location.describe()))?;
        StoreConfig::from_json(&bytes)
    }

    /// `backend` as the store configured by `config` is read, and how it names chunks: sealed
    /// with the master key the user's secret opens, and keyed ids, for an encrypted store. An unencrypted store is refused where the
    /// user expects an encrypted one (a secret is set): a config replaced by an unencrypted one
    /// must not make gstore write plain objects.
    fn unlocked(backend: Backend, config: &StoreConfig, location: &StoreLocation) -> Result<(Backend, ChunkIds)> {
        let store = location.describe();
        if config.encryption.is_some() {
            let secret = Secret::for_store(&store)?;
            let master = keyring::unlock(&backend, &secret, &store, config)?;
            return Ok((backend.sealed(master.sealer()), master.chunk_ids()));
        }
        if Secret::in_env() {
            return Err(StoreError::Invalid(format!(
                "{store} is not encrypted, but GSTORE_KEY_FILE or GSTORE_PASSPHRASE is set: refusing to use it as if it were; unset them for this store"
            )));
        }
        Ok((backend, ChunkIds::Plain))
    }

    /// Refuses an unencrypted store that holds key records: its config was replaced by an
    /// unencrypted one, and gstore would otherwise write plain objects into an encrypted store.
    fn refuse_downgrade(backend: &Backend, config: &StoreConfig, location: &StoreLocation) -> Result<()> {
        if config.encryption.is_none() && !keyring::list(backend)?.is_empty() {
            return Err(StoreError::corrupt(
                ObjectKind::Config,
                location.describe(),
                "the store holds key records (keys/) but its config.json says it is not encrypted: the config was replaced",
            ));
        }
        Ok(())
    }

    /// Opens an existing store with its index, waiting (after calling `on_wait`) while another
    /// process holds it. An index that does not exist yet is built from the pack footers.
    pub fn open_indexed(location: &StoreLocation, on_wait: &dyn Fn(&str)) -> Result<Store> {
        Store::open(location)?.with_index(on_wait)
    }

    /// Opens a store with its index (as [`Store::open_indexed`]) and reads the manifest of the
    /// image `reference` names (see [`Store::resolve`]). The tag and manifest reads run beside
    /// the index's catch-up, so a remote store's round trips overlap.
    pub fn open_image(
        location: &StoreLocation,
        reference: &str,
        on_wait: &dyn Fn(&str),
    ) -> Result<(Store, ObjectId, crate::format::manifest::Manifest)> {
        let read_image = || -> Result<_> {
            let store = Store::open(location)?;
            let id = store.resolve(reference)?;
            Ok((id, store.get_manifest(&id)?))
        };
        if !location.over_network() {
            let store = Store::open_indexed(location, on_wait)?;
            let (id, manifest) = read_image()?;
            return Ok((store, id, manifest));
        }
        std::thread::scope(|s| {
            let image = s.spawn(read_image);
            let store = Store::open_indexed(location, on_wait);
            let image = image.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            let store = store?;
            let (id, manifest) = image?;
            Ok((store, id, manifest))
        })
    }

    /// Opens this store's index (see [`Store::open_indexed`]). An index that cannot be opened
    /// (damaged) is an error that says to run `gstore index rebuild`.
    pub fn with_index(mut self, on_wait: &dyn Fn(&str)) -> Result<Store> {
        let (dir, lock) = self.lock_index(on_wait)?;
        // Under the lock, the backend's listing (round trips on a remote store) runs while
        // the index opens.
        let (index, listing) = std::thread::scope(|s| {
            let listing = s.spawn(|| Listing::read(&self.backend));
            let index = Index::open(&dir);
            (index, listing.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        });
        let index = index?;
        let fresh = index.needs_fill();
        self.index = Some(index);
        self._lock = Some(lock);
        if fresh {
            self.fill_index(listing?, &crate::progress::Silent)?;
        } else {
            // Other processes and machines push packs and gc removes them: catch up.
            self.catch_up(listing?)?;
        }
        Ok(self)
    }

    /// Opens this store with a new index built from the pack footers (`gstore index
    /// rebuild`): the old index is deleted without being opened, so a damaged one is no
    /// obstacle (it is only a cache). Returns the store, the packs indexed, and the damaged
    /// packs skipped with their errors.
    pub fn with_new_index(
        mut self,
        on_wait: &dyn Fn(&str),
        progress: &dyn crate::progress::Progress,
    ) -> Result<(Store, usize, Vec<StoreError>)> {
        let (dir, lock) = self.lock_index(on_wait)?;
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StoreError::io("removing the old index", &dir, e))
            }
            _ => {}
        }
        self.index = Some(Index::open(&dir)?);
        self._lock = Some(lock);
        let (indexed, damaged) = self.rebuild_index(progress)?;
        Ok((self, indexed, damaged))
    }

    /// Takes the store lock (waiting for another process that holds it); returns it with the
    /// index directory it guards.
    fn lock_index(&self, on_wait: &dyn Fn(&str)) -> Result<(PathBuf, StoreLock)> {
        let dir = self.index_dir();
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| StoreError::io("creating", parent, e))?;
        }
        let lock = StoreLock::acquire(&dir.with_extension("lock"), on_wait)?;
        Ok((dir, lock))
    }

    /// Uses this machine's index number `slot` of the store (`index-slot-N` beside the
    /// default one) instead of the default index: processes on one machine that push at the
    /// same time (a training job's ranks) each take a slot and do not wait for each other's
    /// lock. Each slot's index is filled from the pack footers the first time and catches up
    /// on every open, as any index does; it is only a cache. Call before opening the index.
    pub fn with_index_slot(mut self, slot: u32) -> Store {
        self.index_slot = Some(slot);
        self
    }

    /// The index directory this store uses.
    fn index_dir(&self) -> PathBuf {
        let dir = self.location.index_dir();
        match self.index_slot {
            Some(n) => dir.with_file_name(format!("index-slot-{n}")),
            None => dir,
        }
    }

    /// This machine's directory for the store's gc state (see [`StoreLocation::gc_state_dir`]).
    pub fn gc_state_dir(&self) -> PathBuf {
        self.location.gc_state_dir()
    }

    /// True when reads go over the network (and gain from more requests in flight than cores).
    pub fn is_remote(&self) -> bool {
        !matches!(self.location, StoreLocation::Local(_))
    }

    /// The store's settings.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// How the store names chunks (keyed ids in an encrypted store).
    pub fn chunk_ids(&self) -> ChunkIds {
        self.chunk_ids
    }

    /// Where the store is, for messages.
    pub fn describe(&self) -> String {
        self.location.describe()
    }

    /// The index; an error when this handle was opened without it ([`Store::open`] rather
    /// than [`Store::open_indexed`]).
    pub fn index(&self) -> Result<&Index> {
        self.index.as_ref().ok_or_else(|| StoreError::Index {
            path: self.index_dir(),
            message: "this store handle was opened without its index (Store::open_indexed opens it)".into(),
        })
    }

    /// Where a chunk is stored, per the index.
    pub fn locate(&self, id: &ObjectId) -> Result<Option<ChunkLocation>> {
        self.index()?.locate(id)
    }

    /// Where each of many chunks is stored, per the index, in `ids`' order (faster per chunk
    /// than [`Store::locate`]: one index iterator seeks them in key order).
    pub fn locate_many(&self, ids: &[ObjectId]) -> Result<Vec<Option<ChunkLocation>>> {
        self.index()?.locate_many(ids)
    }

    /// Where every chunk of an image was when a restore last planned it, recorded under `key`
    /// (which names the image's chunk list), if those packs are all still there
    /// ([`crate::repo::index::Index::plan`]).
    pub fn recorded_plan(&self, key: &ObjectId) -> Result<Option<Vec<ChunkLocation>>> {
        self.index()?.plan(key)
    }

    /// Records a plan's locations under `key`, for the next plan of the same image.
    pub fn record_plan(&self, key: &ObjectId, record: crate::repo::index::PlanRecord) -> Result<()> {
        self.index()?.put_plan(key, record)
    }

    /// Reads a byte range of a pack from the store itself (never from this machine's range
    /// cache), telling a missing or truncated pack apart. For a local store the range is
    /// memory-mapped (and pre-faulted), so it is a view of the page cache, not a copy; the
    /// mapping lives as long as the returned bytes.
    pub fn read_pack_range(&self, pack: &ObjectId, range: std::ops::Range<u64>) -> Result<Bytes> {
        let key = ObjectKey::Pack(*pack).to_string();
        self.backend.get_range(&key, range.clone()).map_err(|e| self.pack_read_failure(key, &range, e))
    }

    /// Reads a byte range of a pack into `out` (exactly `range`'s length), from the store
    /// itself as [`Store::read_pack_range`] does. A local pack is read with `pread` straight
    /// into `out` (e.g. pinned memory a GPU copies from): one copy from the page cache, and no
    /// mapping, whose setup and teardown serialise threads on the process's address space.
    pub fn read_pack_range_into(&self, pack: &ObjectId, range: std::ops::Range<u64>, out: &mut [u8]) -> Result<()> {
        let key = ObjectKey::Pack(*pack).to_string();
        self.backend.get_range_into(&key, range.clone(), out).map_err(|e| self.pack_read_failure(key, &range, e))
    }

    /// A failed range read of a pack, said as a missing or truncated pack where it is one.
    fn pack_read_failure(&self, key: String, range: &std::ops::Range<u64>, e: StoreError) -> StoreError {
        match e {
            StoreError::NotFound { .. } => StoreError::NotFound { what: ObjectKind::Pack, key },
            e => match self.backend.size(&key) {
                Ok(None) => StoreError::NotFound { what: ObjectKind::Pack, key },
                Ok(Some(size)) if size < range.end => truncated(key, size, range.end),
                _ => e,
            },
        }
    }

    /// Reads a byte range of a pack and passes it to `check`, which checks the chunks in it
    /// (and may decode them): its result is returned. A remote store's ranges go through this
    /// machine's range cache, which only ever holds ranges `check` accepted: a range read from
    /// the store is cached after `check` passes, and a cached range `check` finds damaged is
    /// dropped and read again from the store.
    pub fn read_checked_range<T>(
        &self,
        pack: &ObjectId,
        range: std::ops::Range<u64>,
        mut check: impl FnMut(&Bytes) -> Result<T>,
    ) -> Result<T> {
        let Some(cache) = &self.cache else {
            return self.checked(pack, range, &mut check).map(|(checked, _)| checked);
        };
        if let Some(hit) = cache.get(pack, &range) {
            match check(&hit) {
                Err(e) if e.is_damage() => cache.remove(pack, &range),
                other => return other,
            }
        }
        let (checked, bytes) = self.checked(pack, range.clone(), &mut check)?;
        cache.put(pack, &range, &bytes);
        Ok(checked)
    }

    /// Reads a pack range and checks it; bytes that fail the check are read once more where
    /// they may come out differently (they came through a caching tier, which the pack now
    /// goes past), and checked again.
    fn checked<T>(
        &self,
        pack: &ObjectId,
        range: std::ops::Range<u64>,
        check: &mut impl FnMut(&Bytes) -> Result<T>,
    ) -> Result<(T, Bytes)> {
        let bytes = self.read_pack_range(pack, range.clone())?;
        match check(&bytes) {
            Ok(checked) => Ok((checked, bytes)),
            Err(e) if e.is_damage() && self.backend.distrust(&ObjectKey::Pack(*pack).to_string()) => {
                let bytes = self.read_pack_range(pack, range)?;
                Ok((check(&bytes)?, bytes))
            }
            Err(e) => Err(e),
        }
    }

    /// A chunk decoder for this store: it reads the bases of delta chunks from it.
    pub fn decoder(&self) -> Decoder<'_> {
        Decoder::with_bases(self.config.chunk_max, self).with_ids(self.chunk_ids)
    }

    /// Reads and checks a pack's footer (without reading its chunk data).
    pub fn read_pack_footer(&self, pack: &ObjectId) -> Result<Vec<PackEntry>> {
        let key = ObjectKey::Pack(*pack).to_string();
        let size = self
            .backend
            .size(&key)?
            .ok_or_else(|| StoreError::NotFound { what: ObjectKind::Pack, key: key.clone() })?;
        Ok(self.read_pack_tail(pack, size)?.0)
    }

    /// Reads and checks the footer of a pack `size` bytes long (as listed): its entries, and
    /// the raw tail they were parsed from (footer entries, then trailer).
    pub fn read_pack_tail(&self, pack: &ObjectId, size: u64) -> Result<(Vec<PackEntry>, Vec<u8>)> {
        pack::read_tail(&self.backend, pack, size, self.config.chunk_max)
    }

    /// Stores a finished pack, then records it in the index (pack before index).
    pub fn put_pack(&self, p: pack::FinishedPack) -> Result<()> {
        let size = p.size();
        let key = ObjectKey::Pack(p.id).to_string();
        if self.is_remote() && size > backend::MULTIPART_ABOVE {
            self.backend.put_multipart(&key, p.pieces)?;
        } else {
            self.backend.put(&key, p.pieces)?;
        }
        let index = self.index()?;
        index.add_pack(p.id, size, &p.entries)?;
        index.add_sketches(&p.sketches)
    }

    /// Makes the salts of the packs this store writes derive from `seed` and a counter instead
    /// of fresh randomness, so that a seeded simulation writes the same packs every run.
    pub fn with_salt_seed(mut self, seed: u64) -> Store {
        self.salt_seed = Some(seed);
        self
    }

    /// A new, empty pack builder (with a seeded salt in a seeded simulation).
    pub fn new_pack(&self) -> pack::PackBuilder {
        match self.salt_seed {
            None => pack::PackBuilder::new(self.config().pack_ids),
            Some(seed) => {
                let n = self.salts_made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let h = blake3::hash(&[seed.to_le_bytes(), n.to_le_bytes()].concat());
                let salt = h.as_bytes()[..pack::SALT_LEN].try_into().expect("16 bytes");
                pack::PackBuilder::with_salt(salt, self.config().pack_ids)
            }
        }
    }

    /// How many small reads (footers, manifests) to keep in flight: 16 over a network, one
    /// for a local disk or a caller-built backend (which a simulation orders request by
    /// request).
    pub fn reads_in_flight(&self) -> usize {
        if self.location.over_network() {
            16
        } else {
            1
        }
    }

    /// How many packs a push puts together, names and stores at once. Over a network, four
    /// uploads overlap. On a local disk, half the cores, from 2 to 8: each writer assembles,
    /// hashes and fsyncs 48 MiB packs in turn, and a disk takes parallel fsyncs faster (on the
    /// 16-core H100 machine, pushing 4 GiB of bf16: 2 writers 1.0–1.1 GB/s, 4 writers 1.3–1.5,
    /// 8 writers 1.8, when the cores stopped waiting for them). One for a caller-built
    /// backend, whose simulation orders its requests itself.
    pub fn upload_concurrency(&self) -> usize {
        match self.location {
            StoreLocation::Custom { .. } => 1,
            StoreLocation::Local(_) => std::thread::available_parallelism().map_or(2, |n| n.get() / 2).clamp(2, 8),
            _ => 4,
        }
    }

    /// Stores an encoded manifest under its id (`ObjectId::of(&bytes)`).
    pub fn put_manifest(&self, id: &ObjectId, bytes: Vec<u8>) -> Result<()> {
        self.backend.put(&ObjectKey::Manifest(*id).to_string(), bytes)
    }

    /// Reads and checks a manifest.
    pub fn get_manifest(&self, id: &ObjectId) -> Result<Manifest> {
        let key = ObjectKey::Manifest(*id).to_string();
        let bytes = match self.backend.get(&key) {
            Err(StoreError::NotFound { .. }) => return Err(StoreError::NotFound { what: ObjectKind::Manifest, key }),
            other => other?,
        };
        Manifest::decode(&bytes, id)
    }

    /// Reads a tag, or `None` if it does not exist.
    pub fn get_tag(&self, tag: &TagRef) -> Result<Option<TagRecord>> {
        Ok(self.get_tag_versioned(tag)?.map(|(r, _)| r).filter(|r| r.removed_unix.is_none()))
    }

    /// Reads a tag record with the version [`Store::put_tag`] can require (a record marked
    /// removed by gc included).
    pub fn get_tag_versioned(&self, tag: &TagRef) -> Result<Option<(TagRecord, backend::Version)>> {
        match self.backend.get_versioned(&ObjectKey::Tag(tag.clone()).to_string())? {
            Some((b, v)) => {
                let rec = TagRecord::from_json(&b, tag)?;
                self.check_seen(&[&rec])?;
                Ok(Some((rec, v)))
            }
            None => Ok(None),
        }
    }

    /// Checks tag records just read against the newest values this machine has seen of them
    /// (an encrypted remote store only: [`SeenTags`]), remembering newer ones.
    fn check_seen(&self, records: &[&TagRecord]) -> Result<()> {
        self.seen_tags.as_ref().map_or(Ok(()), |s| s.check(records))
    }

    /// Writes a tag record if the tag is still at `expected` (`None`: if it does not exist):
    /// two writers racing on one tag get one success and one [`StoreError::Conflict`].
    pub fn put_tag(&self, rec: &TagRecord, expected: Option<&backend::Version>) -> Result<()> {
        let json = serde_json::to_vec_pretty(rec).expect("tag serializes");
        self.backend.put_if(&ObjectKey::Tag(rec.tag()).to_string(), json, expected).map_err(|e| match e {
            StoreError::Conflict(_) => StoreError::lost_race(format_args!("tag {}", rec.tag())),
            other => other,
        })
    }

    /// Points `tag` at `manifest`, keeping the previous value in its history. Fails with
    /// [`StoreError::Conflict`] if another writer points the tag elsewhere in between; a
    /// change that left its value alone (gc trimming its history or removing it) is retried.
    /// A tag whose name reads as a manifest id is refused ([`TagRef::check_new`]).
    pub fn set_tag(&self, tag: &TagRef, manifest: ObjectId) -> Result<TagRecord> {
        tag.check_new()?;
        let key = ObjectKey::Tag(tag.clone()).to_string();
        let value = |current: &Option<(Bytes, backend::Version)>| {
            // A damaged previous record must not block a new push: start a fresh history. A
            // removed one starts afresh too.
            current.as_ref().and_then(|(b, _)| TagRecord::from_json(b, tag).ok()).filter(|r| r.removed_unix.is_none())
        };
        let mut current = self.backend.get_versioned(&key)?;
        if let Some(rec) = value(&current) {
            self.check_seen(&[&rec])?;
        }
        for _ in 0..8 {
            let previous = value(&current);
            let rec = TagRecord::new(tag, manifest, SetTime::now(), previous.clone());
            match self.put_tag(&rec, current.as_ref().map(|(_, v)| v)) {
                Err(StoreError::Conflict(m)) => {
                    current = self.backend.get_versioned(&key)?;
                    let now = value(&current);
                    let moved = match (&previous, &now) {
                        (Some(a), Some(b)) => a.manifest != b.manifest || a.set_time() != b.set_time(),
                        (None, Some(_)) => true,
                        (_, None) => false,
                    };
                    if moved {
                        return Err(StoreError::Conflict(m));
                    }
                }
                Ok(()) => {
                    self.check_seen(&[&rec])?;
                    return Ok(rec);
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict(format!("tag {tag} keeps changing under this write: retry")))
    }

    /// Points `tag` at an image already in the store (`gstore tag`). A lease protects the
    /// image while it has no tag, and the image is refused if gc has tombstoned its manifest
    /// or a pack its chunks are only in (docs/GC.md, "A push", the tag copy): gc might delete
    /// them any moment. A tag whose name reads as a manifest id is refused
    /// ([`TagRef::check_new`]). Needs the index.
    pub fn tag_existing(&self, tag: &TagRef, id: ObjectId) -> Result<TagRecord> {
        tag.check_new()?;
        let lease = crate::format::lease::Lease::take(&self.backend, &format!("tag {tag}"))?;
        self.hold_images(&lease, &[id])?;
        let rec = self.set_tag(tag, id)?;
        drop(lease);
        Ok(rec)
    }

    /// Names images `ids` in `lease` so that gc keeps them, and reads their manifests; an
    /// image gc has begun to remove (its manifest, or a pack its chunks are only in,
    /// tombstoned) is refused: gc might delete it any moment. Needs the index.
    pub(crate) fn hold_images(&self, lease: &crate::format::lease::Lease, ids: &[ObjectId]) -> Result<Vec<Manifest>> {
        lease.protect(&[], ids)?;
        self.sync_index()?;
        let mut manifests = Vec::with_capacity(ids.len());
        for id in ids {
            let manifest_doomed = crate::format::lease::has_tombstone(&self.backend, &ObjectKey::Manifest(*id))?;
            let m = self.get_manifest(id)?;
            let mut chunks_doomed = false;
            for c in m.chunks.iter().filter(|c| !c.zero) {
                if self.index()?.locate_for_dedup(&c.id)?.is_none() {
                    chunks_doomed = true;
                    break;
                }
            }
            if manifest_doomed || chunks_doomed {
                return Err(StoreError::Conflict(format!(
                    "image {} is being garbage-collected (gc tombstoned part of it): push it again instead",
                    id.to_hex()
                )));
            }
            manifests.push(m);
        }
        Ok(manifests)
    }

    /// Pins or unpins `tag` (`gstore pin` / `unpin`): gc's retention never removes a pinned
    /// tag or its current image. A compare-and-swap write, retried while other writers change
    /// the record; returns the record written.
    pub fn set_pinned(&self, tag: &TagRef, pinned: bool) -> Result<TagRecord> {
        for _ in 0..8 {
            let (mut rec, version) = self
                .get_tag_versioned(tag)?
                .filter(|(r, _)| r.removed_unix.is_none())
                .ok_or_else(|| self.no_such_tag(tag))?;
            rec.pinned = pinned;
            match self.put_tag(&rec, Some(&version)) {
                Err(StoreError::Conflict(_)) => continue,
                other => return other.map(|()| rec),
            }
        }
        Err(StoreError::Conflict(format!("tag {tag} keeps changing under this write: retry")))
    }

    /// Removes a tag. Its chunks stay until garbage collection.
    pub fn delete_tag(&self, tag: &TagRef) -> Result<()> {
        if self.get_tag(tag)?.is_none() {
            return Err(self.no_such_tag(tag));
        }
        self.backend.delete(&ObjectKey::Tag(tag.clone()).to_string())
    }

    /// Every tag, sorted by name and version. Records that fail to parse are returned as errors
    /// alongside the good ones so that one damaged tag does not hide the rest.
    pub fn list_tags(&self) -> Result<Vec<Result<TagRecord>>> {
        let mut out = Vec::new();
        for l in self.backend.list(Family::Tags.prefix())? {
            let Ok(ObjectKey::Tag(tag)) = ObjectKey::parse(&l.key) else { continue };
            let rec = self.backend.get(&l.key).and_then(|b| TagRecord::from_json(&b, &tag));
            match rec {
                Ok(r) if r.removed_unix.is_some() => {}
                // Gone between the listing and the read: deleted meanwhile.
                Err(StoreError::NotFound { .. }) => {}
                other => out.push((tag, other)),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        self.check_seen(&out.iter().filter_map(|(_, r)| r.as_ref().ok()).collect::<Vec<_>>())?;
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }

    /// Resolves a reference to an image to its manifest id: `NAME[:VERSION]`, a manifest id,
    /// or an unambiguous prefix of one (at least [`crate::format::tag::ID_LIKE_MIN_LEN`] hex digits, as
    /// `gstore ls` prints them). A reference with a version is always a tag, so a tag an older
    /// gstore let have an id-like name is reached as `NAME:VERSION`. A missing tag is named
    /// with the tags that share its name, or ones spelled alike.
    pub fn resolve(&self, reference: &str) -> Result<ObjectId> {
        if let Some(prefix) = id_prefix(reference) {
            if prefix.len() == 64 {
                return ObjectId::from_hex(&prefix);
            }
            return self.resolve_prefix(&prefix);
        }
        let tag = TagRef::parse(reference)?;
        match self.get_tag(&tag)? {
            Some(r) => r.manifest_id(),
            None => Err(self.no_such_tag(&tag)),
        }
    }

    /// The one manifest whose id starts with `prefix` (lowercase hex).
    fn resolve_prefix(&self, prefix: &str) -> Result<ObjectId> {
        let mut found: Vec<ObjectId> = self
            .backend
            .list(Family::Manifests.prefix())?
            .iter()
            .filter_map(|l| ObjectKey::parse(&l.key).ok()?.manifest())
            .filter(|id| id.to_hex().starts_with(prefix))
            .collect();
        found.sort();
        match found.len() {
            0 => Err(StoreError::NotFound {
                what: ObjectKind::ImageId,
                key: format!("{prefix} (no image's id starts with it)"),
            }),
            1 => Ok(found[0]),
            n => Err(StoreError::Invalid(format!(
                "{prefix} is ambiguous: {n} image ids start with it ({}{}); give more digits",
                found.iter().take(4).map(|id| id.to_hex()[..16].to_string()).collect::<Vec<_>>().join(", "),
                if n > 4 { ", ..." } else { "" }
            ))),
        }
    }

    /// The error for a tag that does not exist, naming the versions its name has, or tags
    /// whose names are spelled alike.
    fn no_such_tag(&self, tag: &TagRef) -> StoreError {
        StoreError::NotFound {
            what: ObjectKind::Tag,
            key: format!("{tag}{}", self.missing_tag_hint(&tag.name, Some(&tag.version))),
        }
    }

    /// The error for a tag name none of whose versions exists (`gstore log NAME`), naming tags
    /// spelled alike.
    pub fn no_such_tag_name(&self, name: &str) -> StoreError {
        StoreError::NotFound { what: ObjectKind::TagName, key: format!("{name}{}", self.missing_tag_hint(name, None)) }
    }

    /// What to say after a missing tag `name[:version]`: the versions the name has, tags
    /// spelled alike (of the same version, if any), or where to look.
    fn missing_tag_hint(&self, name: &str, version: Option<&str>) -> String {
        let existing: Vec<TagRef> = self
            .list_tags()
            .map(|v| v.into_iter().filter_map(|r| r.ok()).map(|r| r.tag()).collect())
            .unwrap_or_default();
        let versions: Vec<String> = existing.iter().filter(|t| t.name == name).map(|t| t.to_string()).collect();
        if !versions.is_empty() {
            return format!(" ({name} has: {})", versions.join(", "));
        }
        let alike: Vec<&TagRef> =
            existing.iter().filter(|t| crate::format::tag::spelled_alike(&t.name, name)).collect();
        let same_version: Vec<String> =
            alike.iter().filter(|t| Some(t.version.as_str()) == version).map(|t| t.to_string()).collect();
        let mut near = if same_version.is_empty() {
            alike.iter().map(|t| t.name.clone()).collect::<Vec<_>>()
        } else {
            same_version
        };
        near.dedup();
        near.truncate(3);
        if !near.is_empty() {
            format!(" (did you mean {}?)", near.join(" or "))
        } else if name.len() < 8 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            " (an image id needs 8 or more hex digits; gstore ls lists the tags and ids)".to_string()
        } else {
            " (gstore ls lists the tags)".to_string()
        }
    }

    /// Brings the index up to date with the backend, reading only footers: indexes packs it
    /// does not know yet (pushed by other processes or machines), forgets packs that are gone
    /// (deleted by gc) and records which packs gc has tombstoned. Tombstones are listed before
    /// packs (docs/GC.md). Damaged packs are skipped (verify names the images they break).
    /// Returns how many packs were added.
    pub fn sync_index(&self) -> Result<usize> {
        self.catch_up(Listing::read(&self.backend)?)
    }

    /// [`Store::sync_index`] from a listing of tombstoned packs, then packs, taken under the
    /// store lock.
    fn catch_up(&self, Listing { doomed, packs: listed, damaged }: Listing) -> Result<usize> {
        let index = self.index()?;
        index.set_damaged(&damaged)?;
        let present: HashSet<ObjectId> =
            listed.iter().filter_map(|l| ObjectKey::parse(&l.key).ok().and_then(|k| k.pack())).collect();
        let mut known = HashSet::new();
        for (id, _) in index.packs()? {
            if present.contains(&id) {
                known.insert(id);
            } else {
                index.remove_pack(&id)?;
            }
        }
        index.set_doomed(&doomed)?;
        let new: Vec<(ObjectId, u64)> = listed
            .iter()
            .filter_map(|l| Some((ObjectKey::parse(&l.key).ok()?.pack()?, l.size)))
            .filter(|(id, _)| !known.contains(id))
            .collect();
        let mut added = 0;
        self.read_tails(&new, |id, size, read| {
            if let Ok(entries) = read {
                index.add_pack(id, size, &entries)?;
                added += 1;
            }
            Ok(())
        })?;
        Ok(added)
    }

    /// Reads the footers of `packs` and hands each result to `each` (in any order): with up to
    /// [`TAIL_READS`] reads in flight for a store over the network, so that the round trips
    /// overlap; one at a time otherwise (a caller-built backend orders its requests itself).
    fn read_tails(
        &self,
        packs: &[(ObjectId, u64)],
        mut each: impl FnMut(ObjectId, u64, Result<Vec<PackEntry>>) -> Result<()>,
    ) -> Result<()> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let next = AtomicUsize::new(0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let readers = if self.location.over_network() { TAIL_READS } else { 1 };
            for _ in 0..readers.min(packs.len()) {
                let (tx, next) = (tx.clone(), &next);
                s.spawn(move || {
                    while let Some(&(id, size)) = packs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if tx.send((id, size, self.read_pack_tail(&id, size).map(|(e, _)| e))).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let handed = rx.iter().try_for_each(|(id, size, read)| each(id, size, read));
            // On a failure the readers stop at their next pack.
            next.store(packs.len(), Ordering::Relaxed);
            handed
        })
    }

    /// Fills the index from the pack footers in the backend. Returns (packs indexed,
    /// damaged packs skipped with their errors).
    fn rebuild_index(&self, progress: &dyn crate::progress::Progress) -> Result<(usize, Vec<StoreError>)> {
        self.fill_index(Listing::read(&self.backend)?, progress)
    }

    /// [`Store::rebuild_index`] from a listing of tombstoned packs, then packs, taken under
    /// the store lock.
    fn fill_index(
        &self,
        Listing { doomed, packs, damaged }: Listing,
        progress: &dyn crate::progress::Progress,
    ) -> Result<(usize, Vec<StoreError>)> {
        let index = self.index()?;
        index.clear()?;
        index.set_doomed(&doomed)?;
        index.set_damaged(&damaged)?;
        let packs: Vec<(ObjectId, u64)> =
            packs.iter().filter_map(|l| Some((ObjectKey::parse(&l.key).ok()?.pack()?, l.size))).collect();
        progress.start("indexing packs", packs.len() as u64, crate::progress::Unit::Items);
        let mut ok = 0;
        let mut damaged = Vec::new();
        self.read_tails(&packs, |id, size, read| {
            match read {
                Ok(entries) => {
                    index.add_pack(id, size, &entries)?;
                    ok += 1;
                }
                Err(e) => damaged.push(e),
            }
            progress.advance(1);
            Ok(())
        })?;
        progress.finish();
        Ok((ok, damaged))
    }
}

/// What an index sync reads from the store: the tombstoned packs, then the listing of
/// `packs/` (in that order: docs/GC.md, push step 4), then the damaged copies damage records
/// name.
struct Listing {
    doomed: HashSet<ObjectId>,
    packs: Vec<backend::Listed>,
    damaged: HashSet<crate::format::damage::DamagedCopy>,
}

impl Listing {
    fn read(backend: &Backend) -> Result<Listing> {
        let (doomed, packs) = crate::format::lease::doomed_then_listed(backend)?;
        let (damaged, _) = crate::format::damage::read_all(backend)?;
        Ok(Listing { doomed, packs, damaged })
    }
}

impl BaseSource for Store {
    fn base_plain(&self, id: &ObjectId) -> Result<std::sync::Arc<Vec<u8>>> {
        if let Some(hit) = self.bases.get(id) {
            return Ok(hit);
        }
        let loc = self.locate(id)?;
        self.read_base(id, loc)
    }
}

/// Delta bases read at once by [`Store::prefetch_bases`]: each read waits on the disk or the
/// network, not the CPU, so more are in flight than there are cores.
const BASE_READS_IN_FLIGHT: usize = 16;

impl Store {
    /// Reads the delta bases among `bases` that this handle's base cache does not hold, side
    /// by side, into the cache, and returns all of them held: the cache keeps them while the
    /// caller holds the result. A reader about to decode a batch of delta chunks calls it with
    /// their bases first and holds the result while it decodes, rather than waiting for one
    /// base read after another.
    pub fn prefetch_bases(&self, bases: impl IntoIterator<Item = DeltaBases>) -> Result<HeldBases> {
        let mut wanted: Vec<ObjectId> = bases.into_iter().flat_map(|b| b.iter()).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut held = Vec::with_capacity(wanted.len());
        let mut missing = Vec::new();
        for id in wanted {
            match self.bases.get(&id) {
                Some(plain) => held.push(plain),
                None => missing.push(id),
            }
        }
        if missing.len() < 2 {
            return Ok(HeldBases { _held: held });
        }
        let locs = self.locate_many(&missing)?;
        let mut found = Vec::with_capacity(missing.len());
        for (id, loc) in missing.into_iter().zip(locs) {
            found.push((id, loc.ok_or_else(|| base_not_found(&id))?));
        }
        // In pack order, neighbours read together: the bases of consecutive deltas are
        // often consecutive chunks of the image before, and a disk reads them in one go.
        found.sort_unstable_by_key(|(_, loc)| (loc.pack, loc.offset));
        // Through a chunk cache, each base is its own range.
        let local = self.cache.is_none();
        let mut runs: Vec<&[(ObjectId, ChunkLocation)]> = Vec::new();
        let mut start = 0;
        for i in 1..=found.len() {
            let joins = found.get(i).is_some_and(|(_, loc)| {
                let (_, first) = &found[start];
                let (_, prev) = &found[i - 1];
                local
                    && loc.pack == prev.pack
                    && loc.offset <= prev.range().end + BASE_READ_GAP
                    && loc.range().end - first.offset <= BASE_READ_SPAN
            });
            if !joins {
                runs.push(&found[start..i]);
                start = i;
            }
        }
        let read: Vec<Vec<std::sync::Arc<Vec<u8>>>> =
            base_readers()?.install(|| runs.par_iter().map(|run| self.read_bases(run)).collect::<Result<_>>())?;
        held.extend(read.into_iter().flatten());
        Ok(HeldBases { _held: held })
    }

    /// Puts delta bases a caller read from elsewhere (a restore's seed) into the base cache,
    /// each checked against its id first (one that does not match is dropped, and read from
    /// the store when a delta needs it). They stay cached while the result is held.
    pub fn offer_bases(&self, bases: impl IntoIterator<Item = (ObjectId, Vec<u8>)>) -> HeldBases {
        let held = bases
            .into_iter()
            .filter(|(id, plain)| self.chunk_ids.id(plain) == *id)
            .map(|(id, plain)| self.keep_base(&id, plain))
            .collect();
        HeldBases { _held: held }
    }

    /// Reads, checks and caches base `id`, found at `loc`.
    fn read_base(&self, id: &ObjectId, loc: Option<ChunkLocation>) -> Result<std::sync::Arc<Vec<u8>>> {
        let loc = loc.ok_or_else(|| base_not_found(id))?;
        let mut read = self.read_bases(&[(*id, loc)])?;
        read.pop().ok_or_else(|| base_not_found(id))
    }

    /// Reads, checks and caches bases that lie in one pack in offset order: through the
    /// chunk cache one by one where the store has one, else with one read of the local pack
    /// — a `pread`, cheaper than mapping it, and many threads mapping and unmapping at once
    /// would wait on each other.
    fn read_bases(&self, run: &[(ObjectId, ChunkLocation)]) -> Result<Vec<std::sync::Arc<Vec<u8>>>> {
        let (Some((_, first)), Some((_, last))) = (run.first(), run.last()) else { return Ok(Vec::new()) };
        if self.cache.is_some() {
            return run
                .iter()
                .map(|(id, loc)| {
                    let plain = self.read_checked_range(&loc.pack, loc.range(), |s| self.decode_base(id, loc, s))?;
                    Ok(self.keep_base(id, plain))
                })
                .collect();
        }
        let span = first.offset..last.range().end;
        let mut stored = vec![0; (span.end - span.start) as usize];
        self.read_pack_range_into(&first.pack, span.clone(), &mut stored)?;
        run.iter()
            .map(|(id, loc)| {
                let at = (loc.offset - span.start) as usize..(loc.range().end - span.start) as usize;
                Ok(self.keep_base(id, self.decode_base(id, loc, &stored[at])?))
            })
            .collect()
    }

    /// Decodes and checks base `id` (at `loc`) from its stored bytes.
    fn decode_base(&self, id: &ObjectId, loc: &ChunkLocation, stored: &[u8]) -> Result<Vec<u8>> {
        decode_base(loc.codec, stored, loc.plain_len as usize, id, self.config.chunk_max, self.chunk_ids)
    }

    /// Puts base `id` into the base cache.
    fn keep_base(&self, id: &ObjectId, plain: Vec<u8>) -> std::sync::Arc<Vec<u8>> {
        let plain = std::sync::Arc::new(plain);
        self.bases.put(*id, plain.clone());
        plain
    }
}

/// Delta bases a reader fetched with [`Store::prefetch_bases`]: while it holds them, the
/// store's base cache keeps them, so that decoding its deltas finds every base there.
#[must_use = "the bases stay cached only while this is held"]
pub struct HeldBases {
    _held: Vec<std::sync::Arc<Vec<u8>>>,
}

/// Bases this close to each other in a local pack are read together (the bytes between
/// are read and dropped).
const BASE_READ_GAP: u64 = 64 << 10;
/// The most bytes read at once for bases.
const BASE_READ_SPAN: u64 = 4 << 20;

/// The error for a delta base the index does not know.
fn base_not_found(id: &ObjectId) -> StoreError {
    StoreError::NotFound { what: ObjectKind::DeltaBase, key: id.to_hex() }
}

/// The threads [`Store::prefetch_bases`] reads on, started once.
fn base_readers() -> Result<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    if let Some(pool) = POOL.get() {
        return Ok(pool);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(BASE_READS_IN_FLIGHT)
        .thread_name(|i| format!("gstore-bases-{i}"))
        .build()
        .map_err(|e| StoreError::Internal(format!("starting the base reader threads: {e}")))?;
    Ok(POOL.get_or_init(|| pool))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_reads_into_a_buffer_match_mapped_reads_and_name_what_is_wrong() {
        let dir = tempfile::tempdir().expect("tempdir");
        let location = StoreLocation::Local(dir.path().to_path_buf());
        Store::init(&location, &StoreConfig::default()).expect("init");
        let store = Store::open(&location).expect("open");
        let pack = ObjectId::of(b"pack");
        let path = dir.path().join(ObjectKey::Pack(pack).to_string());
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).expect("write");
        for range in [0..1, 5..4097, 4095..100_000, 99_999..100_000] {
            let mut out = vec![0u8; (range.end - range.start) as usize];
            store.read_pack_range_into(&pack, range.clone(), &mut out).expect("read");
            assert_eq!(out, &bytes[range.start as usize..range.end as usize]);
            assert_eq!(out, &store.read_pack_range(&pack, range).expect("mapped read")[..]);
        }
        let mut out = vec![0u8; 10];
        let err = store.read_pack_range_into(&pack, 99_995..100_005, &mut out).expect_err("past the end").to_string();
        assert!(err.contains("truncated"), "{err}");
        assert!(store.read_pack_range_into(&pack, 0..5, &mut out).is_err(), "a buffer of the wrong size");
        let err = store.read_pack_range_into(&ObjectId::of(b"gone"), 0..10, &mut out).expect_err("missing").to_string();
        assert!(err.contains("pack not found"), "{err}");
    }
}
