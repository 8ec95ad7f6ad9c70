//! Loads that check chunks on the GPU. A worker copies a range read of a pack, as stored,
//! into a pinned buffer and writes the read's jobs behind it; one DMA moves both to a device
//! staging area; zstd chunks are decoded there by nvCOMP (or, without it, on the host into a
//! second pinned area, pinned when first needed, moved beside it); then one launch of the
//! `load_chunks` kernel, a thread block per chunk, decodes the Huffman lanes of float-coded
//! chunks (their zstd lanes by nvCOMP; without it such a chunk decodes on the host) and joins
//! their lanes into words in place, hashes every chunk with BLAKE3 against its id and copies it
//! to its place in the image's buffers. The CPU never hashes, and decodes only zstd (without
//! nvCOMP) and deltas.
//!
//! A failing chunk lowers one device word to its number; the load reads that word once every
//! stream is done and fails naming the chunk and its pack, so nothing unchecked is returned.

use super::{HeldAt, Planned, PlannedRead, Pool, TransferWaits};
use crate::engine::Buffers;
use crate::plan::{PlannedChunk, RangeRead, ZeroRange, MAX_CHUNKS_PER_READ};
use gstore_gpu_dump::cuda::load::{CheckJob, ChunkLoad, LaneJob, NO_FAILURE};
use gstore_gpu_dump::cuda::nvcomp::{Nvcomp, ZstdBatch};
use gstore_gpu_dump::cuda::{Context, DeviceBuffer, Event, HostMemory, PinnedBuffer, Stream};
use gstore_gpu_dump::GpuDumpError;
use gstore_store::codec::{check_zstd_frame, float_layout, Codec, Decoder, FloatLaneCodec, FloatLayout};
use gstore_store::progress::{Progress, Unit};
use gstore_store::ObjectKind;
use gstore_store::{BaseReader, Result, Store, StoreError};
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// nVCOMP frames a read may need per chunk: a float-coded chunk has up to four zstd lanes.
const FRAMES_PER_CHUNK: usize = 4;

/// Pinned host staging of one read: written by a worker, emptied by the read's copies.
struct HostSlot {
    /// The range as stored, then (at [`meta_at`] of its length) the read's metadata; a read
    /// whose bytes are held elsewhere puts its metadata at the start.
    pinned: PinnedBuffer,
    /// Chunks decoded on the host (zstd without nvCOMP, deltas, float-coded ones the GPU
    /// cannot decode), pinned the first time a read of this slot has some: a load with none
    /// pins nothing for them. Mapped, then registered ([`Context::alloc_pinned`]): pinning took
    /// the driver's lock for 0.3 ms, where `cuMemHostAlloc` took it for 2-5 ms while the other
    /// workers' DMA calls waited (16 GiB loads took 0.35-0.36 s with it, 0.31-0.33 s
    /// without, on the H200 machine: docs/BENCHMARKS.md, issue #62).
    host_decoded: Option<PinnedBuffer>,
    /// Recorded behind the copies out of it (on the stream of the device slot they went to):
    /// waited on before the slot is written again (at once for a slot never used).
    copied: Event,
}

/// Device staging of one read: the DMA's target, where it is decoded and checked. Its stream
/// orders each read it takes behind the last one's kernels, so a worker queues a read on it
/// without waiting; the read's host slot is free again once its DMA is done. So more reads are
/// queued on the GPU than are staged in pinned memory, and a worker waits only for a pinned
/// buffer (docs/BENCHMARKS.md, issue #62).
struct DeviceSlot {
    /// The range and its metadata, then decoded chunks, then decoded float lanes ([`Areas`]).
    device: DeviceBuffer,
    /// nVCOMP's scratch memory.
    temp: Option<DeviceBuffer>,
    /// Its own stream: a read's DMA is queued before its kernels (shared streams, copies on
    /// some and kernels on others, measured slower on the H200: docs/BENCHMARKS.md, issue #62).
    stream: Stream,
}

/// The staging slots of a load, taken by its workers.
struct Pools {
    hosts: Pool<HostSlot>,
    devices: Pool<DeviceSlot>,
}

/// Device slots per pinned host slot (see [`DeviceSlot`]).
const DEVICE_SLOTS_PER_HOST_SLOT: usize = 2;

/// Workers of a load that reads the store into pinned staging, on a machine with `threads`
/// threads: three quarters of them. Their reads from the page cache and the DMA out of their
/// staging share the host's memory: on the H200 machine (16 threads) 12 workers loaded 16 GiB
/// sooner than 16, and waited less for their buffers' DMA (docs/BENCHMARKS.md, issue #62).
pub(super) fn readers(threads: usize) -> usize {
    (threads * 3 / 4).max(2)
}

/// Where a read of `len` bytes puts its metadata, behind its range: the next 256-byte
/// boundary, so that one DMA moves both.
fn meta_at(len: usize) -> usize {
    len.next_multiple_of(256)
}

/// Where a read's metadata starts in the slot's pinned buffer: behind its `len` bytes read
/// into the slot, or at the start when its range is held elsewhere.
fn meta_from(held: bool, len: usize) -> usize {
    if held {
        0
    } else {
        meta_at(len)
    }
}

/// Bytes of pinned staging one slot needs for range reads of up to `read_cap` bytes (0: reads
/// whose bytes are all held elsewhere), their metadata included.
pub(super) fn staging_len(read_cap: usize) -> usize {
    meta_at(read_cap) + MetaLayout::for_chunks(MAX_CHUNKS_PER_READ).bytes()
}

/// Where each array lives in a read's metadata (laid out for the read's own number of chunks,
/// so that a read of few chunks copies little): for `chunks` chunks and `frames` nvCOMP
/// frames, check jobs, five u64 nvCOMP arrays (frame address and length, output capacity,
/// decoded length, output address) and i32 statuses per frame, then lane jobs per float-coded
/// chunk.
#[derive(Clone, Copy)]
struct MetaLayout {
    chunks: usize,
    frames: usize,
}

impl MetaLayout {
    /// The layout for a read of `chunks` chunks.
    fn for_chunks(chunks: usize) -> MetaLayout {
        MetaLayout { chunks, frames: FRAMES_PER_CHUNK * chunks }
    }

    fn bytes(self) -> usize {
        self.lane_job(self.chunks)
    }
    fn job(self, k: usize) -> usize {
        size_of::<CheckJob>() * k
    }
    /// nVCOMP array `array` (0 frame addresses, 1 frame lengths, 2 capacities, 3 decoded
    /// lengths, 4 output addresses), entry `k`.
    fn array(self, array: usize, k: usize) -> usize {
        self.job(self.chunks) + 8 * (array * self.frames + k)
    }
    fn status(self, k: usize) -> usize {
        self.array(5, 0) + 4 * k
    }
    fn lane_job(self, k: usize) -> usize {
        (self.status(self.frames)).next_multiple_of(8) + size_of::<LaneJob>() * k
    }
}

/// Bytes of the lane area beyond a read's length: each decoded lane starts on a 16-byte
/// boundary (the kernel writes four symbols at a time), up to four lanes per chunk.
const LANE_SLACK: usize = 16 * 4 * MAX_CHUNKS_PER_READ;

/// A GPU-checked load, prepared (kernel loaded, staging allocated) alongside the plan.
pub(super) struct GpuLoad {
    ctx: Context,
    kernel: ChunkLoad,
    nvcomp: std::result::Result<Nvcomp, GpuDumpError>,
    hosts: Vec<HostSlot>,
    devices: Vec<DeviceSlot>,
    layout: MetaLayout,
    read_cap: usize,
    temp_bytes: usize,
}

/// The reads a load's workers take from the planner, numbered as they are taken.
struct Queue {
    reads: std::sync::mpsc::Receiver<PlannedRead>,
    /// Every read taken, with the number of its first chunk.
    taken: Vec<(u32, Arc<RangeRead>)>,
    next_tag: u32,
}

impl GpuLoad {
    /// Loads the load kernel (and nvCOMP when present) and makes one host staging slot per
    /// mapping of `staging` (each registered, and taken from it; each at least
    /// [`staging_len`] of the reads it will stage), and [`DEVICE_SLOTS_PER_HOST_SLOT`] device
    /// slots for each, for range reads of up to `read_cap` bytes, whose chunks are at most
    /// `chunk_max` bytes. `Ok(Err(e))` when the kernel does not load here (the caller
    /// then checks on the host, with `staging` untouched).
    pub(super) fn prepare(
        ctx: &Context,
        staging: &mut Vec<HostMemory>,
        read_cap: usize,
        chunk_max: usize,
    ) -> Result<std::result::Result<GpuLoad, GpuDumpError>> {
        let kernel = match ChunkLoad::load(ctx) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let nvcomp = Nvcomp::load();
        let layout = MetaLayout::for_chunks(MAX_CHUNKS_PER_READ);
        let temp_bytes = match &nvcomp {
            Ok(n) => n.zstd_temp_bytes(ctx, layout.frames, chunk_max, read_cap).map_err(StoreError::device)?,
            Err(_) => 0,
        };
        let device_bytes = Areas::bytes(read_cap);
        let host = |memory| {
            Ok::<_, StoreError>(HostSlot {
                pinned: ctx.register(memory).map_err(StoreError::device)?,
                host_decoded: None,
                copied: ctx.event().map_err(StoreError::device)?,
            })
        };
        let device = || {
            Ok::<_, StoreError>(DeviceSlot {
                device: ctx.alloc(device_bytes).map_err(StoreError::device)?,
                temp: if temp_bytes > 0 { Some(ctx.alloc(temp_bytes).map_err(StoreError::device)?) } else { None },
                stream: ctx.stream().map_err(StoreError::device)?,
            })
        };
        let device_slots = staging.len() * DEVICE_SLOTS_PER_HOST_SLOT;
        // Slots are made on several threads at once (pinning, device staging, streams).
        let (hosts, devices) = std::thread::scope(|s| {
            let hosts: Vec<_> = std::mem::take(staging).into_iter().map(|m| s.spawn(|| host(m))).collect();
            let devices: Vec<_> = (0..device_slots).map(|_| s.spawn(device)).collect();
            let hosts = hosts.into_iter().map(super::joined).collect::<Result<Vec<_>>>();
            (hosts, devices.into_iter().map(super::joined).collect::<Result<Vec<_>>>())
        });
        Ok(Ok(GpuLoad {
            ctx: ctx.clone(),
            kernel,
            nvcomp,
            hosts: hosts?,
            devices: devices?,
            layout,
            read_cap,
            temp_bytes,
        }))
    }

    /// What checks and decodes the chunks, for reports.
    pub(super) fn describe(&self) -> String {
        match &self.nvcomp {
            Ok(n) => format!(
                "chunks checked on the GPU (BLAKE3 kernel); zstd decoded on the GPU by {}; float lanes decoded and \
                 joined on the GPU",
                n.describe()
            ),
            Err(why) => format!(
                "chunks checked on the GPU (BLAKE3 kernel); zstd decoded on the host ({why}); Huffman float lanes \
                 decoded and joined on the GPU (chunks with zstd lanes on the host)"
            ),
        }
    }

    /// Fills the zero runs and every read arriving from the planner (until it hangs up) into
    /// `buffers` with `workers` threads, waits for every queued copy, decode and check, and
    /// fails if any chunk did not match its id. Reads whose bytes are `held` in pinned memory
    /// are copied from there; the others are read from `store` into the staging slots. Delta
    /// chunks decode on the host against bases from `bases`. The load may run again (its
    /// slots are kept). Returns where the workers' time went.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &mut self,
        store: &Store,
        bases: &dyn BaseReader,
        planned: Planned,
        held: &[PinnedBuffer],
        buffers: &Buffers,
        workers: usize,
        progress: &dyn Progress,
    ) -> Result<TransferWaits> {
        let Planned { reads, zeros, total } = planned;
        let failed = self.ctx.alloc(4).map_err(StoreError::device)?;
        self.clear(&failed, &zeros, buffers)?;
        let pools = Pools {
            hosts: Pool::new(std::mem::take(&mut self.hosts)),
            devices: Pool::new(std::mem::take(&mut self.devices)),
        };
        let loader = Loader {
            store,
            held,
            buffers,
            kernel: &self.kernel,
            nvcomp: self.nvcomp.as_ref().ok(),
            layout: self.layout,
            read_cap: self.read_cap,
            temp_bytes: self.temp_bytes,
            failed: failed.ptr(),
        };
        let queue = Mutex::new(Queue { reads, taken: Vec::new(), next_tag: 0 });
        let stop = AtomicBool::new(false);
        progress.start("loading", total, Unit::Bytes);
        let r = std::thread::scope(|s| {
            let handles: Vec<_> =
                (0..workers).map(|_| s.spawn(|| loader.work(&queue, &pools, bases, &stop, progress))).collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("load workers do not panic"))
                .collect::<Result<Vec<TransferWaits>>>()
        });
        progress.finish();
        // Every queued step finishes before any buffer it touches can be freed.
        let mut drained = Ok(());
        let Pools { hosts, devices } = pools;
        self.hosts = hosts.into_inner();
        self.devices = devices.into_inner();
        for slot in &self.devices {
            drained = drained.and(slot.stream.synchronize().map_err(StoreError::device));
        }
        let waits = TransferWaits::mean(&r.and_then(|w| drained.map(|()| w))?);
        let mut word = [0u8; 4];
        self.ctx.copy_to_host(&mut word, failed.ptr()).map_err(StoreError::device)?;
        let tag = u32::from_le_bytes(word);
        if tag == NO_FAILURE {
            return Ok(waits);
        }
        Err(failing_chunk(&queue.into_inner().expect("queue lock").taken, tag))
    }

    /// Sets the failure word `failed` to "no failure" and zeroes the zero runs `zeros` of
    /// `buffers`, on the first device slot's stream.
    fn clear(&self, failed: &DeviceBuffer, zeros: &[ZeroRange], buffers: &Buffers) -> Result<()> {
        let first = &self.devices[0].stream;
        // SAFETY: the failure word is this load's; zero runs lie in files' buffers (checked
        // by `address`) where no chunk goes.
        unsafe { first.fill_async(failed.ptr(), 0xff, 4) }.map_err(StoreError::device)?;
        first.synchronize().map_err(StoreError::device)?;
        for z in zeros {
            let at = buffers.address(z.entry, z.offset, z.len as usize)?;
            // SAFETY: as above.
            unsafe { first.fill_async(at, 0, z.len as usize) }.map_err(StoreError::device)?;
        }
        Ok(())
    }
}

/// The damage error for the chunk numbered `tag` (the failure word's value), found among the
/// reads `taken`, each with the number of its first chunk.
fn failing_chunk(taken: &[(u32, Arc<RangeRead>)], tag: u32) -> StoreError {
    let (first, read) =
        taken.iter().filter(|(t, _)| *t <= tag).max_by_key(|(t, _)| *t).expect("a failing chunk was queued");
    let c = &read.chunks[(tag - first) as usize];
    StoreError::corrupt(
        ObjectKind::Chunk,
        c.id.to_hex(),
        format!(
            "its {} bytes in VRAM do not hash to its id (or did not decode to that length) (in pack {})",
            c.loc.plain_len,
            read.pack.to_hex()
        ),
    )
}

/// What every worker shares while queueing reads.
struct Loader<'a> {
    store: &'a Store,
    held: &'a [PinnedBuffer],
    buffers: &'a Buffers,
    kernel: &'a ChunkLoad,
    nvcomp: Option<&'a Nvcomp>,
    layout: MetaLayout,
    read_cap: usize,
    temp_bytes: usize,
    failed: u64,
}

fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Where a slot's areas start on the device: the range as stored, then its metadata; chunks
/// decoded (by nvCOMP, or on the host and moved over); decoded float lanes.
#[derive(Clone, Copy)]
struct Areas {
    range: u64,
    meta: u64,
    decoded: u64,
    lanes: u64,
}

impl Areas {
    /// The areas of a slot's device buffer at `base`, for a read of `len` bytes among reads of
    /// up to `read_cap`.
    fn of(base: u64, len: usize, read_cap: usize) -> Areas {
        let decoded = base + staging_len(read_cap) as u64;
        Areas { range: base, meta: base + meta_at(len) as u64, decoded, lanes: decoded + read_cap as u64 }
    }

    /// Bytes of a slot's device buffer for reads of up to `read_cap` bytes.
    fn bytes(read_cap: usize) -> usize {
        staging_len(read_cap) + 2 * read_cap + LANE_SLACK
    }
}

/// What one read queues on its slot, gathered chunk by chunk.
struct Queued {
    /// Bytes of the decoded area given out.
    decoded: usize,
    /// Bytes of them decoded on the host, to be moved over.
    host_decoded: usize,
    /// nvCOMP frames.
    frames: usize,
    /// Float-coded chunks the kernel decodes.
    joins: usize,
    /// Bytes of the lane area given out.
    lanes_used: u64,
    /// Where the read's metadata lies.
    layout: MetaLayout,
    /// Zero chunks, filled in place (address, length).
    fills: Vec<(u64, usize)>,
    /// Other places of repeated chunks, copied once the first is checked (to, from, length).
    repeats: Vec<(u64, u64, usize)>,
    /// Plain bytes placed.
    written: u64,
}

impl Queued {
    fn for_read(chunks: usize) -> Queued {
        Queued {
            decoded: 0,
            host_decoded: 0,
            frames: 0,
            joins: 0,
            lanes_used: 0,
            layout: MetaLayout::for_chunks(chunks),
            fills: Vec::new(),
            repeats: Vec::new(),
            written: 0,
        }
    }
}

/// A read as staged for the DMA: its `len` bytes as stored and its metadata in the slot's
/// `pinned` buffer (the range first, then at [`meta_at`] the metadata: one copy moves both),
/// or, for a range `held` elsewhere (buffer and offset), the metadata alone at its start;
/// chunks decoded on the host; nvCOMP's scratch.
#[derive(Clone, Copy)]
struct Staged<'a> {
    len: usize,
    pinned: &'a PinnedBuffer,
    held: Option<(&'a PinnedBuffer, usize)>,
    host_decoded: Option<&'a PinnedBuffer>,
    temp: Option<&'a DeviceBuffer>,
}

/// Copies a job's bytes into the metadata area at `at`.
fn put_job(meta: &mut [u8], at: usize, job: &[u8]) {
    meta[at..at + job.len()].copy_from_slice(job);
}

impl Loader<'_> {
    /// One worker: takes planned reads from `queue` until it is empty (or `stop` is set by a
    /// worker that failed), each into a host slot of `pools`, and queues its transfer through
    /// one of its device slots.
    fn work(
        &self,
        queue: &Mutex<Queue>,
        pools: &Pools,
        bases: &dyn BaseReader,
        stop: &AtomicBool,
        progress: &dyn Progress,
    ) -> Result<TransferWaits> {
        let mut decoder = self.store.decoder_over(bases);
        let mut waits = TransferWaits::default();
        while !stop.load(Ordering::Relaxed) {
            let asked = Instant::now();
            let next = {
                let mut q = queue.lock().expect("queue lock");
                q.reads.recv().ok().map(|planned| {
                    let tag = q.next_tag;
                    q.next_tag += planned.read.chunks.len() as u32;
                    q.taken.push((tag, Arc::clone(&planned.read)));
                    (tag, planned)
                })
            };
            waits.planner_s += asked.elapsed().as_secs_f64();
            let Some((tag, PlannedRead { read, held })) = next else { return Ok(waits) };
            // Delta chunks decode on the host: their bases are read first.
            let r = bases
                .prefetch(&mut read.chunks.iter().filter_map(|c| c.loc.bases))
                .and_then(|_bases| self.queue(pools, &read, held, tag, &mut decoder, &mut waits));
            match r {
                Ok(n) => progress.advance(n),
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        Ok(waits)
    }

    /// Reads `read` into a host slot of `pools` (or takes its bytes where they are held),
    /// builds its jobs for a device slot, and queues its DMA, decode, check and placement;
    /// returns the plain bytes it places.
    fn queue(
        &self,
        pools: &Pools,
        read: &RangeRead,
        held: Option<HeldAt>,
        first_tag: u32,
        decoder: &mut Decoder<'_>,
        waits: &mut TransferWaits,
    ) -> Result<u64> {
        let mut host = pools.hosts.take();
        if let Err(e) = self.read_into(&mut host, read, held, waits) {
            pools.hosts.give(host);
            return Err(e);
        }
        let device = pools.devices.take();
        let r = self.stage(&mut host, &device, read, held, first_tag, decoder, waits).and_then(|(q, a)| {
            let launching = Instant::now();
            let staged = Staged {
                len: (read.end - read.start) as usize,
                pinned: &host.pinned,
                held: held.map(|h| (&self.held[h.buffer], h.offset)),
                host_decoded: host.host_decoded.as_ref(),
                temp: device.temp.as_ref(),
            };
            let written = q.written;
            self.launch(&device.stream, &staged, &host.copied, a, q, read.chunks.len() as u32)?;
            waits.launching_s += launching.elapsed().as_secs_f64();
            Ok(written)
        });
        pools.hosts.give(host);
        pools.devices.give(device);
        r
    }

    /// Waits for `host`'s last copies, then reads `read` into it unless its bytes are held.
    fn read_into(
        &self,
        host: &mut HostSlot,
        read: &RangeRead,
        held: Option<HeldAt>,
        waits: &mut TransferWaits,
    ) -> Result<()> {
        let t = Instant::now();
        host.copied.synchronize().map_err(StoreError::device)?;
        waits.copy_s += t.elapsed().as_secs_f64();
        let len = (read.end - read.start) as usize;
        if len > self.read_cap || read.chunks.len() > self.layout.chunks {
            return Err(StoreError::Internal(format!(
                "a read of {len} bytes in {} chunks exceeds the staging slot",
                read.chunks.len()
            )));
        }
        let layout = MetaLayout::for_chunks(read.chunks.len());
        // A range read into the slot has its metadata behind it; a held one, at the start.
        let meta_from = meta_from(held.is_some(), len);
        if meta_from + layout.bytes() > host.pinned.len() {
            return Err(StoreError::Internal(format!(
                "a read of {len} bytes in {} chunks exceeds the slot's pinned staging",
                read.chunks.len()
            )));
        }
        if held.is_none() {
            let t = Instant::now();
            self.store.read_pack_range_into(
                &read.pack,
                read.start..read.end,
                &mut host.pinned.as_mut_slice()[..len],
            )?;
            waits.reading_s += t.elapsed().as_secs_f64();
        }
        Ok(())
    }

    /// Builds the jobs of `read`, read into `host` (or held), in its metadata, for `device`;
    /// returns what to queue and where.
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &self,
        host: &mut HostSlot,
        device: &DeviceSlot,
        read: &RangeRead,
        held: Option<HeldAt>,
        first_tag: u32,
        decoder: &mut Decoder<'_>,
        waits: &mut TransferWaits,
    ) -> Result<(Queued, Areas)> {
        let len = (read.end - read.start) as usize;
        let HostSlot { pinned, host_decoded: decoded_area, .. } = host;
        let staging = &device.device;
        let mut q = Queued::for_read(read.chunks.len());
        let meta_from = meta_from(held.is_some(), len);
        let (range, meta): (&[u8], &mut [u8]) = match held {
            Some(h) => (&self.held[h.buffer].as_slice()[h.offset..h.offset + len], pinned.as_mut_slice()),
            None => {
                let (head, meta) = pinned.as_mut_slice().split_at_mut(meta_from);
                (&head[..len], meta)
            }
        };
        let building = Instant::now();
        let a = Areas::of(staging.ptr(), len, self.read_cap);
        for (k, c) in read.chunks.iter().enumerate() {
            let at = (c.loc.offset - read.start) as usize;
            let stored = &range[at..at + c.loc.stored_len as usize];
            let plain = c.loc.plain_len as usize;
            let (entry, offset) = c.targets[0];
            let dst = self.buffers.address(entry, offset, plain)?;
            let mut job = CheckJob::new(a.range + at as u64, dst, c.loc.plain_len, first_tag + k as u32, &c.id.0);
            let stored_at = a.range + at as u64;
            match (c.loc.codec, self.gpu_floats(stored, plain, c, read)?) {
                (Codec::Raw, _) => {}
                (Codec::Zero, _) => {
                    // Filled in place, then hashed there.
                    q.fills.push((dst, plain));
                    (job.src, job.dst) = (dst, 0);
                }
                (Codec::Zstd, _) if self.nvcomp.is_some() => {
                    job.src = a.decoded + q.decoded as u64;
                    self.whole_frame(stored, plain, c, read)?;
                    (job.actual_len, job.status) = self.frame(&mut q, meta, a, stored_at, stored.len(), plain, job.src);
                    q.decoded += plain;
                }
                // Joined in place, then hashed there.
                (Codec::Floats, Some(f)) => {
                    (job.src, job.dst) = (dst, 0);
                    job.lanes = self.queue_lanes(&mut q, meta, a, &f, stored, stored_at, c, read)?;
                }
                // Deltas are decoded on the host (their bases come from the store).
                (Codec::Zstd | Codec::Floats | Codec::Delta, _) => {
                    job.src = a.decoded + q.decoded as u64;
                    let area = match decoded_area {
                        Some(area) => area,
                        None => decoded_area
                            .insert(staging.context().alloc_pinned(self.read_cap).map_err(StoreError::device)?),
                    };
                    let out = &mut area.as_mut_slice()[q.decoded..][..plain];
                    self.decode_on_host(decoder, stored, out, c, read)?;
                    q.decoded += plain;
                    q.host_decoded = q.decoded;
                }
            }
            put_job(meta, q.layout.job(k), job.as_bytes());
            for &(e, o) in &c.targets[1..] {
                q.repeats.push((self.buffers.address(e, o, plain)?, dst, plain));
            }
            q.written += (plain * c.targets.len()) as u64;
        }
        waits.building_s += building.elapsed().as_secs_f64();
        Ok((q, a))
    }
}

impl Loader<'_> {
    /// Queues what `q` gathered for a read of `chunks` chunks staged in `staged` on `stream`:
    /// the DMA of the range and its metadata (and of chunks decoded on the host), `copied`
    /// recorded behind it, zero fills, nvCOMP, the load kernel, then the copies of repeated
    /// chunks.
    fn launch(
        &self,
        stream: &Stream,
        staged: &Staged<'_>,
        copied: &Event,
        a: Areas,
        q: Queued,
        chunks: u32,
    ) -> Result<()> {
        let Queued { host_decoded, frames, fills, repeats, layout, .. } = q;
        let meta_base = a.meta;
        let Staged { len, pinned, held, host_decoded: decoded_area, temp } = *staged;
        let meta_from = meta_from(held.is_some(), len);
        // SAFETY (the copies and fills below): this slot's pinned buffers are not written again
        // before its event (recorded last) is waited on, held bytes never are, its device
        // buffers are its own, and every destination lies in a file's buffer (checked by
        // `address`) that no other read writes.
        unsafe {
            match held {
                // The range and, behind it, its metadata: one DMA.
                None => stream.copy_to_device_async(a.range, pinned, 0, meta_from + layout.bytes()),
                Some((src, at)) => stream
                    .copy_to_device_async(a.range, src, at, len)
                    .and_then(|()| stream.copy_to_device_async(a.meta, pinned, meta_from, layout.bytes())),
            }
            .map_err(StoreError::device)?;
            if let (Some(area), true) = (decoded_area, host_decoded > 0) {
                stream.copy_to_device_async(a.decoded, area, 0, host_decoded).map_err(StoreError::device)?;
            }
        }
        copied.record(stream).map_err(StoreError::device)?;
        // SAFETY: as above.
        unsafe {
            for (dst, len) in fills {
                stream.fill_async(dst, 0, len).map_err(StoreError::device)?;
            }
        }
        if let (Some(nvcomp), true) = (self.nvcomp, frames > 0) {
            let l = layout;
            let at = |array| meta_base + l.array(array, 0) as u64;
            let batch = ZstdBatch {
                count: frames,
                compressed_ptrs: at(0),
                compressed_bytes: at(1),
                out_capacity: at(2),
                out_bytes: at(3),
                out_ptrs: at(4),
                statuses: meta_base + l.status(0) as u64,
                temp: temp.map_or(0, |t| t.ptr()),
                temp_bytes: self.temp_bytes,
            };
            // SAFETY: every address lies in this slot's staging and metadata buffers, written
            // above and kept alive (and unreused) until the slot's event says the work is done.
            unsafe { nvcomp.zstd_decompress_async(stream, &batch) }.map_err(StoreError::device)?;
        }
        // SAFETY: the jobs and lane jobs (copied above) point into this slot's buffers and
        // into the image's buffers, all alive until the load drains every stream.
        unsafe {
            self.kernel.launch(
                stream,
                meta_base + layout.job(0) as u64,
                meta_base + layout.lane_job(0) as u64,
                chunks,
                self.failed,
                self.store.chunk_ids().key(),
            )
        }
        .map_err(StoreError::device)?;
        for (dst, src, len) in repeats {
            // SAFETY: `src` was placed by the kernel queued before on this stream; `dst` is
            // another place of the same chunk in a file's buffer.
            unsafe { stream.copy_on_device_async(dst, src, len) }.map_err(StoreError::device)?;
        }
        Ok(())
    }

    /// The lane layout of float-coded chunk `c` when the GPU decodes every lane of it: raw and
    /// Huffman lanes always, zstd lanes with nvCOMP.
    fn gpu_floats(
        &self,
        stored: &[u8],
        plain: usize,
        c: &PlannedChunk,
        read: &RangeRead,
    ) -> Result<Option<FloatLayout>> {
        if c.loc.codec != Codec::Floats {
            return Ok(None);
        }
        let f = float_layout(stored, plain, &c.id).map_err(|e| in_pack(e, read))?;
        Ok(f.lanes.iter().all(|l| l.codec != FloatLaneCodec::Zstd || self.nvcomp.is_some()).then_some(f))
    }

    /// Checks a zstd frame's header and block headers before nvCOMP gets it: nvCOMP is not
    /// trusted to stay within its output on a damaged frame.
    fn whole_frame(&self, frame: &[u8], len: usize, c: &PlannedChunk, read: &RangeRead) -> Result<()> {
        check_zstd_frame(frame, len, &c.id).map_err(|e| in_pack(e, read))
    }

    /// Queues one nvCOMP frame; returns the device addresses of its decoded length and status.
    #[allow(clippy::too_many_arguments)]
    fn frame(
        &self,
        q: &mut Queued,
        meta: &mut [u8],
        a: Areas,
        src: u64,
        len: usize,
        capacity: usize,
        out: u64,
    ) -> (u64, u64) {
        let (l, n) = (q.layout, q.frames);
        put_u64(meta, l.array(0, n), src);
        put_u64(meta, l.array(1, n), len as u64);
        put_u64(meta, l.array(2, n), capacity as u64);
        put_u64(meta, l.array(4, n), out);
        q.frames += 1;
        (a.meta + l.array(3, n) as u64, a.meta + l.status(n) as u64)
    }

    /// Queues the lanes of float-coded chunk `c` (stored at `stored_at` on the device) for the
    /// kernel to decode into the lane area and join; returns what its check job names: 1 + the
    /// index of its lane job.
    #[allow(clippy::too_many_arguments)]
    fn queue_lanes(
        &self,
        q: &mut Queued,
        meta: &mut [u8],
        a: Areas,
        f: &FloatLayout,
        stored: &[u8],
        stored_at: u64,
        c: &PlannedChunk,
        read: &RangeRead,
    ) -> Result<u32> {
        let mut lane_job = LaneJob {
            tail: stored_at + f.tail.start as u64,
            words: f.words as u32,
            width: f.width as u16,
            tail_len: f.tail.len() as u16,
            ..LaneJob::default()
        };
        for (i, lane) in f.lanes.iter().enumerate() {
            let src = stored_at + lane.stored.start as u64;
            let out = a.lanes + q.lanes_used;
            match lane.codec {
                FloatLaneCodec::Zstd => {
                    self.whole_frame(&stored[lane.stored.clone()], f.words, c, read)?;
                    (lane_job.lane_len[i], lane_job.lane_status[i]) =
                        self.frame(q, meta, a, src, lane.stored.len(), f.words, out);
                }
                FloatLaneCodec::Huffman => {
                    (lane_job.huff[i], lane_job.huff_len[i]) = (src, lane.stored.len() as u32);
                }
                FloatLaneCodec::Raw => {
                    lane_job.lane[i] = src;
                    continue;
                }
            }
            lane_job.lane[i] = out;
            // The next lane starts on a 16-byte boundary (within the area's slack).
            q.lanes_used = (q.lanes_used + f.words as u64).next_multiple_of(16);
        }
        put_job(meta, q.layout.lane_job(q.joins), lane_job.as_bytes());
        q.joins += 1;
        Ok(q.joins as u32)
    }

    /// Decodes chunk `c` on the host into `out` (its plain length), without hashing: the
    /// kernel checks the bytes.
    fn decode_on_host(
        &self,
        decoder: &mut Decoder<'_>,
        stored: &[u8],
        out: &mut [u8],
        c: &PlannedChunk,
        read: &RangeRead,
    ) -> Result<()> {
        let n = decoder.expand_into(c.loc.codec, stored, &c.id, out).map_err(|e| in_pack(e, read))?;
        if n != out.len() {
            let detail = format!("decodes to {n} bytes, not {}", out.len());
            return Err(in_pack(StoreError::corrupt(ObjectKind::Chunk, c.id.to_hex(), detail), read));
        }
        Ok(())
    }
}

/// Adds the pack to a chunk error so the user learns which object is damaged.
fn in_pack(e: impl Into<StoreError>, read: &RangeRead) -> StoreError {
    crate::engine::in_pack(e, &read.pack)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reads_metadata_lies_behind_its_range_and_every_area_fits_the_slot() {
        let read_cap = 3 << 20;
        for chunks in [1, 2, 47, MAX_CHUNKS_PER_READ] {
            let l = MetaLayout::for_chunks(chunks);
            // Jobs, nvCOMP arrays, statuses and lane jobs follow one another without overlap,
            // the lane jobs 8-byte aligned as the kernel reads them.
            assert_eq!(l.job(chunks), l.array(0, 0));
            assert_eq!(l.array(4, l.frames), l.status(0));
            assert!(l.status(l.frames) <= l.lane_job(0) && l.lane_job(0).is_multiple_of(8));
            assert_eq!(l.bytes(), l.lane_job(chunks));
            for len in [0, 1, 4097, read_cap - 1, read_cap] {
                // A range read into the slot, then its metadata, 256-byte aligned, in the slot.
                assert!(meta_at(len) >= len && meta_at(len).is_multiple_of(256));
                assert!(meta_at(len) + l.bytes() <= staging_len(read_cap));
                assert_eq!((meta_from(false, len), meta_from(true, len)), (meta_at(len), 0));
                let a = Areas::of(1 << 40, len, read_cap);
                assert_eq!(a.meta - a.range, meta_at(len) as u64);
                assert!(a.meta + l.bytes() as u64 <= a.decoded);
                assert_eq!(a.lanes - a.decoded, read_cap as u64);
                assert_eq!(a.lanes + (read_cap + LANE_SLACK) as u64, a.range + Areas::bytes(read_cap) as u64);
            }
            // A held read's metadata starts the slot's pinned buffer (one without range room).
            assert!(l.bytes() <= staging_len(0));
        }
    }
}
