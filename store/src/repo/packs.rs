//! Packs in the store: their footers read from the pack's end, past caching tiers that could
//! have rewritten them. The layout is `gstore_format::pack`.

use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::ObjectKey;
use crate::format::pack::{header_footer_id, parse_footer, parse_trailer, PackEntry, HEADER_LEN, TRAILER_LEN};
use crate::ObjectKind;

/// Bytes [`read_tail`] reads from a pack's end in its first request: the trailer and, for most
/// packs, the whole footer.
const TAIL_GUESS: u64 = 64 << 10;

/// Reads and checks the footer of the pack `pack`, `size` bytes long (as listed), in a store
/// whose chunks are at most `chunk_max` bytes: its entries, and the raw tail they were parsed
/// from (footer entries, then trailer). Two range reads (three through tiers: the header
/// too); the chunk data is not read.
///
/// Where pack reads go through caching tiers ([`Backend::past_tiers`]), the tail is used only
/// when the pack's name covers it ([`read_named_tail`]): the footer's own hash does not, as a
/// tier that rewrote an entry recomputes it, and a node trusting such an entry would
/// deduplicate pushes against a chunk the store does not hold, or read other bytes for one.
pub fn read_tail(backend: &Backend, pack: &ObjectId, size: u64, chunk_max: u32) -> Result<(Vec<PackEntry>, Vec<u8>)> {
    let key = ObjectKey::Pack(*pack);
    if let Some(store) = backend.past_tiers() {
        return read_named_tail(backend, &store, pack, size, chunk_max);
    }
    match read_tail_once(backend, &key, size, chunk_max) {
        // Bytes that came through a caching tier (and failed to open with an encrypted
        // store's key) are read once more, past it.
        Err(e) if e.is_damage() && backend.distrust(&key) => read_tail_once(backend, &key, size, chunk_max),
        other => other,
    }
}

/// [`read_tail`] through caching tiers (`backend`), with `store` the store past them. The
/// pack's header is read too, and the tail is used when the header followed by it hashes to
/// the pack's name (docs/FORMAT.md, "Pack names"). Any other tail — changed by a tier, or of a
/// pack named by all its bytes, which no tail shows — is read again from `store`; a tier whose
/// tail was not the store's is distrusted ([`Backend::distrust`]) as one that served damaged
/// bytes.
fn read_named_tail(
    backend: &Backend,
    store: &Backend,
    pack: &ObjectId,
    size: u64,
    chunk_max: u32,
) -> Result<(Vec<PackEntry>, Vec<u8>)> {
    let key = ObjectKey::Pack(*pack);
    // The header first, so that the tier the tail came from is the one distrusted.
    let header = backend.get_range(&key, 0..HEADER_LEN as u64);
    let served = read_tail_once(backend, &key, size, chunk_max);
    match (&header, &served) {
        (Ok(header), Ok((_, tail))) if header_footer_id(header, tail) == *pack => return served,
        // The store's own answer (a tier that fails is gone around): nothing to read again.
        (_, Err(e)) if !e.is_damage() => return served,
        _ => {}
    }
    let stored = read_tail_once(store, &key, size, chunk_max)?;
    if !served.is_ok_and(|(_, tail)| tail == stored.1) {
        backend.distrust(&key);
    }
    Ok(stored)
}

fn read_tail_once(
    backend: &Backend,
    object: &ObjectKey,
    size: u64,
    chunk_max: u32,
) -> Result<(Vec<PackEntry>, Vec<u8>)> {
    let key = &object.to_string();
    if size < TRAILER_LEN as u64 + 8 {
        return Err(StoreError::corrupt(ObjectKind::Pack, key, format!("only {size} bytes long: truncated")));
    }
    // One read fetches the trailer with the footer of a pack of up to TAIL_GUESS / ENTRY_LEN
    // chunks; a longer footer takes a second read for the rest.
    let start = size.saturating_sub(TAIL_GUESS);
    let guess = backend.get_range(object, start..size)?;
    let footer_end = guess.len() - TRAILER_LEN;
    let t = parse_trailer(&guess[footer_end..], size, key)?;
    let footer = if t.footer_offset >= start {
        guess.slice((t.footer_offset - start) as usize..footer_end)
    } else {
        let head = backend.get_range(object, t.footer_offset..start)?;
        [&head[..], &guess[..footer_end]].concat().into()
    };
    let entries = parse_footer(&footer, &t, key, chunk_max)?;
    Ok((entries, [&footer[..], &guess[footer_end..]].concat()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Codec;
    use crate::format::pack::{PackBuilder, PackIds, ENTRY_LEN};

    /// A chunk max above every test chunk.
    const MAX: u32 = 1 << 20;

    #[test]
    fn footers_read_back_from_the_end_whatever_their_length() {
        let backend = Backend::memory();
        for chunks in [2usize, 3000] {
            let mut b = PackBuilder::new(PackIds::HeaderFooter);
            for i in 0..chunks {
                let data = i.to_le_bytes();
                b.push(ObjectId::of(&data), Codec::Raw, &data, data.len() as u32);
            }
            let p = b.finish();
            assert_eq!(p.entries.len() * ENTRY_LEN > TAIL_GUESS as usize, chunks == 3000);
            let size = p.size();
            backend
                .put(&ObjectKey::Pack(p.id), p.pieces.iter().cloned().collect::<object_store::PutPayload>())
                .unwrap();
            let (entries, tail) = read_tail(&backend, &p.id, size, MAX).unwrap();
            assert_eq!(entries, p.entries);
            assert_eq!(&tail[..], &p.pieces.concat()[p.size() as usize - tail.len()..]);
            assert_eq!(tail.len(), chunks * ENTRY_LEN + TRAILER_LEN);
        }
    }
}
