//! The writes of a gc pass: settling each pack and manifest (keep, revive, tombstone,
//! delete) and rewriting the packs that hold little live data.

use super::catalog::Catalog;
use super::{GcReport, PackInfo};
use crate::codec::{decode_base, BaseSource};
use crate::commands::pack_fill::{Filled, PackFill};
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::ObjectKey;
use crate::format::pack::PackEntry;
use crate::progress::{Progress, Unit};
use crate::repo::store::Store;
use crate::ObjectKind;
use gstore_format::FormatError;
use std::collections::{HashMap, HashSet};

/// The writes of a pass (none with `dry_run`).
pub(super) struct Sweep<'a> {
    pub(super) store: &'a Store,
    pub(super) catalog: &'a Catalog<'a>,
    pub(super) dry_run: bool,
    /// Packs that have a damage record, which goes with the pack.
    pub(super) damage_records: &'a HashSet<ObjectId>,
    /// Leave tombstoned the unneeded packs that hold a copy of a live chunk ([`Pass::Again`]
    /// without [`GcOptions::reclaim_copies`]).
    pub(super) keep_live_copies: bool,
}

/// What a pass did with one pack or manifest.
pub(super) enum Settled {
    /// Needed, and had no tombstone: nothing to do.
    Kept,
    /// Needed again: its tombstone was removed.
    Revived,
    /// Tombstoned by an earlier pass and still unneeded: deleted.
    Deleted,
    /// Unneeded: tombstoned, for a later pass to delete.
    Tombstoned,
}

impl Sweep<'_> {
    /// Settles the object under `key` by whether it is needed and whether it had a tombstone
    /// when this pass began.
    pub(super) fn settle(&self, key: &ObjectKey, needed: bool, tombstoned: bool) -> Result<Settled> {
        Ok(match (needed, tombstoned) {
            (true, false) => Settled::Kept,
            (true, true) => {
                self.revive(key)?;
                Settled::Revived
            }
            (false, true) => {
                self.delete(key)?;
                Settled::Deleted
            }
            (false, false) => {
                self.tombstone(key)?;
                Settled::Tombstoned
            }
        })
    }

    /// Marks the object under `key` for deletion by a later pass.
    pub(super) fn tombstone(&self, key: &ObjectKey) -> Result<()> {
        if self.dry_run {
            return Ok(());
        }
        let body = serde_json::to_vec(&serde_json::json!({ "format": 1, "object": key.to_string() })).expect("json");
        match self.store.backend().put_new(&key.tombstone(), body) {
            Ok(()) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes the tombstone of an object that is needed again.
    pub(super) fn revive(&self, key: &ObjectKey) -> Result<()> {
        if self.dry_run {
            return Ok(());
        }
        self.store.backend().delete(&key.tombstone())
    }

    /// Deletes a tombstoned object, then its tombstone (and a pack's damage record, if any).
    pub(super) fn delete(&self, key: &ObjectKey) -> Result<()> {
        if self.dry_run {
            return Ok(());
        }
        let b = self.store.backend();
        b.delete(key)?;
        self.catalog.forget(key);
        b.delete(&key.tombstone())?;
        if let Some(pack) = key.pack().filter(|p| self.damage_records.contains(p)) {
            b.delete(&ObjectKey::Damage(pack))?;
        }
        Ok(())
    }

    /// Copies the chunks each of `packs` is home to into new packs, checking every one, and
    /// returns the packs that were copied out (to be tombstoned). A pack with a damaged chunk
    /// is left as it is.
    pub(super) fn repack<'p>(
        &self,
        packs: &[&'p PackInfo],
        all: &[PackInfo],
        homes: &HashMap<ObjectId, ObjectId>,
        progress: &dyn Progress,
        report: &mut GcReport,
    ) -> Result<Vec<&'p PackInfo>> {
        if packs.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = PackFill::new(self.store);
        let mut copied = Vec::new();
        let bases = FooterBases { store: self.store, homes, packs: all.iter().map(|p| (p.id, p)).collect() };
        let mut decoder = self.store.decoder_over(&bases);
        let mut scratch = Vec::new();
        progress.start("gc: rewriting mostly-dead packs", packs.len() as u64, Unit::Items);
        for p in packs {
            progress.advance(1);
            let keep: Vec<&PackEntry> = p.entries.iter().filter(|e| homes.get(&e.id) == Some(&p.id)).collect();
            let bytes = match self.store.read_pack_range(&p.id, 0..p.size) {
                Ok(b) => b,
                Err(e) if e.is_damage() || matches!(e, StoreError::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            let ok = keep.iter().all(|e| {
                scratch.clear();
                let stored = &bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
                decoder.decode_append(e.codec, stored, e.plain_len as usize, &e.id, &mut scratch).is_ok()
            });
            if !ok {
                report.damaged_packs.push(p.id.to_hex());
                continue;
            }
            if self.dry_run {
                // What the rewrite would write: the chunks' stored bytes (a pack adds a few
                // bytes of header and footer per chunk).
                report.bytes_repacked += keep.iter().map(|e| e.stored_len as u64).sum::<u64>();
                copied.push(*p);
                continue;
            }
            for e in keep {
                let stored = &bytes[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
                out.push_entry(e, stored);
            }
            copied.push(*p);
            if let Some(full) = out.full() {
                self.put_new_pack(full, report)?;
            }
        }
        if let Some(last) = out.last() {
            self.put_new_pack(last, report)?;
        }
        progress.finish();
        report.packs_repacked += copied.len();
        Ok(copied)
    }

    pub(super) fn put_new_pack(&self, p: Filled, report: &mut GcReport) -> Result<()> {
        let p = p.pack.finish();
        report.bytes_repacked += p.size();
        self.store.backend().put(&ObjectKey::Pack(p.id), p.pieces.into_iter().collect::<object_store::PutPayload>())
    }
}

/// Delta bases as gc finds them: in their home pack, per the footers it read (gc runs without
/// the index). Checked like any chunk; never cached (a repack reads few).
struct FooterBases<'a> {
    pub(super) store: &'a Store,
    pub(super) homes: &'a HashMap<ObjectId, ObjectId>,
    /// Every pack read, by id.
    pub(super) packs: HashMap<ObjectId, &'a PackInfo>,
}

impl BaseSource for FooterBases<'_> {
    fn base_plain(&self, id: &ObjectId) -> gstore_format::Result<std::sync::Arc<Vec<u8>>> {
        let missing = || FormatError::NotFound { what: ObjectKind::DeltaBase, key: id.to_hex() };
        let pack = self.homes.get(id).and_then(|home| self.packs.get(home)).ok_or_else(missing)?;
        let e = pack.entries.iter().find(|e| e.id == *id && e.bases.is_none()).ok_or_else(missing)?;
        let stored = self.store.read_pack_range(&pack.id, e.offset..e.offset + e.stored_len as u64)?;
        let plain = decode_base(
            e.codec,
            &stored,
            e.plain_len as usize,
            id,
            self.store.config().chunk_max,
            self.store.chunk_ids(),
        )?;
        Ok(std::sync::Arc::new(plain))
    }
}
