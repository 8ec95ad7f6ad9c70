//! The pipeline: range reads run in parallel (bounded by the thread pool), every chunk is
//! decoded and checked against its BLAKE3 id, and the plain bytes of one read go to the sink
//! as one batch.

use crate::plan::{Plan, RangeRead};
use crate::seed::Seed;
use gstore_store::codec::{self, Codec};
use gstore_store::format::manifest::{Entry, EntryKind, Manifest};
use gstore_store::progress::{Progress, Unit};
use gstore_store::{IndexedStore, ObjectId, Result, StoreError};
use rayon::prelude::*;

/// One piece of restored data: plain bytes for `offset` of entry `entry`.
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    /// Entry index in the manifest.
    pub entry: usize,
    /// Byte offset in the entry.
    pub offset: u64,
    /// The bytes (already verified).
    pub data: &'a [u8],
}

/// Where restored bytes go. `write_batch` is called from many threads at once; pieces of
/// different calls never overlap.
pub trait Sink: Sync {
    /// Writes every piece of one range read.
    fn write_batch(&self, pieces: &[Piece<'_>]) -> Result<()>;
}

/// Where each entry's buffer is in memory (host or device addresses): (base, length), `None`
/// for entries that are not files.
pub struct Buffers(Vec<Option<(u64, usize)>>);

impl Buffers {
    /// Allocates one buffer per file entry of `m` with `alloc`, which returns the buffer and
    /// its (base address, length). Returns the buffers with their paths, and their addresses.
    pub fn allocate<T>(
        m: &Manifest,
        mut alloc: impl FnMut(&Entry) -> Result<(T, u64, usize)>,
    ) -> Result<(Vec<(String, T)>, Buffers)> {
        let mut owned = Vec::new();
        let mut bases = Vec::with_capacity(m.entries.len());
        for e in &m.entries {
            if e.kind != EntryKind::File {
                bases.push(None);
                continue;
            }
            let (buffer, base, len) = alloc(e)?;
            bases.push(Some((base, len)));
            owned.push((e.path.clone(), buffer));
        }
        Ok((owned, Buffers(bases)))
    }

    /// The address `len` bytes at `offset` of `entry` go to, after checking they fit.
    pub fn address(&self, entry: usize, offset: u64, len: usize) -> Result<u64> {
        let (base, size) = self.0[entry].ok_or_else(|| StoreError::Internal(format!("entry {entry} is not a file")))?;
        if offset as usize + len > size {
            return Err(StoreError::Internal(format!(
                "{len} bytes at {offset} run past the {size}-byte buffer of entry {entry}"
            )));
        }
        Ok(base + offset)
    }
}

/// Range reads in flight for a remote store, whatever the core count: requests wait on the
/// network, not the CPU.
const REMOTE_READS_IN_FLIGHT: usize = 16;

/// Runs every read of `plan` into `sink`, reporting plain bytes written to `progress`.
pub fn run(store: &IndexedStore, plan: &Plan, sink: &dyn Sink, progress: &dyn Progress) -> Result<()> {
    run_seeded(store, plan, sink, None, progress)
}

/// [`run`], taking the delta bases `seed` holds from there instead of the store.
pub fn run_seeded(
    store: &IndexedStore,
    plan: &Plan,
    sink: &dyn Sink,
    seed: Option<&Seed>,
    progress: &dyn Progress,
) -> Result<()> {
    if store.is_remote() && rayon::current_num_threads() < REMOTE_READS_IN_FLIGHT {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(REMOTE_READS_IN_FLIGHT)
            .build()
            .map_err(|e| StoreError::Internal(format!("starting restore threads: {e}")))?;
        return pool.install(|| run_here(store, plan, sink, seed, progress));
    }
    run_here(store, plan, sink, seed, progress)
}

fn run_here(
    store: &IndexedStore,
    plan: &Plan,
    sink: &dyn Sink,
    seed: Option<&Seed>,
    progress: &dyn Progress,
) -> Result<()> {
    // Zero runs are counted at once: they are never fetched (holes, or zeroed by the sink), so
    // the bar ends at the image's size, as the summary says it.
    let zeros: u64 = plan.zeros.iter().map(|z| z.len).sum();
    progress.start("restoring", plan.write_bytes() + zeros, Unit::Bytes);
    progress.advance(zeros);
    let r = plan.reads.par_iter().try_for_each_init(
        || (store.decoder(), Vec::new()),
        |(decoder, arena), read| {
            let written = fetch_decode_write(store, read, decoder, arena, sink, seed)?;
            progress.advance(written);
            Ok::<(), StoreError>(())
        },
    );
    progress.finish();
    r
}

/// Where a decoded chunk's bytes live: in the fetched range (raw) or in the arena.
enum Source {
    Fetched(std::ops::Range<usize>),
    Arena(std::ops::Range<usize>),
}

fn fetch_decode_write(
    store: &IndexedStore,
    read: &RangeRead,
    decoder: &mut codec::Decoder<'_>,
    arena: &mut Vec<u8>,
    sink: &dyn Sink,
    seed: Option<&Seed>,
) -> Result<u64> {
    // The bases of the read's delta chunks: those the seed holds from there, the others read
    // side by side before any is decoded.
    let _seeded = seed.map(|s| store.offer_bases(s.bases_of(read)));
    let _bases = store.prefetch_bases(read.chunks.iter().filter_map(|c| c.loc.bases))?;
    // Every chunk is checked before the range counts as good (and may be cached).
    let (data, sources) = store.read_checked_range(&read.pack, read.start..read.end, |data| {
        // The arena keeps its length from read to read (decoding writes every byte it hands
        // out), so its memory is zeroed once, not for every chunk.
        let mut used = 0;
        let mut sources = Vec::with_capacity(read.chunks.len());
        for c in &read.chunks {
            let at = (c.loc.offset - read.start) as usize;
            let stored = &data[at..at + c.loc.stored_len as usize];
            let plain_len = c.loc.plain_len as usize;
            let src = if c.loc.codec == Codec::Raw {
                codec::verify(stored, plain_len, &c.id, &store.chunk_ids()).map_err(|e| in_pack(e, &read.pack))?;
                Source::Fetched(at..at + plain_len)
            } else {
                let place = used..used + plain_len;
                if arena.len() < place.end {
                    arena.resize(place.end, 0);
                }
                decoder
                    .decode_into(c.loc.codec, stored, &c.id, &mut arena[place.clone()])
                    .map_err(|e| in_pack(e, &read.pack))?;
                used = place.end;
                Source::Arena(place)
            };
            sources.push(src);
        }
        Ok((data.clone(), sources))
    })?;
    let mut pieces = Vec::with_capacity(read.chunks.len());
    let mut written = 0;
    for (c, src) in read.chunks.iter().zip(&sources) {
        let bytes = match src {
            Source::Fetched(r) => &data[r.clone()],
            Source::Arena(r) => &arena[r.clone()],
        };
        for &(entry, offset) in &c.targets {
            pieces.push(Piece { entry, offset, data: bytes });
            written += bytes.len() as u64;
        }
    }
    sink.write_batch(&pieces)?;
    Ok(written)
}

/// Adds the pack to a chunk error so the user learns which object is damaged.
pub(crate) fn in_pack(e: impl Into<StoreError>, pack: &ObjectId) -> StoreError {
    e.into().found_in(format_args!("pack {}", pack.to_hex()))
}
