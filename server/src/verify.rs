//! Checks an upload before anything is stored: every chunk of a pack decoded and hashed and
//! the footer recomputed, a manifest's id and structure, a tag record's shape, a restore profile's.
//! An encrypted store's server holds no key: it checks that a sealed object is framed as one
//! (header and length) and a key record's shape, and relies on its write tokens for the rest;
//! every reader checks what it opens (docs/SECURITY.md).

use gstore_format::codec::{check_zstd_frame, split_delta, Codec, Decoder, KnownBases};
use gstore_format::damage;
use gstore_format::key::ObjectKey as Key;
use gstore_format::lease::{LeaseRecord, Owner};
use gstore_format::manifest::Manifest;
use gstore_format::profile::Profile;
use gstore_format::tag::TagRecord;
use gstore_format::ObjectKind;
use gstore_format::{pack, ObjectId, StoreConfig};
// The store's own records (retention policies, key records, sealed objects) are laid out by
// the store, not the format crate.
use gstore_store::commands::gc::policies::Policies;
use gstore_store::crypto::keyring::{KeyRecord, RetiredKeys};
use gstore_store::crypto::sealed::Header;
use std::collections::HashSet;

/// Checks a delta chunk's stored bytes without its bases: they name the bases the footer
/// names, then hold one whole zstd frame declaring the chunk's plain length.
fn check_delta(stored: &[u8], e: &pack::PackEntry) -> gstore_store::Result<()> {
    let bad = |why: &str| gstore_store::StoreError::corrupt(ObjectKind::Chunk, e.id.to_hex(), why);
    let (bases, frame) = split_delta(stored).ok_or_else(|| bad("a delta that names no bases"))?;
    if Some(bases) != e.bases {
        return Err(bad("its stored base ids differ from its footer's"));
    }
    Ok(check_zstd_frame(frame, e.plain_len as usize, &e.id)?)
}

/// The delta bases an upload of `body` under `key` names but does not hold whole itself:
/// the server reads them from the store and hands them to [`upload`], which decodes every
/// delta against them. None but for an unencrypted store's pack that parses.
pub fn bases_wanted(key: &Key, body: &[u8], chunk_max: u32, sealed: bool) -> Vec<ObjectId> {
    let Key::Pack(id) = key else { return Vec::new() };
    let Ok(entries) = pack::parse_pack(body, &id.to_hex(), chunk_max) else { return Vec::new() };
    if sealed {
        return Vec::new();
    }
    let whole: HashSet<ObjectId> = entries.iter().filter(|e| e.codec != Codec::Delta).map(|e| e.id).collect();
    let mut wanted: Vec<ObjectId> =
        entries.iter().flat_map(|e| e.bases).flat_map(|b| b.iter()).filter(|b| !whole.contains(b)).collect();
    wanted.sort_unstable();
    wanted.dedup();
    wanted
}

/// Verifies `body` as the object `key` names, for a store whose chunks are at most
/// `chunk_max` bytes and that is encrypted when `sealed`; `stored` holds the plain bytes of
/// the delta bases [`bases_wanted`] named. The error says what is wrong.
pub fn upload(key: &Key, body: &[u8], chunk_max: u32, sealed: bool, mut stored: KnownBases) -> Result<(), String> {
    if sealed && key.is_sealed() {
        let header = Header::parse(body, &key.to_string()).map_err(|e| e.to_string())?;
        if body.len() as u64 != header.sealed_len() {
            return Err(format!("a sealed object of {} bytes whose header says {}", body.len(), header.sealed_len()));
        }
        return Ok(());
    }
    match key {
        Key::Pack(id) => {
            let entries = pack::parse_pack(body, &id.to_hex(), chunk_max).map_err(|e| e.to_string())?;
            if !pack::is_named(body, id) {
                return Err(format!(
                    "pack {} is not named by its content: neither its header and tail nor all its bytes hash to its name",
                    id.to_hex()
                ));
            }
            // Whole chunks first (a delta's base may be one of them), then every delta decoded
            // against its bases and hashed like any chunk.
            let bases: HashSet<ObjectId> = entries.iter().flat_map(|e| e.bases).flat_map(|b| b.iter()).collect();
            let mut decoder = Decoder::new(chunk_max);
            let mut plain = Vec::new();
            for e in entries.iter().filter(|e| e.codec != Codec::Delta) {
                plain.clear();
                let bytes = &body[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
                decoder
                    .decode_append(e.codec, bytes, e.plain_len as usize, &e.id, &mut plain)
                    .map_err(|err| err.to_string())?;
                if bases.contains(&e.id) {
                    stored.insert(e.id, std::sync::Arc::new(plain.clone()));
                }
            }
            let mut decoder = Decoder::with_bases(chunk_max, &stored);
            for e in entries.iter().filter(|e| e.codec == Codec::Delta) {
                plain.clear();
                let bytes = &body[e.offset as usize..(e.offset + e.stored_len as u64) as usize];
                check_delta(bytes, e).map_err(|err| err.to_string())?;
                decoder
                    .decode_append(e.codec, bytes, e.plain_len as usize, &e.id, &mut plain)
                    .map_err(|err| err.to_string())?;
            }
            Ok(())
        }
        Key::Manifest(id) => Manifest::decode(body, id).map(|_| ()).map_err(|e| e.to_string()),
        Key::Profile(id) => Profile::from_json(body, id).map(|_| ()).map_err(|e| e.to_string()),
        Key::Tag(tag) => TagRecord::from_json(body, tag).map(|_| ()).map_err(|e| e.to_string()),
        Key::Config => StoreConfig::from_json(body).map(|_| ()).map_err(|e| e.to_string()),
        Key::Lease(name) => LeaseRecord::from_json(body, name).map(|_| ()).map_err(|e| e.to_string()),
        Key::GcLock => serde_json::from_slice::<Owner>(body).map(|_| ()).map_err(|e| format!("gc lock: {e}")),
        Key::Tombstone(_) if body.len() <= 4096 => {
            serde_json::from_slice::<serde_json::Value>(body).map(|_| ()).map_err(|e| format!("tombstone: {e}"))
        }
        Key::Tombstone(_) => Err("tombstone larger than 4 KiB".into()),
        Key::Probe(_) | Key::Upload(_) => Err("probe objects and registry uploads are not served".into()),
        Key::KeyRecord(id) if sealed => KeyRecord::from_json(body, id).map(|_| ()).map_err(|e| e.to_string()),
        Key::KeyRecord(_) => Err("key records belong to encrypted stores; this one is not".into()),
        Key::Damage(pack) => damage::check(body, pack).map_err(|e| e.to_string()),
        Key::RetiredKeys if sealed => RetiredKeys::from_json(body).map(|_| ()).map_err(|e| e.to_string()),
        Key::RetiredKeys => Err("retired keys belong to encrypted stores; this one is not".into()),
        Key::Policies => Policies::from_json(body).map(|_| ()).map_err(|e| e.to_string()),
    }
}
