//! Damage records: the chunks `gstore verify --read-data` found damaged in a pack, kept in the
//! store (`damage/<xx>/<pack>.json`, docs/FORMAT.md) so that every machine stops using those
//! copies. A damaged copy is never deduplicated against, read while another copy exists, or
//! kept by gc as a chunk's home while another copy exists: a later push or copy of the same
//! bytes stores a good copy, restores read it, and gc rewrites the damaged pack without the
//! damaged chunk (docs/GC.md). A record never makes gc drop a chunk's only copy.

use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::{Family, ObjectKey};
use crate::format::record;
use crate::ObjectKind;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};

/// A damaged stored copy: (chunk id, pack id).
pub type DamagedCopy = (ObjectId, ObjectId);

/// One damage record.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DamageRecord {
    /// Record format: 1.
    format: u32,
    /// The pack, hex (as in the record's key).
    pack: String,
    /// The damaged chunks in it, hex, sorted.
    chunks: BTreeSet<String>,
}

/// The largest record read: 1 MiB (about 15,000 chunk ids, more than a pack holds).
const MAX_RECORD: usize = 1 << 20;

impl record::Versioned for DamageRecord {
    const FORMAT: u32 = 1;
    fn format(&self) -> u32 {
        self.format
    }
}

impl DamageRecord {
    /// Parses and checks a record read from the key of pack `pack`.
    fn from_json(bytes: &[u8], pack: &ObjectId) -> Result<DamageRecord> {
        let bad = |d: String| StoreError::corrupt(ObjectKind::DamageRecord, pack.to_hex(), d);
        if bytes.len() > MAX_RECORD {
            return Err(bad(format!("{} bytes, more than {MAX_RECORD}", bytes.len())));
        }
        let r: DamageRecord = record::decode(bytes, ObjectKind::DamageRecord, &pack.to_hex())?;
        if r.pack != pack.to_hex() {
            return Err(bad(format!("it names pack {}", r.pack)));
        }
        if let Some(c) = r.chunks.iter().find(|c| ObjectId::from_hex(c).is_err()) {
            return Err(bad(format!("{c:?} is not a chunk id")));
        }
        Ok(r)
    }

    fn copies(&self, pack: ObjectId) -> impl Iterator<Item = DamagedCopy> + '_ {
        self.chunks.iter().filter_map(move |c| Some((ObjectId::from_hex(c).ok()?, pack)))
    }
}

/// Checks `bytes` as the damage record of `pack` (a server checks uploads with it).
pub fn check(bytes: &[u8], pack: &ObjectId) -> Result<()> {
    DamageRecord::from_json(bytes, pack).map(|_| ())
}

/// Adds `chunks` to the damage record of `pack` (a compare-and-swap write: two verifies at
/// once both land).
pub fn record(backend: &Backend, pack: &ObjectId, chunks: &BTreeSet<ObjectId>) -> Result<()> {
    backend.update(&ObjectKey::Damage(*pack), |current| {
        // A record that does not parse is replaced by a good one.
        let found = current.and_then(|bytes| DamageRecord::from_json(bytes, pack).ok());
        let mut rec = found.clone().unwrap_or(DamageRecord { format: 1, pack: pack.to_hex(), chunks: BTreeSet::new() });
        rec.chunks.extend(chunks.iter().map(ObjectId::to_hex));
        if found.is_some_and(|f| f.chunks == rec.chunks) {
            return Ok(None);
        }
        Ok(Some(serde_json::to_vec(&rec).expect("damage record serializes")))
    })
}

/// Every damaged copy the store's records name, and the packs whose records were read (a
/// record that cannot be read or parsed names nothing).
pub fn read_all(backend: &Backend) -> Result<(HashSet<DamagedCopy>, HashSet<ObjectId>)> {
    let mut copies = HashSet::new();
    let mut packs = HashSet::new();
    for l in backend.list(Family::Damage.prefix())? {
        let ObjectKey::Damage(pack) = l.key else { continue };
        let Some(bytes) = backend.get_opt(&l.key)? else { continue };
        if let Ok(rec) = DamageRecord::from_json(&bytes, &pack) {
            copies.extend(rec.copies(pack));
            packs.insert(pack);
        }
    }
    Ok((copies, packs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_grow_and_read_back() {
        let b = Backend::memory();
        let (p, q) = (ObjectId::of(b"pack p"), ObjectId::of(b"pack q"));
        let (a, c) = (ObjectId::of(b"a"), ObjectId::of(b"c"));
        record(&b, &p, &[a].into()).unwrap();
        record(&b, &p, &[c].into()).unwrap();
        record(&b, &q, &[a].into()).unwrap();
        let (copies, packs) = read_all(&b).unwrap();
        assert_eq!(copies, [(a, p), (c, p), (a, q)].into());
        assert_eq!(packs, [p, q].into());
        // A record under another pack's key, or with a bad id, is refused.
        let bytes = b.get(&ObjectKey::Damage(p)).unwrap();
        assert!(check(&bytes, &p).is_ok());
        assert!(check(&bytes, &q).unwrap_err().to_string().contains("names pack"));
        let bad = br#"{"format":1,"pack":"00","chunks":["zz"]}"#;
        assert!(check(bad, &p).is_err());
    }
}
