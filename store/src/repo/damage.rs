//! Damage records in the store (`damage/<xx>/<pack>.json`): added to by `verify`, read by
//! every command that must stop using damaged copies. The layout is `gstore_format::damage`.

use crate::backend::Backend;
use crate::error::Result;
use crate::format::damage::{DamageRecord, DamagedCopy};
use crate::format::id::ObjectId;
use crate::format::key::{Family, ObjectKey};
use std::collections::{BTreeSet, HashSet};

/// Adds `chunks` to the damage record of `pack` (a compare-and-swap write: two verifies at
/// once both land).
pub fn record(backend: &Backend, pack: &ObjectId, chunks: &BTreeSet<ObjectId>) -> Result<()> {
    backend.update(&ObjectKey::Damage(*pack), |current| {
        // A record that does not parse is replaced by a good one.
        let found = current.and_then(|bytes| DamageRecord::from_json(bytes, pack).ok());
        let rec = found.clone().unwrap_or_else(|| DamageRecord::new(pack)).with(chunks);
        if found.is_some_and(|f| f == rec) {
            return Ok(None);
        }
        Ok(Some(rec.to_json()))
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
    }
}
