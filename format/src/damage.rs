//! Damage records: the chunks `gstore verify --read-data` found damaged in a pack, kept in the
//! store (`damage/<xx>/<pack>.json`, docs/FORMAT.md) so that every machine stops using those
//! copies. A damaged copy is never deduplicated against, read while another copy exists, or
//! kept by gc as a chunk's home while another copy exists: a later push or copy of the same
//! bytes stores a good copy, restores read it, and gc rewrites the damaged pack without the
//! damaged chunk (docs/GC.md). A record never makes gc drop a chunk's only copy.

use crate::error::{FormatError, Result};
use crate::id::ObjectId;
use crate::record;
use crate::ObjectKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A damaged stored copy: (chunk id, pack id).
pub type DamagedCopy = (ObjectId, ObjectId);

/// One damage record: the damaged chunks of one pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DamageRecord {
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
    /// An empty record of `pack`.
    pub fn new(pack: &ObjectId) -> DamageRecord {
        DamageRecord { format: 1, pack: pack.to_hex(), chunks: BTreeSet::new() }
    }

    /// The record with `chunks` added.
    pub fn with(mut self, chunks: &BTreeSet<ObjectId>) -> DamageRecord {
        self.chunks.extend(chunks.iter().map(ObjectId::to_hex));
        self
    }

    /// The stored form.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("damage record serializes")
    }

    /// Parses and checks a record read from the key of pack `pack`.
    pub fn from_json(bytes: &[u8], pack: &ObjectId) -> Result<DamageRecord> {
        let bad = |d: String| FormatError::corrupt(ObjectKind::DamageRecord, pack.to_hex(), d);
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

    /// The damaged copies it names (`pack` is the pack of its key).
    pub fn copies(&self, pack: ObjectId) -> impl Iterator<Item = DamagedCopy> + '_ {
        self.chunks.iter().filter_map(move |c| Some((ObjectId::from_hex(c).ok()?, pack)))
    }
}

/// Checks `bytes` as the damage record of `pack` (a server checks uploads with it).
pub fn check(bytes: &[u8], pack: &ObjectId) -> Result<()> {
    DamageRecord::from_json(bytes, pack).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_grow_and_refuse_another_packs_key_or_a_bad_id() {
        let (p, q) = (ObjectId::of(b"pack p"), ObjectId::of(b"pack q"));
        let (a, c) = (ObjectId::of(b"a"), ObjectId::of(b"c"));
        let rec = DamageRecord::new(&p).with(&[a].into()).with(&[c, a].into());
        let bytes = rec.to_json();
        assert_eq!(DamageRecord::from_json(&bytes, &p).unwrap(), rec);
        assert_eq!(rec.copies(p).collect::<Vec<_>>().len(), 2);
        assert!(check(&bytes, &p).is_ok());
        assert!(check(&bytes, &q).unwrap_err().to_string().contains("names pack"));
        let bad = br#"{"format":1,"pack":"00","chunks":["zz"]}"#;
        assert!(check(bad, &p).is_err());
        assert!(check(&vec![b' '; MAX_RECORD + 1], &p).unwrap_err().to_string().contains("more than"));
    }
}
