//! Checking a store: every tagged image's manifest, the packs its chunks live in, and (with
//! `read_data`) every referenced chunk's bytes against its id. Damage is reported per image,
//! naming the tags that can no longer be restored. An encrypted store can also be checked
//! without its key, as far as the framing of its sealed objects goes ([`framing`]).

use crate::backend::Backend;
use crate::codec;
use crate::crypto::{keyring, sealed};
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::Family;
use crate::format::manifest::Manifest;
use crate::format::pack::PackEntry;
use crate::progress::{Progress, Unit};
use crate::repo::damage;
use crate::repo::index::ChunkLocation;
use crate::repo::indexed::IndexedStore;
use gstore_format::FormatError;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Problems listed per image before the rest are only counted.
const PROBLEMS_SHOWN: usize = 5;

/// The state of one tagged image.
#[derive(Debug, Clone, Serialize)]
pub struct ImageStatus {
    /// `name:version`, or the tag's key when the record itself is unreadable.
    pub tag: String,
    /// Manifest id, when known.
    pub manifest: Option<String>,
    /// True when nothing is wrong.
    pub ok: bool,
    /// What is wrong (the first few problems).
    pub problems: Vec<String>,
    /// How many problems there are in all.
    pub problem_count: usize,
}

/// The outcome of a verify run.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// One status per tag.
    pub images: Vec<ImageStatus>,
    /// Packs whose footers were checked.
    pub packs_checked: usize,
    /// Chunks whose data was decoded and hashed (with `read_data`).
    pub chunks_read: u64,
    /// Bytes of pack data read (with `read_data`).
    pub bytes_read: u64,
    /// Whether chunk data was read.
    pub read_data: bool,
    /// Damaged stored copies found and recorded in the store (damage records: pushes and
    /// copies then store good copies, restores read those, gc drops the damaged ones).
    pub damaged_copies_recorded: usize,
    /// Why damage found could not be recorded (a read-only token, say), if it could not.
    pub damage_not_recorded: Option<String>,
}

impl VerifyReport {
    /// Tags whose images are damaged.
    pub fn damaged(&self) -> Vec<&str> {
        self.images.iter().filter(|i| !i.ok).map(|i| i.tag.as_str()).collect()
    }
}

/// The outcome of checking an encrypted store without its key.
#[derive(Debug, Clone, Serialize)]
pub struct FramingReport {
    /// Sealed objects whose header and length were checked.
    pub objects_checked: usize,
    /// Key records read.
    pub key_records: usize,
    /// What is wrong, one line per object.
    pub problems: Vec<String>,
}

/// Checks the encrypted store in `backend` (as [`crate::StoreLocation::backend`] gives it:
/// sealed) without its key: every key record parses, and every sealed object — packs,
/// manifests, tags, leases, restore profiles — starts with a sealed object's header that
/// declares the length it has. What the objects hold is checked only with the key.
pub fn framing(backend: &Backend, progress: &dyn Progress) -> Result<FramingReport> {
    let mut report = FramingReport { objects_checked: 0, key_records: 0, problems: Vec::new() };
    for (id, rec) in keyring::list(backend)? {
        report.key_records += 1;
        if let Err(e) = rec {
            report.problems.push(format!("key record {id}: {e}"));
        }
    }
    let families = [Family::Packs, Family::Manifests, Family::Tags, Family::Leases, Family::Profiles];
    let mut listed = Vec::new();
    for f in families {
        listed.extend(backend.list(f.prefix())?.into_iter().filter(|l| l.key.is_sealed()));
    }
    progress.start("verify: sealed objects", listed.len() as u64, Unit::Items);
    for l in &listed {
        progress.advance(1);
        let header = backend
            .get_range(&l.key, 0..sealed::HEADER.min(l.size))
            .and_then(|h| sealed::Header::parse(&h, &l.key.to_string()));
        match header {
            Ok(h) if h.sealed_len() == l.size => {}
            Ok(h) => {
                report.problems.push(format!("{}: {} bytes, but its header says {}", l.key, l.size, h.sealed_len()))
            }
            // Deleted between the listing and the read (gc, a lease ending): not checked.
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => report.problems.push(e.to_string()),
        }
        report.objects_checked += 1;
    }
    progress.finish();
    Ok(report)
}

/// What was learned about one pack.
struct PackCheck {
    entries: HashMap<ObjectId, PackEntry>,
    bad_chunks: HashMap<ObjectId, String>,
}

/// Each image's manifest (or why it could not be read), by id.
type Manifests = BTreeMap<ObjectId, std::result::Result<Manifest, String>>;
/// What checking each pack found (or why it could not be checked), by pack.
type PackResults = HashMap<ObjectId, std::result::Result<PackCheck, String>>;

/// Where the images' chunks are, per the index (each chunk looked up once).
#[derive(Default)]
struct Located {
    /// Each chunk's place, `None` where no pack holds it whole.
    chunks: HashMap<ObjectId, Option<ChunkLocation>>,
    /// The chunks (and delta bases) to check in each pack.
    wanted: HashMap<ObjectId, Vec<ObjectId>>,
    /// Each delta chunk's bases and their places.
    bases: HashMap<ObjectId, Vec<(ObjectId, Option<ChunkLocation>)>>,
    /// Chunks stored only as deltas whose bases are stored whole nowhere: such a base.
    lost_bases: HashMap<ObjectId, ObjectId>,
}

/// Verifies every tagged image.
pub fn verify(store: &IndexedStore, read_data: bool, progress: &dyn Progress) -> Result<VerifyReport> {
    let (images, manifests) = read_images(store)?;
    let located = locate_chunks(store, &manifests)?;
    let (pack_results, chunks_read, bytes_read) = check_packs(store, &located, read_data, progress);
    let (damaged_copies_recorded, damage_not_recorded) = match record_damage(store, &pack_results) {
        Ok(n) => (n, None),
        Err(e) => (0, Some(e.to_string())),
    };
    let statuses = images
        .into_iter()
        .map(|(tag, id)| {
            let mut problems = Vec::new();
            match id.map(|id| &manifests[&id]) {
                None => problems.push("tag record unreadable".to_string()),
                Some(Err(e)) => problems.push(e.clone()),
                Some(Ok(m)) => image_problems(m, &located, &pack_results, &mut problems),
            }
            ImageStatus {
                tag,
                manifest: id.map(|i| i.to_hex()),
                ok: problems.is_empty(),
                problem_count: problems.len(),
                problems: problems.into_iter().take(PROBLEMS_SHOWN).collect(),
            }
        })
        .collect();
    Ok(VerifyReport {
        images: statuses,
        packs_checked: pack_results.len(),
        chunks_read,
        bytes_read,
        read_data,
        damaged_copies_recorded,
        damage_not_recorded,
    })
}

/// Every tag (its name, or why its record is unreadable) with its image.
type Images = Vec<(String, Option<ObjectId>)>;

/// Every tag with its image, and each image's manifest, read once.
fn read_images(store: &IndexedStore) -> Result<(Images, Manifests)> {
    let mut manifests = Manifests::new();
    let mut images = Vec::new();
    for t in &store.list_tags()? {
        match t {
            Ok(rec) => {
                let id = rec.manifest_id()?;
                manifests.entry(id).or_insert_with(|| store.get_manifest(&id).map_err(|e| e.to_string()));
                images.push((rec.tag().to_string(), Some(id)));
            }
            Err(e) => images.push((e.to_string(), None)),
        }
    }
    Ok((images, manifests))
}

/// Looks up every chunk of the readable manifests, and the bases of the delta chunks (a
/// chain is one step: a base is never a delta; a base's pack is checked like the image's own).
fn locate_chunks(store: &IndexedStore, manifests: &Manifests) -> Result<Located> {
    let mut located = Located::default();
    for m in manifests.values().filter_map(|m| m.as_ref().ok()) {
        for c in m.chunks.iter().filter(|c| !c.zero) {
            if located.chunks.contains_key(&c.id) {
                continue;
            }
            let loc = store.locate(&c.id)?;
            match loc {
                None => located.lost_bases.extend(lost_base(store, &c.id)?.map(|b| (c.id, b))),
                Some(loc) => {
                    located.wanted.entry(loc.pack).or_default().push(c.id);
                    for base in loc.bases.iter().flat_map(|b| b.iter()) {
                        let b = store.locate(&base)?;
                        if let Some(b) = b {
                            located.wanted.entry(b.pack).or_default().push(base);
                        }
                        located.bases.entry(c.id).or_default().push((base, b));
                    }
                }
            }
            located.chunks.insert(c.id, loc);
        }
    }
    Ok(located)
}

/// Checks every pack `located` wants, side by side (with `read_data`, every chunk's bytes
/// too); returns what each check found, and the chunks and bytes read.
fn check_packs(
    store: &IndexedStore,
    located: &Located,
    read_data: bool,
    progress: &dyn Progress,
) -> (PackResults, u64, u64) {
    let packs: Vec<(&ObjectId, &Vec<ObjectId>)> = located.wanted.iter().collect();
    progress.start(
        if read_data { "verifying packs and data" } else { "verifying packs" },
        packs.len() as u64,
        Unit::Items,
    );
    let checked: Vec<(ObjectId, std::result::Result<PackCheck, String>, u64, u64)> = packs
        .par_iter()
        .map(|(pack, ids)| {
            let (res, chunks, bytes) = match check_pack(store, pack, ids, read_data) {
                Ok((c, n, b)) => (Ok(c), n, b),
                Err(e) => (Err(e.to_string()), 0, 0),
            };
            progress.advance(1);
            (**pack, res, chunks, bytes)
        })
        .collect();
    progress.finish();
    let chunks_read = checked.iter().map(|c| c.2).sum();
    let bytes_read = checked.iter().map(|c| c.3).sum();
    (checked.into_iter().map(|(p, r, _, _)| (p, r)).collect(), chunks_read, bytes_read)
}

/// Records the damaged chunks `packs` found in the store's damage records and in this
/// machine's index; returns how many copies were found damaged.
fn record_damage(store: &IndexedStore, packs: &PackResults) -> Result<usize> {
    let mut n = 0;
    for (pack, check) in packs {
        let Ok(check) = check else { continue };
        if check.bad_chunks.is_empty() {
            continue;
        }
        let chunks: BTreeSet<ObjectId> = check.bad_chunks.keys().copied().collect();
        damage::record(store.backend(), pack, &chunks)?;
        n += chunks.len();
    }
    if n > 0 {
        store.index().set_damaged(&damage::read_all(store.backend())?.0)?;
    }
    Ok(n)
}

/// What is wrong with the delta base `base` (located at `loc`), if anything.
fn chain_problem(base: &ObjectId, loc: &Option<ChunkLocation>, packs: &PackResults) -> Option<String> {
    let b = base.short();
    let Some(loc) = loc else { return Some(format!("its delta base {b} is in no pack")) };
    if loc.bases.is_some() {
        return Some(format!("its delta base {b} is itself a delta"));
    }
    match &packs[&loc.pack] {
        Err(e) => Some(format!("its delta base {b}: {e}")),
        Ok(check) if !check.entries.contains_key(base) => {
            Some(format!("its delta base {b} is not in pack {} (run `gstore index rebuild`)", loc.pack.short()))
        }
        Ok(check) => check.bad_chunks.get(base).map(|why| format!("its delta base {b} is damaged: {why}")),
    }
}

/// For a chunk with no usable copy: a base of a delta the index holds of it that is stored
/// whole nowhere, if that is why.
fn lost_base(store: &IndexedStore, id: &ObjectId) -> Result<Option<ObjectId>> {
    for holder in store.index().holders(id)? {
        for base in holder.bases.iter().flat_map(|b| b.iter()) {
            if store.locate(&base)?.is_none_or(|l| l.bases.is_some()) {
                return Ok(Some(base));
            }
        }
    }
    Ok(None)
}

fn image_problems(m: &Manifest, located: &Located, packs: &PackResults, problems: &mut Vec<String>) {
    let Located { chunks: located, bases, lost_bases, .. } = located;
    let mut reported_packs = HashSet::new();
    for (entry, chunks) in m.files() {
        for c in chunks.iter().filter(|c| !c.zero) {
            if let Some(base) = lost_bases.get(&c.id) {
                problems.push(format!(
                    "{}: chunk {} is stored only as a delta, and its delta base {} is in no pack (a pack is missing or damaged)",
                    entry.path,
                    c.id.short(),
                    base.short()
                ));
                continue;
            }
            let Some(loc) = located[&c.id] else {
                problems.push(format!(
                    "{}: chunk {} is in no pack of the store (a pack is missing or damaged)",
                    entry.path,
                    c.id.short()
                ));
                continue;
            };
            match &packs[&loc.pack] {
                Err(e) => {
                    if reported_packs.insert(loc.pack) {
                        problems.push(format!("{}: {e}", entry.path));
                    }
                }
                Ok(check) => match check.entries.get(&c.id) {
                    None => problems.push(format!(
                        "{}: chunk {} is not in pack {} (index is stale: run `gstore index rebuild`)",
                        entry.path,
                        c.id.short(),
                        loc.pack.short()
                    )),
                    Some(e) if e.offset != loc.offset || e.stored_len != loc.stored_len || e.plain_len != c.len => {
                        problems.push(format!(
                            "{}: chunk {} disagrees with pack {}'s footer",
                            entry.path,
                            c.id.short(),
                            loc.pack.short()
                        ))
                    }
                    Some(_) => {
                        if let Some(why) = check.bad_chunks.get(&c.id) {
                            problems.push(format!(
                                "{}: chunk {} in pack {}: {why}",
                                entry.path,
                                c.id.short(),
                                loc.pack.short()
                            ));
                        } else if let Some(why) =
                            bases.get(&c.id).into_iter().flatten().find_map(|(b, l)| chain_problem(b, l, packs))
                        {
                            problems.push(format!("{}: chunk {}: {why}", entry.path, c.id.short()));
                        }
                    }
                },
            }
        }
    }
}

/// Reads a pack's footer and, with `read_data`, decodes and hashes the chunks in `ids`.
fn check_pack(
    store: &IndexedStore,
    pack: &ObjectId,
    ids: &[ObjectId],
    read_data: bool,
) -> Result<(PackCheck, u64, u64)> {
    let entries: HashMap<ObjectId, PackEntry> = store.read_pack_footer(pack)?.into_iter().map(|e| (e.id, e)).collect();
    let mut bad_chunks = HashMap::new();
    let (mut n, mut bytes) = (0, 0);
    if read_data {
        let data_end = entries.values().map(|e| e.offset + e.stored_len as u64).max().unwrap_or(0);
        let data = store.read_pack_range(pack, 0..data_end)?;
        bytes = data.len() as u64;
        let mut decoder = store.decoder();
        let mut plain = Vec::new();
        let unique: HashSet<&ObjectId> = ids.iter().collect();
        for id in unique {
            let Some(e) = entries.get(id) else { continue };
            let stored = &data[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
            plain.clear();
            if e.codec == codec::Codec::Delta && codec::split_delta(stored).map(|(b, _)| b) != e.bases {
                bad_chunks.insert(*id, "its stored delta bases differ from its footer's".into());
            } else if let Err(err) = decoder.decode_append(e.codec, stored, e.plain_len as usize, id, &mut plain) {
                let detail = match err {
                    FormatError::Corrupt { detail, .. } => detail,
                    other => other.to_string(),
                };
                bad_chunks.insert(*id, detail);
            }
            n += 1;
        }
    }
    Ok((PackCheck { entries, bad_chunks }, n, bytes))
}
