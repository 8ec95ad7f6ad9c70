//! The store handle: a backend holding packs, manifests and tags, opened with its config
//! (unlocked, for an encrypted store), and what it reads and writes without the index: pack
//! ranges and footers, manifests, and new packs. [`crate::repo::indexed`] adds the index,
//! [`crate::repo::tags`] the tags, [`crate::repo::bases`] the delta bases.

use crate::backend::Backend;
use crate::codec::{BaseSource, Decoder};
use crate::crypto::{keyring, MasterKey, Secret};
use crate::environment;
use crate::error::{Result, StoreError};
use crate::format::config::StoreConfig;
use crate::format::id::{ChunkIds, ObjectId};
use crate::format::key::ObjectKey;
use crate::format::manifest::Manifest;
use crate::format::pack::{self, PackEntry};
use crate::repo::base_cache::BaseCache;
use crate::repo::cache::RangeCache;
use crate::repo::location::{looks_like_host_port, StoreLocation};
use crate::repo::seen::SeenTags;
use crate::ObjectKind;
use bytes::Bytes;
use std::path::PathBuf;

/// An open store, without its index: enough for tags, manifests and pack reads by location.
/// Commands that locate, read or write chunks open an [`crate::IndexedStore`] instead
/// ([`Store::open_indexed`], which takes the store lock).
pub struct Store {
    pub(super) backend: Backend,
    pub(super) config: StoreConfig,
    pub(super) location: StoreLocation,
    pub(super) cache: Option<RangeCache>,
    /// Set by [`Store::simulated`].
    #[cfg(feature = "simulation")]
    simulation: Option<crate::repo::simulation::Simulation>,
    /// Delta bases read lately.
    pub(super) bases: BaseCache,
    /// For an encrypted remote store: the newest value of each tag this machine has seen.
    pub(super) seen_tags: Option<SeenTags>,
    /// How the store names chunks.
    pub(super) chunk_ids: ChunkIds,
    /// Which of this machine's indexes of the store to use ([`Store::with_index_slot`]).
    pub(super) index_slot: Option<u32>,
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
    let key = ObjectKey::Probe(format!("conditional-{}", ObjectId::unique().short()));
    let refuse = |what: &str| {
        StoreError::Refused(format!(
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
        if let StoreLocation::Local(root) = location {
            std::fs::create_dir_all(root).map_err(|e| StoreError::io("creating store directory", root, e))?;
        }
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
        if backend.get_opt(&ObjectKey::Config)?.is_some() {
            return Err(StoreError::AlreadyExists { what: ObjectKind::Store, key: location.describe() });
        }
        let master = MasterKey::generate();
        let config = config.clone().encrypted(|b| master.config_check(b));
        config.validate()?;
        // The record first: a config without a record that opens it would be a store nobody
        // can open. An init that then loses the race deletes its record; one killed first
        // leaves a record whose master key checks neither the config nor the record check,
        // so it is passed over and never counts as a key (keyring::remove).
        let id = keyring::add(&backend, &master, secret)?;
        if let Err(e) = Self::init_backend(&backend, location, &config) {
            backend.delete(&ObjectKey::KeyRecord(id))?;
            return Err(e);
        }
        Ok(id)
    }

    /// Creates a new store in `backend` (described by `location`). Fails if one is there.
    pub fn init_backend(backend: &Backend, location: &StoreLocation, config: &StoreConfig) -> Result<()> {
        config.validate()?;
        let json = serde_json::to_vec_pretty(config).expect("config serializes");
        match backend.put_new(&ObjectKey::Config, json) {
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
            cache,
            #[cfg(feature = "simulation")]
            simulation: None,
            bases: BaseCache::default(),
            seen_tags,
            chunk_ids,
            index_slot: None,
        })
    }

    /// The config of the store in `backend` (described by `location`), without opening it:
    /// for a server, which serves an encrypted store without its key, and for key management.
    pub fn read_config(backend: &Backend, location: &StoreLocation) -> Result<StoreConfig> {
        let bytes =
            backend.get_opt(&ObjectKey::Config)?.ok_or_else(|| StoreError::NotInitialized(location.describe()))?;
        Ok(StoreConfig::from_json(&bytes)?)
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
            return Err(StoreError::Refused(format!(
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
    pub(super) fn index_dir(&self) -> PathBuf {
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

    /// Reads a byte range of a pack from the store itself (never from this machine's range
    /// cache), telling a missing or truncated pack apart. For a local store the range is
    /// memory-mapped (and pre-faulted), so it is a view of the page cache, not a copy; the
    /// mapping lives as long as the returned bytes.
    pub fn read_pack_range(&self, pack: &ObjectId, range: std::ops::Range<u64>) -> Result<Bytes> {
        let key = ObjectKey::Pack(*pack);
        self.backend.get_range(&key, range.clone()).map_err(|e| self.pack_read_failure(key, &range, e))
    }

    /// Reads a byte range of a pack into `out` (exactly `range`'s length), from the store
    /// itself as [`Store::read_pack_range`] does. A local pack is read with `pread` straight
    /// into `out` (e.g. pinned memory a GPU copies from): one copy from the page cache, and no
    /// mapping, whose setup and teardown serialise threads on the process's address space.
    pub fn read_pack_range_into(&self, pack: &ObjectId, range: std::ops::Range<u64>, out: &mut [u8]) -> Result<()> {
        let key = ObjectKey::Pack(*pack);
        self.backend.get_range_into(&key, range.clone(), out).map_err(|e| self.pack_read_failure(key, &range, e))
    }

    /// Says that a byte range of a pack will be read soon: a local store reads it into the
    /// page cache ahead (see `Objects::will_read`).
    pub fn will_read_pack_range(&self, pack: &ObjectId, range: std::ops::Range<u64>) {
        self.backend.will_read(&ObjectKey::Pack(*pack), range)
    }

    /// A failed range read of a pack, said as a missing or truncated pack where it is one.
    fn pack_read_failure(&self, key: ObjectKey, range: &std::ops::Range<u64>, e: StoreError) -> StoreError {
        match e {
            StoreError::NotFound { .. } => StoreError::NotFound { what: ObjectKind::Pack, key: key.to_string() },
            e => match self.backend.size(&key) {
                Ok(None) => StoreError::NotFound { what: ObjectKind::Pack, key: key.to_string() },
                Ok(Some(size)) if size < range.end => truncated(key.to_string(), size, range.end),
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

    /// Whether pack ranges are best read into a caller's buffer with `pread` (a local store,
    /// no range cache) rather than taken as the shared bytes a remote backend or the range
    /// cache hands out: threads that map and unmap a local pack at once wait on each other,
    /// and a remote range arrives as bytes of its own anyway.
    pub fn reads_into_buffers(&self) -> bool {
        self.cache.is_none() && self.backend.local_root().is_some()
    }

    /// [`Store::read_checked_range`] for many threads reading at once: a local store's range is
    /// read with `pread` into `scratch` (grown to fit) rather than mapped, since threads that
    /// map and unmap at once wait on each other and every unmapping interrupts them all;
    /// other stores' ranges go through the range cache as [`Store::read_checked_range`] reads
    /// them.
    pub fn read_checked_range_buffered<T>(
        &self,
        pack: &ObjectId,
        range: std::ops::Range<u64>,
        scratch: &mut Vec<u8>,
        mut check: impl FnMut(&[u8]) -> Result<T>,
    ) -> Result<T> {
        if !self.reads_into_buffers() {
            return self.read_checked_range(pack, range, |bytes| check(bytes));
        }
        let len = (range.end - range.start) as usize;
        if scratch.len() < len {
            scratch.resize(len, 0);
        }
        self.read_pack_range_into(pack, range, &mut scratch[..len])?;
        check(&scratch[..len])
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
            Err(e) if e.is_damage() && self.backend.distrust(&ObjectKey::Pack(*pack)) => {
                let bytes = self.read_pack_range(pack, range)?;
                Ok((check(&bytes)?, bytes))
            }
            Err(e) => Err(e),
        }
    }

    /// A chunk decoder for this store (its chunk size limit and chunk ids) whose delta chunks
    /// find their bases in `bases`.
    pub fn decoder_over<'a>(&self, bases: &'a dyn BaseSource) -> Decoder<'a> {
        Decoder::with_bases(self.config.chunk_max, bases).with_ids(self.chunk_ids)
    }

    /// Reads and checks a pack's footer (without reading its chunk data).
    pub fn read_pack_footer(&self, pack: &ObjectId) -> Result<Vec<PackEntry>> {
        let key = ObjectKey::Pack(*pack);
        let size = self
            .backend
            .size(&key)?
            .ok_or_else(|| StoreError::NotFound { what: ObjectKind::Pack, key: key.to_string() })?;
        Ok(self.read_pack_tail(pack, size)?.0)
    }

    /// Reads and checks the footer of a pack `size` bytes long (as listed): its entries, and
    /// the raw tail they were parsed from (footer entries, then trailer).
    pub fn read_pack_tail(&self, pack: &ObjectId, size: u64) -> Result<(Vec<PackEntry>, Vec<u8>)> {
        crate::repo::packs::read_tail(&self.backend, pack, size, self.config.chunk_max)
    }

    /// This handle for a deterministic simulation seeded with `seed` (tests only): pack salts
    /// derive from the seed and a counter, and requests are made one at a time.
    #[cfg(feature = "simulation")]
    pub fn simulated(mut self, seed: u64) -> Store {
        self.simulation = Some(crate::repo::simulation::Simulation::new(seed));
        self
    }

    /// True when this handle makes its requests one at a time (a simulation).
    fn serial(&self) -> bool {
        #[cfg(feature = "simulation")]
        return self.simulation.is_some();
        #[cfg(not(feature = "simulation"))]
        false
    }

    /// A new, empty pack builder with a fresh random salt.
    pub fn new_pack(&self) -> pack::PackBuilder {
        #[cfg(feature = "simulation")]
        if let Some(s) = &self.simulation {
            return s.new_pack(self.config().pack_ids);
        }
        pack::PackBuilder::new(self.config().pack_ids)
    }

    /// How many small reads (footers, manifests) to keep in flight: 16 over a network, one
    /// for a local disk or a caller-built backend.
    pub fn reads_in_flight(&self) -> usize {
        if self.location.over_network() && !self.serial() {
            16
        } else {
            1
        }
    }

    /// How many packs a push puts together, names and stores at once. Over a network, four
    /// uploads overlap. On a local disk, half the cores, from 2 to 8: each writer assembles,
    /// hashes and fsyncs 48 MiB packs in turn, and a disk takes parallel fsyncs faster (on the
    /// 16-core H100 machine, pushing 4 GiB of bf16: 2 writers 1.0–1.1 GB/s, 4 writers 1.3–1.5,
    /// 8 writers 1.8, when the cores stopped waiting for them).
    pub fn upload_concurrency(&self) -> usize {
        match self.location {
            _ if self.serial() => 1,
            StoreLocation::Local(_) => std::thread::available_parallelism().map_or(2, |n| n.get() / 2).clamp(2, 8),
            _ => 4,
        }
    }

    /// Stores an encoded manifest under its id (`ObjectId::of(&bytes)`).
    pub fn put_manifest(&self, id: &ObjectId, bytes: Vec<u8>) -> Result<()> {
        self.backend.put(&ObjectKey::Manifest(*id), bytes)
    }

    /// Reads and checks a manifest.
    pub fn get_manifest(&self, id: &ObjectId) -> Result<Manifest> {
        let key = ObjectKey::Manifest(*id);
        let bytes = match self.backend.get(&key) {
            Err(StoreError::NotFound { .. }) => {
                return Err(StoreError::NotFound { what: ObjectKind::Manifest, key: key.to_string() })
            }
            other => other?,
        };
        Ok(Manifest::decode(&bytes, id)?)
    }
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
