//! gstore as an OCI registry (the distribution API is `gstore serve`'s; this crate is what
//! it serves). A repository is a tag name: `HOST/web:2` is the image tagged `web:2`, so
//! what `gstore checkpoint --container --tag web:2` stores is pulled as `HOST/web:2`, and
//! `gstore gc` keeps what the registry's tags name as it keeps any tag.
//!
//! Two kinds of image are served:
//! - **Checkpoint images** (`kind` `container-checkpoint`, or a pushed image whose manifest
//!   carries podman's or CRI-O's checkpoint annotation): the store keeps the archive's files
//!   unpacked, so CRIU's page images get page-level deltas across checkpoints. The layer is
//!   served as an uncompressed tar generated from the files the same way every time, and its
//!   config and manifest are generated from the image's metadata ([`oci::CheckpointImage`]),
//!   so their digests never change. A pushed checkpoint image is taken apart the same way: its
//!   manifest as served then names the uncompressed layer, not the compressed one pushed.
//! - **Other images** (base images, anything else pushed): kept as an OCI image layout
//!   (`oci-layout`, `index.json`, `blobs/sha256/HEX`), every blob an opaque file
//!   deduplicated by chunks, served byte for byte as pushed.

pub mod digest;
mod error;
pub mod oci;
mod pipe;
pub mod uploads;

pub use error::{RegistryError, Result};

use digest::{Digest, Hashing};
use gstore_container::archive;
use gstore_restore::cat::FileReader;
use gstore_store::backend::Backend;
use gstore_store::commands::push::stream;
use gstore_store::format::key::ObjectKey;
use gstore_store::format::manifest::{EntryKind, Manifest};
use gstore_store::format::meta::{ImageMeta, Kind};
use gstore_store::progress::Silent;
use gstore_store::{IndexedStore, ObjectId, Store, StoreError, StoreLocation, TagRef};
use oci::{CheckpointImage, Descriptor, Pushed};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use uploads::{Limits, Staged, Uploads};

/// Bytes at most between a registry push's feeder and the push.
const PUSH_BUFFER: u64 = 256 << 20;

/// The largest config of a pushed checkpoint image: it is kept in the image's metadata
/// (its manifest), which is read whole.
pub const CHECKPOINT_CONFIG_MAX: u64 = 4 << 20;

/// A manifest as served.
#[derive(Clone, Debug)]
pub struct ServedManifest {
    /// Its media type.
    pub media_type: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Their digest.
    pub digest: Digest,
}

/// A blob the registry can serve, and where its bytes are.
#[derive(Clone, Debug)]
pub struct Blob {
    /// Its length in bytes.
    pub size: u64,
    source: Source,
}

/// Where a blob's bytes are.
#[derive(Clone, Debug)]
enum Source {
    /// Uploaded, not yet taken in by a manifest.
    Staged(Staged),
    /// A generated document: checkpoint image `image`'s config.
    Config { image: ObjectId, bytes: Arc<[u8]> },
    /// A file of an image kept as a layout (`blobs/sha256/HEX`).
    File { image: ObjectId, path: String },
    /// A checkpoint image's files as their layer.
    Layer { image: ObjectId },
}

impl Source {
    /// The stored image the bytes are of (none for a staged blob).
    fn image(&self) -> Option<ObjectId> {
        match self {
            Source::Staged(_) => None,
            Source::Config { image, .. } | Source::File { image, .. } | Source::Layer { image } => Some(*image),
        }
    }
}

/// What the registry has learned of the store's images, by manifest id. Images never change,
/// but gc removes them: an image is checked to be still stored before what was learned of
/// it is used, and forgotten when it is not ([`Registry::forget`]).
#[derive(Default)]
struct Known {
    /// Blobs by digest.
    blobs: HashMap<Digest, Blob>,
    /// Served manifests by digest.
    manifests: HashMap<Digest, ObjectId>,
    /// Checkpoint images' generated documents.
    checkpoints: HashMap<ObjectId, Arc<CheckpointImage>>,
    /// Layout images whose blobs are in `blobs`.
    layouts: HashSet<ObjectId>,
}

impl Known {
    /// Notes checkpoint image `id`'s documents and blobs, leaving blobs already known as
    /// they are.
    fn add_checkpoint(&mut self, id: ObjectId, c: &Arc<CheckpointImage>) {
        let config: Arc<[u8]> = c.config.as_slice().into();
        let digest = Digest::of(&config);
        let config_blob = Blob { size: config.len() as u64, source: Source::Config { image: id, bytes: config } };
        self.blobs.entry(digest).or_insert(config_blob);
        let layer = Blob { size: c.layer.size, source: Source::Layer { image: id } };
        self.blobs.entry(c.layer.digest.clone()).or_insert(layer);
        self.manifests.entry(Digest::of(&c.manifest)).or_insert(id);
        self.checkpoints.insert(id, c.clone());
    }
}

/// The registry over one store.
pub struct Registry {
    location: StoreLocation,
    /// The store's objects, to check that an image is still stored.
    backend: Backend,
    uploads: Uploads,
    /// The store, open with its index while requests use it; the index lock is let go
    /// when none does, so gstore commands on this machine can run between them.
    open: Mutex<Weak<IndexedStore>>,
    known: Mutex<Known>,
    /// Manifest pushes, one at a time.
    writing: Mutex<()>,
}

/// The kind of image a manifest is, for the registry.
enum ImageKind {
    /// Kept as an OCI image layout.
    Layout,
    /// A checkpoint kept unpacked.
    Unpacked,
    /// Not a container image; its kind.
    Other(String),
}

fn kind_of(m: &Manifest) -> ImageKind {
    match m.kind() {
        Some(Kind::OciImage) => ImageKind::Layout,
        Some(Kind::ContainerCheckpoint) => ImageKind::Unpacked,
        _ if m.meta.oci.as_ref().is_some_and(|o| o.get("config").is_some()) => ImageKind::Unpacked,
        Some(kind) => ImageKind::Other(kind.to_string()),
        None => ImageKind::Other("unset".into()),
    }
}

/// The tag name a repository maps to.
pub fn tag_name(repo: &str) -> Result<String> {
    if repo.contains('/') {
        return Err(RegistryError::NameInvalid(format!(
            "repository {repo:?}: gstore's repositories are one path component (a tag name), as in HOST/web:2"
        )));
    }
    TagRef::from_parts(repo, "latest").map_err(|e| RegistryError::NameInvalid(e.to_string()))?;
    Ok(repo.to_string())
}

/// The tag a manifest reference (a tag or a digest) of `repo` is stored under: a digest
/// `sha256:HEX` as version `sha256-HEX`.
fn tag_of(repo: &str, reference: &str) -> Result<TagRef> {
    let version = match reference.strip_prefix("sha256:") {
        Some(hex) => format!("sha256-{hex}"),
        None => reference.to_string(),
    };
    TagRef::from_parts(&tag_name(repo)?, &version).map_err(|e| RegistryError::NameInvalid(e.to_string()))
}

impl Registry {
    /// The registry over the store at `location`, its uploads (kept in the store) bounded by
    /// `limits`.
    pub fn new(location: StoreLocation, limits: Limits) -> Result<Registry> {
        let backend = location.backend()?;
        Ok(Registry {
            uploads: Uploads::new(backend.clone(), limits),
            backend,
            location,
            open: Mutex::default(),
            known: Mutex::default(),
            writing: Mutex::default(),
        })
    }

    /// The uploads.
    pub fn uploads(&self) -> &Uploads {
        &self.uploads
    }

    /// The store with its index, shared by the requests in flight.
    fn store(&self) -> Result<Arc<IndexedStore>> {
        let mut open = self.open.lock().expect("registry store lock");
        if let Some(s) = open.upgrade() {
            return Ok(s);
        }
        let s = Arc::new(Store::open_indexed(&self.location, &|msg| eprintln!("gstore serve: {msg}"))?);
        *open = Arc::downgrade(&s);
        Ok(s)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().expect("registry state lock")
    }

    /// Whether image `id` is still stored; what was learned of one gc removed is forgotten.
    fn stored(&self, id: ObjectId) -> Result<bool> {
        let there = self.backend.size(&ObjectKey::Manifest(id))?.is_some();
        if !there {
            self.forget(id);
        }
        Ok(there)
    }

    /// Forgets image `id`, which gc removed. A blob it shared with another image goes with
    /// it: the layout images are learned again (their manifests read once more), and the
    /// checkpoint images, whose documents are kept, give theirs back.
    fn forget(&self, id: ObjectId) {
        let mut known = self.known();
        known.checkpoints.remove(&id);
        known.layouts.clear();
        known.manifests.retain(|_, image| *image != id);
        known.blobs.retain(|_, b| b.source.image() != Some(id));
        let checkpoints: Vec<_> = known.checkpoints.iter().map(|(i, c)| (*i, c.clone())).collect();
        for (i, c) in checkpoints {
            known.add_checkpoint(i, &c);
        }
    }

    /// The versions (tags) of repository `repo`, sorted.
    pub fn tags(&self, repo: &str) -> Result<Vec<String>> {
        let name = tag_name(repo)?;
        let store = self.store()?;
        let mut tags: Vec<String> = store
            .list_tags()?
            .into_iter()
            .flatten()
            .map(|r| r.tag())
            .filter(|t| t.name == name)
            .map(|t| t.version)
            .collect();
        if tags.is_empty() {
            return Err(RegistryError::NameUnknown(repo.to_string()));
        }
        tags.sort();
        Ok(tags)
    }

    /// Runs `f`; when it fails for something of the store that is not where this server's
    /// index says (a pack another server pushed since the index was last brought up to date,
    /// a chunk gc moved to another pack), brings the index up to date and runs `f` once more.
    /// The index is synced when the store is opened, but a busy server keeps it open.
    fn fresh<T>(&self, f: impl Fn() -> Result<T>) -> Result<T> {
        match f() {
            Err(e) if not_found(&e) => {
                self.store()?.sync_index()?;
                f()
            }
            other => other,
        }
    }

    /// The manifest `reference` (a tag or a digest) names in `repo`.
    pub fn manifest(&self, repo: &str, reference: &str) -> Result<ServedManifest> {
        self.fresh(|| self.manifest_once(repo, reference))
    }

    /// [`Registry::manifest`], the index as it is.
    fn manifest_once(&self, repo: &str, reference: &str) -> Result<ServedManifest> {
        let store = self.store()?;
        if reference.starts_with("sha256:") {
            let want = Digest::parse(reference)?;
            let known = self.known().manifests.get(&want).copied();
            let id = match known {
                Some(id) if self.stored(id)? => Some(id),
                _ => {
                    self.learn(&store, repo)?;
                    self.known().manifests.get(&want).copied()
                }
            };
            let served = id.map(|id| self.serve(&store, id)).transpose()?;
            return served.filter(|s| s.digest == want).ok_or_else(|| {
                RegistryError::ManifestUnknown(format!("no manifest {reference} in repository {repo}"))
            });
        }
        let tag = tag_of(repo, reference)?;
        let rec = store
            .get_tag(&tag)?
            .ok_or_else(|| RegistryError::ManifestUnknown(format!("no image {repo}:{reference} (no tag {tag})")))?;
        self.serve(&store, rec.manifest_id()?)
    }

    /// The manifest of image `id` as served.
    fn serve(&self, store: &IndexedStore, id: ObjectId) -> Result<ServedManifest> {
        let m = store.get_manifest(&id)?;
        match kind_of(&m) {
            ImageKind::Unpacked => {
                let c = self.checkpoint(store, id, &m)?;
                Ok(ServedManifest {
                    media_type: oci::MANIFEST_V1.into(),
                    digest: Digest::of(&c.manifest),
                    bytes: c.manifest.clone(),
                })
            }
            ImageKind::Layout => {
                let (media_type, digest) = layout_manifest(&m)?;
                let path = format!("blobs/sha256/{}", digest.hex());
                let (mut reader, _) = FileReader::open(store, &m, &path)?;
                let mut bytes = Vec::new();
                reader.read_to_end(&mut bytes).map_err(FileReader::store_error)?;
                if Digest::of(&bytes) != digest {
                    return Err(RegistryError::ManifestInvalid(format!("image {id}: its {path} does not match its name")));
                }
                self.learn_layout(id, &m);
                Ok(ServedManifest { media_type, bytes, digest })
            }
            ImageKind::Other(kind) => Err(RegistryError::ManifestUnknown(format!(
                "image {} is not a container image (its kind is {kind}); the registry serves container checkpoints and images pushed to it",
                id.to_hex()
            ))),
        }
    }

    /// A checkpoint image's documents: its layer's digest is computed from the image's files
    /// the first time (reading them all once) and kept.
    fn checkpoint(&self, store: &IndexedStore, id: ObjectId, m: &Manifest) -> Result<Arc<CheckpointImage>> {
        if let Some(c) = self.known().checkpoints.get(&id) {
            return Ok(c.clone());
        }
        let mut hashing = Hashing::default();
        archive::write_archive(store, m, &mut hashing, "the image's layer", &Silent)?;
        let (digest, size) = hashing.finish();
        let c = Arc::new(CheckpointImage::new(m, Descriptor { digest, size }));
        self.known().add_checkpoint(id, &c);
        Ok(c)
    }

    /// Notes the blobs of layout image `id`.
    fn learn_layout(&self, id: ObjectId, m: &Manifest) {
        let mut known = self.known();
        if !known.layouts.insert(id) {
            return;
        }
        for e in m.entries.iter().filter(|e| e.kind == EntryKind::File) {
            let Some(d) = e.path.strip_prefix("blobs/sha256/").and_then(|h| Digest::parse(&format!("sha256:{h}")).ok())
            else {
                continue;
            };
            known.blobs.insert(d, Blob { size: e.size, source: Source::File { image: id, path: e.path.clone() } });
        }
        if let Ok((_, d)) = layout_manifest(m) {
            known.manifests.insert(d, id);
        }
    }

    /// Learns the blobs of every layout image, and the documents of `repo`'s checkpoint
    /// images (reading each such image once, the first time).
    fn learn(&self, store: &IndexedStore, repo: &str) -> Result<()> {
        for rec in store.list_tags()?.into_iter().flatten() {
            let id = rec.manifest_id()?;
            let known = {
                let k = self.known();
                k.layouts.contains(&id) || k.checkpoints.contains_key(&id)
            };
            if known {
                continue;
            }
            let m = match store.get_manifest(&id) {
                Ok(m) => m,
                // Removed since the listing.
                Err(gstore_store::StoreError::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            match kind_of(&m) {
                ImageKind::Layout => self.learn_layout(id, &m),
                ImageKind::Unpacked if rec.tag().name == repo => {
                    self.checkpoint(store, id, &m)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Blob `digest`: uploaded by `owner` (a token's number), or in the store (`repo`'s
    /// images, or any image kept as a layout).
    pub fn blob(&self, repo: &str, digest: &Digest, owner: u64) -> Result<Blob> {
        self.fresh(|| self.blob_once(repo, digest, owner))
    }

    /// [`Registry::blob`], the index as it is.
    fn blob_once(&self, repo: &str, digest: &Digest, owner: u64) -> Result<Blob> {
        let known = self.known().blobs.get(digest).cloned();
        if let Some(b) = known {
            if b.source.image().map_or(Ok(true), |id| self.stored(id))? {
                return Ok(b);
            }
        }
        if let Some(staged) = self.uploads.staged(owner, digest)? {
            return Ok(Blob { size: staged.size(), source: Source::Staged(staged) });
        }
        let store = self.store()?;
        self.learn(&store, repo)?;
        self.known().blobs.get(digest).cloned().ok_or_else(|| RegistryError::BlobUnknown(digest.to_string()))
    }

    /// Writes `blob`'s bytes to `out`. Bytes from the store are checked chunk by chunk before
    /// they are written: damage stops the copy with an error, never a wrong byte. When its
    /// image is found gone midway (gc removed it), it is forgotten, so the next request for the
    /// blob looks for it again.
    pub fn write_blob(&self, blob: &Blob, out: &mut dyn Write) -> Result<()> {
        let mut counted = archive::Counting { inner: out, bytes: 0 };
        let mut copied = self.copy_blob(blob, &mut counted);
        if copied.as_ref().is_err_and(not_found) {
            // The index may be behind the store ([`Registry::fresh`]): brought up to date, the
            // copy starts again if nothing was sent yet, else the client's retry finds it so.
            self.store()?.sync_index()?;
            if counted.bytes == 0 {
                copied = self.copy_blob(blob, &mut counted);
            }
        }
        if let (Err(e), Some(id)) = (&copied, blob.source.image()) {
            if not_found(e) {
                self.forget(id);
            }
        }
        copied
    }

    /// Writes `blob`'s bytes to `out` ([`Registry::write_blob`]).
    fn copy_blob(&self, blob: &Blob, out: &mut dyn Write) -> Result<()> {
        match &blob.source {
            Source::Config { bytes, .. } => {
                out.write_all(bytes).map_err(|e| RegistryError::io("writing", Path::new("a blob"), e))
            }
            Source::Layer { image } => {
                let store = self.store()?;
                let m = store.get_manifest(image)?;
                archive::write_archive(&store, &m, out, "a layer", &Silent)?;
                Ok(())
            }
            source => self.read_blob(source, &mut |r| {
                std::io::copy(r, out).map_err(|e| match e.downcast::<gstore_store::StoreError>() {
                    Ok(s) => s.into(),
                    Err(e) => RegistryError::io("copying", Path::new("a blob"), e),
                })?;
                Ok(())
            }),
        }
    }

    /// Runs `f` on a reader of a staged blob or a layout image's file.
    fn read_blob(&self, source: &Source, f: &mut dyn FnMut(&mut dyn Read) -> Result<()>) -> Result<()> {
        match source {
            Source::Staged(staged) => f(&mut self.uploads.reader(staged)),
            Source::File { image, path } => {
                let store = self.store()?;
                let m = store.get_manifest(image)?;
                let (mut reader, _) = FileReader::open(&store, &m, path)?;
                f(&mut reader)
            }
            Source::Config { bytes, .. } => f(&mut &bytes[..]),
            Source::Layer { .. } => {
                let blob = Blob { size: 0, source: source.clone() };
                pipe::piped(|w| self.write_blob(&blob, w), f)
            }
        }
    }

    /// Stores manifest `bytes` pushed as `reference` (a tag or its own digest) of `repo` by
    /// `owner`; returns the digest of the manifest as it will be served. Every blob it names
    /// must have been uploaded by `owner` or be in the store. A checkpoint image is taken apart into its files
    /// (its layer decompressed: the manifest served names that layer uncompressed); any other
    /// is kept as an OCI image layout. Nothing is tagged unless all of it is stored.
    pub fn put_manifest(
        &self,
        repo: &str,
        reference: &str,
        content_type: Option<&str>,
        bytes: &[u8],
        owner: u64,
    ) -> Result<Digest> {
        let _one_at_a_time = self.writing.lock().expect("registry write lock");
        let pushed = Pushed::parse(bytes, content_type)?;
        let digest = Digest::of(bytes);
        if reference.starts_with("sha256:") && Digest::parse(reference)? != digest {
            return Err(RegistryError::DigestInvalid(format!("the manifest's bytes are {digest}, not {reference}")));
        }
        let tag = tag_of(repo, reference)?;
        tag.check_new()?;
        if pushed.is_checkpoint() && pushed.config.size > CHECKPOINT_CONFIG_MAX {
            return Err(RegistryError::ManifestInvalid(format!(
                "the image's config is {} bytes: a checkpoint image's config is kept in the image's metadata, at most {CHECKPOINT_CONFIG_MAX} bytes",
                pushed.config.size
            )));
        }
        let mut named = vec![pushed.config.clone()];
        named.extend(pushed.layers.iter().cloned());
        let mut blobs = Vec::new();
        for d in &named {
            let blob = self.blob(repo, &d.digest, owner).map_err(|e| match e {
                RegistryError::BlobUnknown(_) => RegistryError::ManifestBlobUnknown(d.digest.to_string()),
                e => e,
            })?;
            if blob.size != d.size {
                return Err(RegistryError::ManifestInvalid(format!(
                    "blob {} is {} bytes; the manifest says {}",
                    d.digest, blob.size, d.size
                )));
            }
            blobs.push((d.digest.clone(), blob));
        }
        let store = self.store()?;
        let served = if pushed.is_checkpoint() {
            self.put_checkpoint(&store, &tag, &pushed, &blobs)?
        } else {
            self.put_layout(&store, &tag, &pushed, bytes, &digest, &blobs)?;
            digest
        };
        // The image is tagged: a blob left behind is swept later ([`Uploads::sweep`]).
        if let Err(e) = self.uploads.taken_in(owner, &named.iter().map(|d| &d.digest).collect::<Vec<_>>()) {
            eprintln!("gstore serve: removing the uploads {repo}:{reference} took in: {e}");
        }
        Ok(served)
    }

    /// Stores a pushed checkpoint image unpacked; returns its served manifest's digest.
    fn put_checkpoint(
        &self,
        store: &IndexedStore,
        tag: &TagRef,
        pushed: &Pushed,
        blobs: &[(Digest, Blob)],
    ) -> Result<Digest> {
        let mut config = Vec::new();
        self.read_blob(&blobs[0].1.source, &mut |r| {
            r.read_to_end(&mut config).map_err(|e| RegistryError::io("reading", Path::new("the config"), e)).map(drop)
        })?;
        let config = String::from_utf8(config)
            .map_err(|_| RegistryError::ManifestInvalid("the image's config is not UTF-8 JSON".into()))?;
        let meta = ImageMeta {
            oci: Some(json!({ "config": config, "annotations": pushed.annotations })),
            ..ImageMeta::default()
        };
        let (layer_digest, layer) = &blobs[1];
        let what = format!("layer {layer_digest}");
        let mut report = None;
        self.read_blob(&layer.source, &mut |r| {
            let (pushed, _) = archive::push_archive(store, r, &what, tag, meta.clone(), &Silent)?;
            report = Some(pushed);
            Ok(())
        })?;
        let id = report.expect("the push reported").manifest;
        Ok(self.serve(store, id)?.digest)
    }

    /// Stores a pushed image as an OCI image layout.
    fn put_layout(
        &self,
        store: &IndexedStore,
        tag: &TagRef,
        pushed: &Pushed,
        bytes: &[u8],
        digest: &Digest,
        blobs: &[(Digest, Blob)],
    ) -> Result<()> {
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{ "mediaType": pushed.media_type, "digest": digest.to_string(), "size": bytes.len(),
                            "annotations": { "org.opencontainers.image.ref.name": tag.version } }],
        });
        let meta = ImageMeta {
            kind: Some(Kind::OciImage),
            oci: Some(json!({ "media_type": pushed.media_type, "manifest": digest.to_string() })),
            ..ImageMeta::default()
        };
        let (report, ()) = stream::push_fed(store, tag, PUSH_BUFFER, &Silent, |sink| -> Result<()> {
            let small = |path: &str, b: &[u8]| sink.file(path, 0o644)?.read_from(&mut &b[..]).map(drop);
            small("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
            small("index.json", &serde_json::to_vec(&index).expect("JSON values serialize"))?;
            sink.dir("blobs", 0o755)?;
            sink.dir("blobs/sha256", 0o755)?;
            small(&format!("blobs/sha256/{}", digest.hex()), bytes)?;
            let mut done = HashSet::new();
            for (d, blob) in blobs {
                if !done.insert(d) {
                    continue;
                }
                let mut file = sink.file(&format!("blobs/sha256/{}", d.hex()), 0o644)?;
                self.read_blob(&blob.source, &mut |r| file.read_from(r).map(drop).map_err(Into::into))?;
            }
            sink.finish(meta)?;
            Ok(())
        })?;
        let id = report.manifest;
        self.learn_layout(id, &store.get_manifest(&id)?);
        Ok(())
    }
}

/// The media type and digest of a layout image's manifest.
fn layout_manifest(m: &Manifest) -> Result<(String, Digest)> {
    let o = m.meta.oci.as_ref();
    let text = |k: &str| o.and_then(|o| o.get(k)).and_then(Value::as_str);
    let digest =
        text("manifest").ok_or_else(|| RegistryError::ManifestInvalid("the image names no manifest".into()))?;
    Ok((text("media_type").unwrap_or(oci::MANIFEST_V1).to_string(), Digest::parse(digest)?))
}

/// Whether `e` says that something of the store is not there.
fn not_found(e: &RegistryError) -> bool {
    let store_error = match e {
        RegistryError::Store(s) => Some(s),
        RegistryError::Container(c) => c.store_error(),
        _ => None,
    };
    matches!(store_error, Some(StoreError::NotFound { .. }))
}
