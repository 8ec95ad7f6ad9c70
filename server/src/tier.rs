//! The caching tier (`gstore serve --cache DIR`): a server in front of a store many restore
//! nodes read at once. A pack range a client asks for is read from the store once, checked
//! chunk by chunk, kept on this machine's disk within a budget and served to every client that
//! asks for it again; clients asking for the same range at the same time wait for that one
//! read. Packs never change once written (they are named by their contents), so a kept range
//! is never stale; tags, manifests and every other object are read through each time.
//!
//! Only ranges the tier can check are kept: ranges of whole chunks (what restores ask for),
//! and reads of a pack's tail (what index syncs ask for), read from the start of the chunk
//! holding their first byte. Each chunk is decoded (a delta against its bases, read from the
//! store) and hashed against the id the pack's footer gives it, and a tail must be the one the
//! tier read and checked itself, so a damaged object in the store never enters the cache. Any
//! other range (part of a chunk) is passed through. Tiers compose: a tier whose own
//! `GSTORE_TIERS` names a tier nearer the store (a rack's, a region's) reads its misses through
//! that one, and from the store when it is down.

use crate::lookup::{known_bases, stored_bases, StoredBase};
use crate::AppState;
use bytes::Bytes;
use gstore_store::codec::{Codec, Decoder, KnownBases};
use gstore_store::format::key::ObjectKey;
use gstore_store::format::pack::PackEntry;
use gstore_store::repo::cache::RangeCache;
use gstore_store::ObjectKind;
use gstore_store::{ObjectId, StoreError};
use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

/// Pack footers kept in memory: past this many packs the map starts again.
const FOOTERS_KEPT: usize = 4096;
/// Bytes of ranges the tier holds in memory at once (read, or being sent), in MiB: a client
/// asking past it waits. Sixty-four clients with sixteen 16 MiB reads in flight each would
/// otherwise hold 16 GiB.
const MEMORY_MIB: u32 = 1024;

/// What a read through the tier gives.
pub enum Served {
    /// The range, checked (from the cache, or read once from the store and kept), the pack's
    /// length, and the share of the tier's memory it holds until it is sent (drop it then).
    Checked(Bytes, u64, OwnedSemaphorePermit),
    /// The range cannot be checked here (not whole chunks, or the read failed): the caller
    /// reads it from the store itself and the client checks it.
    PassThrough,
}

/// A range being read from the store: everyone asking for it meanwhile waits on the one read.
type InFlight = Arc<OnceCell<Option<Bytes>>>;

/// The cache of checked pack ranges and the reads in flight.
pub struct Tier {
    cache: RangeCache,
    in_flight: Mutex<HashMap<(ObjectId, u64, u64), InFlight>>,
    footers: Mutex<HashMap<ObjectId, Arc<Footer>>>,
    /// [`MEMORY_MIB`] permits of a MiB each.
    memory: Arc<Semaphore>,
}

/// A pack's length, footer entries and tail (footer and trailer, as stored), read from the
/// store and checked (through this server's own tiers, against the pack's name:
/// [`gstore_store::repo::packs::read_tail`]).
struct Footer {
    len: u64,
    entries: Vec<PackEntry>,
    tail: Vec<u8>,
}

impl Footer {
    /// Where the tail starts.
    fn tail_at(&self) -> u64 {
        self.len - self.tail.len() as u64
    }
}

/// How a range is checked before it is kept: the whole chunks read for it, from `from` (the
/// start of the chunk holding its first byte), and whether it ends with the pack's tail.
struct Check {
    from: u64,
    chunks: Vec<PackEntry>,
    tail: bool,
}

impl Check {
    /// How `range` of the pack `footer` describes is checked: whole chunks, or (an index
    /// sync's read of a pack's tail, which starts inside a chunk) the chunks from the one
    /// holding its first byte, then the tail; `None` for any other range.
    fn of(footer: &Footer, range: &Range<u64>) -> Option<Check> {
        if let Some(chunks) = whole_chunks(&footer.entries, range) {
            return Some(Check { from: range.start, chunks, tail: false });
        }
        let tail_at = footer.tail_at();
        if range.end != footer.len || range.start >= tail_at {
            return None;
        }
        let first =
            footer.entries.iter().find(|e| e.offset <= range.start && range.start < e.offset + e.stored_len as u64)?;
        let chunks = whole_chunks(&footer.entries, &(first.offset..tail_at))?;
        Some(Check { from: first.offset, chunks, tail: true })
    }
}

impl Tier {
    /// A tier keeping at most `limit` bytes of pack ranges in `dir` (created); `None` when
    /// `limit` is 0.
    pub fn new(dir: PathBuf, limit: u64) -> Result<Option<Tier>, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("cache directory {}: {e}", dir.display()))?;
        Ok(RangeCache::new(dir, limit).map(|cache| Tier {
            cache,
            in_flight: Mutex::default(),
            footers: Mutex::default(),
            memory: Arc::new(Semaphore::new(MEMORY_MIB as usize)),
        }))
    }

    /// Range `range` of pack `pack`: from the cache, or read from the store once for every
    /// client asking for it now, checked and kept.
    pub async fn get(self: &Arc<Self>, state: &AppState, pack: ObjectId, range: Range<u64>) -> Served {
        let Some(footer) = self.footer(state, pack).await else { return Served::PassThrough };
        let mib = ((range.end - range.start).div_ceil(1 << 20) as u32).clamp(1, MEMORY_MIB);
        let held = Arc::clone(&self.memory).acquire_many_owned(mib).await.expect("the tier's memory is never closed");
        let tail_at = footer.tail_at();
        if range.start >= tail_at && range.end <= footer.len && range.start < range.end {
            // Inside the tail the tier read and checked itself.
            state.metrics.tier_reads.with_label_values(&["hit"]).inc();
            let tail = &footer.tail[(range.start - tail_at) as usize..(range.end - tail_at) as usize];
            return Served::Checked(Bytes::copy_from_slice(tail), footer.len, held);
        }
        let Some(check) = Check::of(&footer, &range) else {
            state.metrics.tier_reads.with_label_values(&["passed"]).inc();
            return Served::PassThrough;
        };
        if let Some(bytes) = self.kept(pack, &range).await {
            state.metrics.tier_reads.with_label_values(&["hit"]).inc();
            return Served::Checked(bytes, footer.len, held);
        }
        let key = (pack, range.start, range.end);
        let cell = Arc::clone(self.in_flight.lock().expect("in-flight lock").entry(key).or_default());
        let (led, kept_meanwhile) = (AtomicBool::new(false), AtomicBool::new(false));
        let got = cell
            .get_or_init(|| async {
                led.store(true, Ordering::Relaxed);
                // Another client's read of this range may have been kept since the look
                // above (it leaves the in-flight map once kept): never read it twice.
                if let Some(bytes) = self.kept(pack, &range).await {
                    kept_meanwhile.store(true, Ordering::Relaxed);
                    return Some(bytes);
                }
                self.read_and_keep(state, pack, range, check, &footer).await
            })
            .await
            .clone();
        let led = led.load(Ordering::Relaxed);
        if led {
            self.in_flight.lock().expect("in-flight lock").remove(&key);
        }
        let outcome = match (&got, led, kept_meanwhile.load(Ordering::Relaxed)) {
            (None, _, _) => "passed",
            (Some(_), true, true) => "hit",
            (Some(_), true, false) => "miss",
            (Some(_), false, _) => "joined",
        };
        state.metrics.tier_reads.with_label_values(&[outcome]).inc();
        got.map_or(Served::PassThrough, |bytes| Served::Checked(bytes, footer.len, held))
    }

    /// The kept copy of `range` of `pack`, if there is one and it is intact.
    async fn kept(self: &Arc<Self>, pack: ObjectId, range: &Range<u64>) -> Option<Bytes> {
        let (tier, range) = (Arc::clone(self), range.clone());
        tokio::task::spawn_blocking(move || tier.cache.get(&pack, &range)).await.ok().flatten()
    }

    /// Reads `range` of `pack` from the store (from `check.from` on), checks it as `check` says
    /// (each chunk decoded and hashed; a tail against the one `footer` holds) and keeps it;
    /// `None` when it cannot be read or checked (the caller then reads it itself, and answers
    /// the store's error where there is one).
    async fn read_and_keep(
        self: &Arc<Self>,
        state: &AppState,
        pack: ObjectId,
        range: Range<u64>,
        check: Check,
        footer: &Footer,
    ) -> Option<Bytes> {
        // Through the backend: a tier given tiers of its own (`GSTORE_TIERS`) reads through
        // them, nearest first, and from the store when none answers.
        let (backend, read) = (state.backend.clone(), check.from..range.end);
        let bytes =
            tokio::task::spawn_blocking(move || backend.get_range(&ObjectKey::Pack(pack), read)).await.ok()?.ok()?;
        if check.tail && bytes.get((footer.tail_at() - check.from) as usize..) != Some(&footer.tail[..]) {
            return None;
        }
        let base_ids: Vec<ObjectId> = check.chunks.iter().flat_map(|e| e.bases.iter().flat_map(|b| b.iter())).collect();
        let bases = match stored_bases(state, base_ids).await {
            Ok(b) => b,
            Err(StoredBase::Missing(_) | StoredBase::Failed(_)) => return None,
        };
        let asked = bytes.slice((range.start - check.from) as usize..);
        let (tier, chunk_max, kept) = (Arc::clone(self), state.chunk_max, asked.clone());
        let checked = tokio::task::spawn_blocking(move || {
            let known = known_bases(bases, chunk_max)?;
            check_chunks(&bytes, check.from, &check.chunks, &known, chunk_max)?;
            tier.cache.put(&pack, &range, &kept);
            Ok::<(), StoreError>(())
        })
        .await;
        matches!(checked, Ok(Ok(()))).then_some(asked)
    }

    /// The length and footer entries of `pack`, read from the store (and checked) once.
    async fn footer(&self, state: &AppState, pack: ObjectId) -> Option<Arc<Footer>> {
        if let Some(f) = self.footers.lock().expect("footer lock").get(&pack) {
            return Some(Arc::clone(f));
        }
        let (backend, chunk_max) = (state.backend.clone(), state.chunk_max);
        let read = tokio::task::spawn_blocking(move || {
            let size = backend
                .size(&ObjectKey::Pack(pack))?
                .ok_or(StoreError::NotFound { what: ObjectKind::Pack, key: pack.to_hex() })?;
            gstore_store::repo::packs::read_tail(&backend, &pack, size, chunk_max).map(|(entries, tail)| Footer {
                len: size,
                entries,
                tail,
            })
        })
        .await
        .ok()?
        .ok()?;
        let read = Arc::new(read);
        let mut footers = self.footers.lock().expect("footer lock");
        if footers.len() >= FOOTERS_KEPT {
            footers.clear();
        }
        footers.insert(pack, Arc::clone(&read));
        Some(read)
    }
}

/// The footer entries that tile `range` exactly, in offset order; `None` unless the range
/// starts at a chunk and ends at the end of one, with every byte between in some chunk.
fn whole_chunks(entries: &[PackEntry], range: &Range<u64>) -> Option<Vec<PackEntry>> {
    let mut inside: Vec<PackEntry> =
        entries.iter().filter(|e| e.offset >= range.start && e.offset < range.end).cloned().collect();
    inside.sort_by_key(|e| e.offset);
    let mut at = range.start;
    for e in &inside {
        if e.offset != at {
            return None;
        }
        at += e.stored_len as u64;
    }
    (at == range.end && !inside.is_empty()).then_some(inside)
}

/// Decodes every chunk of `chunks` (at their offsets in a range read from `start`) and checks
/// it against its id.
fn check_chunks(
    bytes: &[u8],
    start: u64,
    chunks: &[PackEntry],
    bases: &KnownBases,
    chunk_max: u32,
) -> gstore_store::Result<()> {
    let mut decoder = Decoder::with_bases(chunk_max, bases);
    let mut plain = Vec::new();
    for e in chunks {
        let at = (e.offset - start) as usize;
        let stored = &bytes[at..at + e.stored_len as usize];
        if e.codec == Codec::Delta && e.bases.is_none() {
            return Err(StoreError::corrupt(ObjectKind::Chunk, e.id.to_hex(), "a delta whose footer names no bases"));
        }
        plain.clear();
        decoder.decode_append(e.codec, stored, e.plain_len as usize, &e.id, &mut plain)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: u64, stored_len: u32) -> PackEntry {
        PackEntry {
            id: ObjectId::of(&offset.to_le_bytes()),
            offset,
            stored_len,
            plain_len: stored_len,
            codec: Codec::Raw,
            bases: None,
        }
    }

    #[test]
    fn only_ranges_of_whole_chunks_are_kept() {
        let entries = [entry(24, 100), entry(124, 50), entry(174, 10)];
        assert_eq!(whole_chunks(&entries, &(24..174)).map(|c| c.len()), Some(2));
        assert_eq!(whole_chunks(&entries, &(124..184)).map(|c| c.len()), Some(2));
        assert!(whole_chunks(&entries, &(25..174)).is_none(), "starts inside a chunk");
        assert!(whole_chunks(&entries, &(24..170)).is_none(), "ends inside a chunk");
        assert!(whole_chunks(&entries, &(0..124)).is_none(), "holds the header");
        assert!(whole_chunks(&entries, &(174..250)).is_none(), "runs past the last chunk");
        assert!(whole_chunks(&entries, &(300..400)).is_none(), "no chunk");
    }

    #[test]
    fn a_tail_read_is_checked_from_the_chunk_holding_its_first_byte() {
        let footer =
            Footer { len: 250, entries: vec![entry(24, 100), entry(124, 50), entry(174, 10)], tail: vec![7; 66] };
        let tail = Check::of(&footer, &(130..250)).expect("a tail read starting inside a chunk");
        assert!(tail.tail && tail.from == 124 && tail.chunks.len() == 2);
        assert!(Check::of(&footer, &(130..240)).is_none(), "part of a chunk and part of the tail");
        assert!(Check::of(&footer, &(20..250)).is_none(), "starts in the header");
        let whole = Check::of(&footer, &(24..174)).expect("whole chunks");
        assert!(!whole.tail && whole.from == 24);
    }
}
