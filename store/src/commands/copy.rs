//! Copying an image from one store to another (`gstore copy`): only the chunks the target
//! lacks travel, in their stored (compressed) form, each checked against its id on the way;
//! then the manifest, then the tag. The target's protocol is a push's (docs/GC.md): a lease
//! names every pack written and every pack relied on before the manifest goes in, and chunks
//! the target held only in packs gc has tombstoned meanwhile are copied again.

use crate::codec::floats::{self, LaneCodec};
use crate::codec::{Codec, DeltaBases, Encoder};
use crate::commands::pack_fill::PackFill;
use crate::commands::push::{store_manifest, write_pack};
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::tag::TagRef;
use crate::progress::{Progress, Unit};
use crate::repo::index::Index;
use crate::repo::indexed::IndexedStore;
use crate::repo::leases::{self as lease, Lease};
use crate::ObjectKind;
use crate::StoreConfig;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What a copy did.
#[derive(Debug, Clone, Serialize)]
pub struct CopyReport {
    /// The tag written in the target.
    pub tag: String,
    /// The image's manifest id in the target (the source's, unless the target's gc was
    /// deleting an identical manifest: then its creation time moves on a second).
    pub manifest: ObjectId,
    /// Distinct chunks in the image (zero chunks left out).
    pub chunks: u64,
    /// Chunks the target lacked, copied.
    pub copied_chunks: u64,
    /// Stored bytes of those (what travelled).
    pub copied_stored_bytes: u64,
    /// Packs written in the target.
    pub packs: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Copies the image `tag` names in `src` to `dst` under the same tag (moved if it exists
/// there; its old value goes to the history).
pub fn copy(src: &IndexedStore, dst: &IndexedStore, tag: &TagRef, progress: &dyn Progress) -> Result<CopyReport> {
    let started = std::time::Instant::now();
    tag.check_new()?;
    if src.chunk_ids() != dst.chunk_ids() {
        // Chunks are copied as stored, under their ids; ids made with one store's key are not
        // the other's.
        return Err(StoreError::Refused(format!(
            "{} and {} name chunks differently (an encrypted store names them with its own key): copy between them by restoring the image and pushing it",
            src.describe(),
            dst.describe()
        )));
    }
    let id = src.resolve(&tag.to_string())?;
    let mut manifest = src.get_manifest(&id)?;
    let sizes: BTreeMap<ObjectId, u32> = manifest.chunks.iter().filter(|c| !c.zero).map(|c| (c.id, c.len)).collect();
    if let Some((c, len)) = sizes.iter().find(|(_, &len)| len > dst.config().chunk_max) {
        return Err(StoreError::Refused(format!(
            "chunk {} is {len} bytes, more than the target store's chunk_max ({}): it cannot hold this image",
            c.short(),
            dst.config().chunk_max
        )));
    }
    dst.backend().check_tag_write(&tag.name)?;
    let lease = Lease::take(dst.backend(), &format!("copy {tag}"))?;
    let index = dst.index();
    let mut relied: HashMap<ObjectId, Vec<ObjectId>> = HashMap::new();
    let mut missing = Vec::new();
    for &c in sizes.keys() {
        match relied_packs(index, &c)? {
            Some(packs) => packs.into_iter().for_each(|p| relied.entry(p).or_default().push(c)),
            None => missing.push(c),
        }
    }
    let mut report = CopyReport {
        tag: tag.to_string(),
        // Set when the manifest is copied, the last step.
        manifest: ObjectId([0; 32]),
        chunks: sizes.len() as u64,
        copied_chunks: 0,
        copied_stored_bytes: 0,
        packs: 0,
        seconds: 0.0,
    };
    transfer(src, dst, &lease, &missing, &sizes, &mut report, progress)?;
    // What the copy relies on in the target, protected, then checked (a push's step 4).
    let packs: Vec<ObjectId> = relied.keys().copied().collect();
    lease.protect(&packs, &[])?;
    let (bad, doomed) = lease::unreliable_packs(dst.backend(), &packs.iter().copied().collect())?;
    index.set_doomed(&doomed)?;
    let again: Vec<ObjectId> = bad.iter().flat_map(|p| relied.remove(p).unwrap_or_default()).collect();
    transfer(src, dst, &lease, &again, &sizes, &mut report, progress)?;
    let new_id = store_manifest(dst, &lease, &mut manifest)?;
    dst.set_tag(tag, new_id)?;
    drop(lease);
    report.manifest = new_id;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The packs of the target a copy relies on for chunk `c`, if it holds a copy it may
/// deduplicate against: the pack of that copy and, for a delta, the packs of its bases.
fn relied_packs(index: &Index, c: &ObjectId) -> Result<Option<Vec<ObjectId>>> {
    let Some(loc) = index.locate_for_dedup(c)? else { return Ok(None) };
    let mut packs = vec![loc.pack];
    for base in loc.bases.iter().flat_map(DeltaBases::iter) {
        match index.locate_for_dedup(&base)? {
            Some(b) => packs.push(b.pack),
            None => return Ok(None),
        }
    }
    Ok(Some(packs))
}

/// True when `dst` may hold chunk `c`'s `stored` bytes (of `codec`, `len` plain bytes) as
/// they are; otherwise they are encoded again for its settings. A delta is never kept (its
/// bases may be missing from `dst`), nor float-coded bytes where `dst` does not write them:
/// a store made with `--no-float-codec` promised older readers no codec 3, one with Huffman
/// lanes off no lane codec 2.
fn keeps_stored(dst: &StoreConfig, codec: Codec, stored: &[u8], len: u32, c: &ObjectId) -> Result<bool> {
    Ok(match codec {
        Codec::Delta => false,
        Codec::Floats if !dst.float_codec => false,
        Codec::Floats if !dst.huffman_lanes => {
            !floats::layout(stored, len as usize, c)?.lanes.iter().any(|l| l.codec == LaneCodec::Huffman)
        }
        _ => true,
    })
}

/// Reads `chunks` from their packs in `src` (stored form, checked by decoding against their
/// ids) and writes them into new packs of `dst`, each named in the lease before it is stored.
fn transfer(
    src: &IndexedStore,
    dst: &IndexedStore,
    lease: &Lease,
    chunks: &[ObjectId],
    sizes: &BTreeMap<ObjectId, u32>,
    report: &mut CopyReport,
    progress: &dyn Progress,
) -> Result<()> {
    if chunks.is_empty() {
        return Ok(());
    }
    let found = src.locate_many(chunks)?;
    progress.start("copying", chunks.iter().map(|c| sizes[c] as u64).sum(), Unit::Bytes);
    let mut decoder = src.decoder();
    // For the chunks whose stored form `dst` does not keep (keeps_stored).
    let mut encoder = Encoder::for_config(dst.config())?;
    let mut plain = Vec::new();
    let mut pack = PackFill::new(dst);
    let mut seen = HashSet::new();
    for (c, loc) in chunks.iter().zip(found) {
        if !seen.insert(*c) {
            continue;
        }
        let len = sizes[c];
        let loc = loc.ok_or_else(|| StoreError::NotFound {
            what: ObjectKind::Chunk,
            key: format!("{c} (in no pack of the source store; gstore verify names the images it breaks)"),
        })?;
        let stored = src.read_checked_range(&loc.pack, loc.range(), |stored| {
            plain.clear();
            decoder.decode_append(loc.codec, stored, len as usize, c, &mut plain)?;
            Ok(stored.clone())
        })?;
        let stored_len = if !keeps_stored(dst.config(), loc.codec, &stored, len, c)? {
            let (codec, whole) = encoder.encode(&plain);
            let n = whole.len();
            pack.push_owned(*c, codec, whole, len);
            n
        } else {
            pack.push(*c, loc.codec, &stored, len);
            stored.len()
        };
        report.copied_chunks += 1;
        report.copied_stored_bytes += stored_len as u64;
        progress.advance(len as u64);
        if let Some(full) = pack.full() {
            write_pack(dst, lease, full.pack.finish(), &full.sketches)?;
            report.packs += 1;
        }
    }
    if let Some(last) = pack.last() {
        write_pack(dst, lease, last.pack.finish(), &last.sketches)?;
        report.packs += 1;
    }
    progress.finish();
    Ok(())
}
