//! Loads that check chunks on the GPU. A worker copies a range read of a pack, as stored,
//! into a pinned buffer; one DMA moves it to a device staging area; zstd chunks are decoded
//! there by nvCOMP (or, without it, on the host into a second pinned area, pinned when first
//! needed, moved beside it);
//! float-coded chunks have their Huffman lanes decoded by the `decode_huffman` kernel (their
//! zstd lanes by nvCOMP; without it such a chunk decodes on the host) and their lanes joined
//! into words by the `join_lanes` kernel; then the `verify_chunks` kernel hashes every chunk
//! with BLAKE3 against its id and copies it to its place in the image's buffers. The CPU never
//! hashes, and decodes only zstd (without nvCOMP) and deltas.
//!
//! A failing chunk lowers one device word to its number; the load reads that word once every
//! stream is done and fails naming the chunk and its pack, so nothing unchecked is returned.

use super::{cuda_err, HeldAt, Planned, PlannedRead, Pool, TransferWaits};
use crate::engine::Buffers;
use crate::plan::{RangeRead, MAX_CHUNKS_PER_READ};
use gstore_gpu_dump::cuda::check::{CheckJob, ChunkCheck, NO_FAILURE};
use gstore_gpu_dump::cuda::join::{FloatLanes, HuffJob, LaneJob};
use gstore_gpu_dump::cuda::nvcomp::{Nvcomp, ZstdBatch};
use gstore_gpu_dump::cuda::{Context, DeviceBuffer, Event, HostMemory, PinnedBuffer, Stream};
use gstore_store::codec::{check_zstd_frame, float_layout, Codec, Decoder, FloatLaneCodec};
use gstore_store::progress::{Progress, Unit};
use gstore_store::ObjectKind;
use gstore_store::{Result, Store, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// nVCOMP frames a read may need per chunk: a float-coded chunk has up to four zstd lanes.
const FRAMES_PER_CHUNK: usize = 4;

/// One staging slot: range and decode areas, per-chunk metadata, a stream.
struct Slot {
    /// The range as stored.
    pinned: PinnedBuffer,
    /// Chunks decoded on the host (zstd without nvCOMP, deltas, float-coded ones the GPU
    /// cannot decode), pinned the first time a read of this slot has some: a load with none
    /// pins nothing for them.
    host_decoded: Option<PinnedBuffer>,
    /// The range, then decoded chunks, then (with the float lane kernels) decoded float lanes, in
    /// device memory.
    device: DeviceBuffer,
    meta_host: PinnedBuffer,
    meta_device: DeviceBuffer,
    /// nVCOMP's scratch memory.
    temp: Option<DeviceBuffer>,
    stream: Stream,
    done: Event,
    in_flight: bool,
}

/// Where each array lives in a slot's metadata area, for up to `chunks` chunks and `frames`
/// nvCOMP frames per read: check jobs (80 bytes each), five u64 nvCOMP arrays (frame address
/// and length, output capacity, decoded length, output address) and i32 statuses per frame,
/// then lane jobs (128 bytes) and joined lengths (u64) per float-coded chunk, then Huffman
/// lane jobs (32 bytes), up to four per chunk.
#[derive(Clone, Copy)]
struct MetaLayout {
    chunks: usize,
    frames: usize,
}

impl MetaLayout {
    fn bytes(self) -> usize {
        self.huff_job(4 * self.chunks)
    }
    fn job(self, k: usize) -> usize {
        80 * k
    }
    /// nVCOMP array `array` (0 frame addresses, 1 frame lengths, 2 capacities, 3 decoded
    /// lengths, 4 output addresses), entry `k`.
    fn array(self, array: usize, k: usize) -> usize {
        80 * self.chunks + 8 * (array * self.frames + k)
    }
    fn status(self, k: usize) -> usize {
        80 * self.chunks + 40 * self.frames + 4 * k
    }
    fn lane_job(self, k: usize) -> usize {
        80 * self.chunks + 44 * self.frames + 128 * k
    }
    fn joined_len(self, k: usize) -> usize {
        self.lane_job(self.chunks) + 8 * k
    }
    fn huff_job(self, k: usize) -> usize {
        self.joined_len(self.chunks) + 32 * k
    }
}

/// A GPU-checked load, prepared (kernel loaded, staging allocated) alongside the plan.
pub(super) struct GpuLoad {
    ctx: Context,
    check: ChunkCheck,
    nvcomp: std::result::Result<Nvcomp, String>,
    /// The Huffman lane decode and the lane join (else float-coded chunks decode on the
    /// host), or why not.
    lanes: std::result::Result<FloatLanes, String>,
    slots: Vec<Slot>,
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
    /// Loads the check kernel (and nvCOMP when present) and makes one staging slot per mapping
    /// of `staging` (each registered, and taken from it) for range reads of up to `read_cap`
    /// bytes, whose chunks are at most `chunk_max` bytes. `Ok(Err(reason))` when the kernel
    /// cannot be used here (the caller then checks on the host, with `staging` untouched).
    pub(super) fn prepare(
        ctx: &Context,
        staging: &mut Vec<HostMemory>,
        read_cap: usize,
        chunk_max: usize,
    ) -> Result<std::result::Result<GpuLoad, String>> {
        let check = match ChunkCheck::load(ctx) {
            Ok(c) => c,
            Err(e) => return Ok(Err(format!("the GPU check kernel is unavailable: {e}"))),
        };
        let nvcomp = Nvcomp::load().map_err(|e| e.to_string());
        let lanes = FloatLanes::load(ctx).map_err(|e| format!("the float lane kernels are unavailable: {e}"));
        let layout = MetaLayout { chunks: MAX_CHUNKS_PER_READ, frames: FRAMES_PER_CHUNK * MAX_CHUNKS_PER_READ };
        let temp_bytes = match &nvcomp {
            Ok(n) => n.zstd_temp_bytes(ctx, layout.frames, chunk_max, read_cap).map_err(cuda_err)?,
            Err(_) => 0,
        };
        let device_areas = if lanes.is_ok() { 3 } else { 2 };
        let slot = |memory| {
            Ok::<_, StoreError>(Slot {
                pinned: ctx.register(memory).map_err(cuda_err)?,
                host_decoded: None,
                device: ctx.alloc(device_areas * read_cap).map_err(cuda_err)?,
                meta_host: ctx.alloc_pinned(layout.bytes()).map_err(cuda_err)?,
                meta_device: ctx.alloc(layout.bytes()).map_err(cuda_err)?,
                temp: if temp_bytes > 0 { Some(ctx.alloc(temp_bytes).map_err(cuda_err)?) } else { None },
                stream: ctx.stream().map_err(cuda_err)?,
                done: ctx.event().map_err(cuda_err)?,
                in_flight: false,
            })
        };
        // Slots are made on several threads at once (device staging, metadata, streams).
        let all = std::thread::scope(|s| {
            let made: Vec<_> = std::mem::take(staging).into_iter().map(|m| s.spawn(|| slot(m))).collect();
            made.into_iter().map(|h| h.join().expect("allocating a slot does not panic")).collect::<Result<Vec<_>>>()
        })?;
        Ok(Ok(GpuLoad { ctx: ctx.clone(), check, nvcomp, lanes, slots: all, layout, read_cap, temp_bytes }))
    }

    /// What checks and decodes the chunks, for reports.
    pub(super) fn describe(&self) -> String {
        let floats = match (&self.lanes, &self.nvcomp) {
            (Ok(_), Ok(_)) => "float lanes decoded and joined on the GPU".to_string(),
            (Ok(_), Err(_)) => {
                "Huffman float lanes decoded and joined on the GPU (chunks with zstd lanes on the host)".to_string()
            }
            (Err(why), _) => format!("float lanes decoded on the host ({why})"),
        };
        match &self.nvcomp {
            Ok(n) => {
                format!(
                    "chunks checked on the GPU (BLAKE3 kernel); zstd decoded on the GPU by {}; {floats}",
                    n.describe()
                )
            }
            Err(why) => {
                format!("chunks checked on the GPU (BLAKE3 kernel); zstd decoded on the host ({why}); {floats}")
            }
        }
    }

    /// Fills the zero runs and every read arriving from the planner (until it hangs up) into
    /// `buffers` with `workers` threads, waits for every queued copy, decode and check, and
    /// fails if any chunk did not match its id. Reads whose bytes are `held` in pinned memory
    /// are copied from there; the others are read from `store` into the staging slots. The
    /// load may run again (its slots are kept). Returns where the workers' time went.
    pub(super) fn run(
        &mut self,
        store: &Store,
        planned: Planned,
        held: &[PinnedBuffer],
        buffers: &Buffers,
        workers: usize,
        progress: &dyn Progress,
    ) -> Result<TransferWaits> {
        let Planned { reads, zeros, total } = planned;
        let failed = self.ctx.alloc(4).map_err(cuda_err)?;
        {
            let first = &self.slots[0].stream;
            // SAFETY: the failure word is this load's; zero runs lie in files' buffers (checked
            // by `address`) where no chunk goes.
            unsafe { first.fill_async(failed.ptr(), 0xff, 4) }.map_err(cuda_err)?;
            first.synchronize().map_err(cuda_err)?;
            for z in &zeros {
                let at = buffers.address(z.entry, z.offset, z.len as usize)?;
                // SAFETY: as above.
                unsafe { first.fill_async(at, 0, z.len as usize) }.map_err(cuda_err)?;
            }
        }
        let pool = Pool::new(std::mem::take(&mut self.slots));
        let loader = Loader {
            store,
            held,
            buffers,
            check: &self.check,
            nvcomp: self.nvcomp.as_ref().ok(),
            lanes: self.lanes.as_ref().ok(),
            layout: self.layout,
            read_cap: self.read_cap,
            temp_bytes: self.temp_bytes,
            failed: failed.ptr(),
        };
        let queue = Mutex::new(Queue { reads, taken: Vec::new(), next_tag: 0 });
        let stop = AtomicBool::new(false);
        progress.start("loading", total, Unit::Bytes);
        let r = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| {
                        let mut decoder = store.decoder();
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
                            let mut slot = pool.take();
                            // Delta chunks decode on the host: their bases are read first.
                            let r = store
                                .prefetch_bases(read.chunks.iter().filter_map(|c| c.loc.bases))
                                .and_then(|_bases| loader.queue(&mut slot, &read, held, tag, &mut decoder, &mut waits));
                            pool.give(slot);
                            match r {
                                Ok(n) => progress.advance(n),
                                Err(e) => {
                                    stop.store(true, Ordering::Relaxed);
                                    return Err(e);
                                }
                            }
                        }
                        Ok(waits)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("load workers do not panic"))
                .collect::<Result<Vec<TransferWaits>>>()
        });
        progress.finish();
        // Every queued step finishes before any buffer it touches can be freed.
        let mut drained = Ok(());
        self.slots = pool.into_inner();
        for slot in &self.slots {
            drained = drained.and(slot.stream.synchronize().map_err(cuda_err));
        }
        let waits = TransferWaits::mean(&r.and_then(|w| drained.map(|()| w))?);
        let mut word = [0u8; 4];
        self.ctx.copy_to_host(&mut word, failed.ptr()).map_err(cuda_err)?;
        let tag = u32::from_le_bytes(word);
        if tag == NO_FAILURE {
            return Ok(waits);
        }
        let taken = queue.into_inner().expect("queue lock").taken;
        let (first, read) =
            taken.iter().filter(|(t, _)| *t <= tag).max_by_key(|(t, _)| *t).expect("a failing chunk was queued");
        let c = &read.chunks[(tag - first) as usize];
        Err(StoreError::corrupt(
            ObjectKind::Chunk,
            c.id.to_hex(),
            format!(
                "its {} bytes in VRAM do not hash to its id (or did not decode to that length) (in pack {})",
                c.loc.plain_len,
                read.pack.to_hex()
            ),
        ))
    }
}

/// What every worker shares while queueing reads.
struct Loader<'a> {
    store: &'a Store,
    held: &'a [PinnedBuffer],
    buffers: &'a Buffers,
    check: &'a ChunkCheck,
    nvcomp: Option<&'a Nvcomp>,
    lanes: Option<&'a FloatLanes>,
    layout: MetaLayout,
    read_cap: usize,
    temp_bytes: usize,
    failed: u64,
}

fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

impl Loader<'_> {
    /// Reads `read` into `slot` (or takes its bytes where they are held) and queues its DMA,
    /// decode, check and placement; returns the plain bytes it places.
    fn queue(
        &self,
        slot: &mut Slot,
        read: &RangeRead,
        held: Option<HeldAt>,
        first_tag: u32,
        decoder: &mut Decoder<'_>,
        waits: &mut TransferWaits,
    ) -> Result<u64> {
        if slot.in_flight {
            let t = Instant::now();
            slot.done.synchronize().map_err(cuda_err)?;
            waits.gpu_s += t.elapsed().as_secs_f64();
            slot.in_flight = false;
        }
        let len = (read.end - read.start) as usize;
        if len > self.read_cap || read.chunks.len() > self.layout.chunks {
            return Err(StoreError::Internal(format!(
                "a read of {len} bytes in {} chunks exceeds the staging slot",
                read.chunks.len()
            )));
        }
        let Slot { pinned, host_decoded: decoded_area, device, meta_host, meta_device, temp, stream, done, .. } = slot;
        let (src, src_at): (&PinnedBuffer, usize) = match held {
            Some(h) => (&self.held[h.buffer], h.offset),
            None => {
                let t = Instant::now();
                self.store.read_pack_range_into(&read.pack, read.start..read.end, &mut pinned.as_mut_slice()[..len])?;
                waits.reading_s += t.elapsed().as_secs_f64();
                (pinned, 0)
            }
        };
        let range = &src.as_slice()[src_at..src_at + len];
        let (base, decoded_base, meta_base) = (device.ptr(), device.ptr() + self.read_cap as u64, meta_device.ptr());
        let lanes_base = decoded_base + self.read_cap as u64;
        let meta = meta_host.as_mut_slice();
        let (mut decoded, mut frames, mut host_decoded, mut written) = (0usize, 0usize, 0usize, 0u64);
        let (mut joins, mut lanes_used, mut huffs) = (0usize, 0u64, 0usize);
        let mut fills = Vec::new();
        let mut repeats = Vec::new();
        for (k, c) in read.chunks.iter().enumerate() {
            let at = (c.loc.offset - read.start) as usize;
            let stored_len = c.loc.stored_len as usize;
            let plain = c.loc.plain_len as usize;
            let (entry, offset) = c.targets[0];
            let dst = self.buffers.address(entry, offset, plain)?;
            let mut job = CheckJob::new(base + at as u64, dst, c.loc.plain_len, first_tag + k as u32, &c.id.0);
            // A float-coded chunk decodes on the GPU when each of its lanes does there: raw
            // and Huffman lanes always, zstd lanes with nvCOMP.
            let gpu_floats = match (self.lanes, c.loc.codec) {
                (Some(_), Codec::Floats) => {
                    let stored = &range[at..at + stored_len];
                    let f = float_layout(stored, plain, &c.id).map_err(|e| in_pack(e, read))?;
                    f.lanes.iter().all(|l| l.codec != FloatLaneCodec::Zstd || self.nvcomp.is_some()).then_some(f)
                }
                _ => None,
            };
            match c.loc.codec {
                Codec::Raw => {}
                Codec::Zero => {
                    // Filled in place, then hashed there.
                    fills.push((dst, plain));
                    (job.src, job.dst) = (dst, 0);
                }
                // Deltas are decoded on the host (their bases come from the store).
                Codec::Zstd | Codec::Floats | Codec::Delta => {
                    job.src = decoded_base + decoded as u64;
                    let l = self.layout;
                    // Queues one nvCOMP frame; returns the device addresses of its decoded
                    // length and status.
                    let mut frame = |meta: &mut [u8], src: u64, len: usize, capacity: usize, out: u64| {
                        put_u64(meta, l.array(0, frames), src);
                        put_u64(meta, l.array(1, frames), len as u64);
                        put_u64(meta, l.array(2, frames), capacity as u64);
                        put_u64(meta, l.array(4, frames), out);
                        let at = (meta_base + l.array(3, frames) as u64, meta_base + l.status(frames) as u64);
                        frames += 1;
                        at
                    };
                    // nvCOMP is not trusted to stay within its output on a damaged frame:
                    // every frame it gets has its header and block headers checked here.
                    let whole =
                        |frame: &[u8], len: usize| check_zstd_frame(frame, len, &c.id).map_err(|e| in_pack(e, read));
                    if let (Some(_), Codec::Zstd) = (self.nvcomp, c.loc.codec) {
                        whole(&range[at..at + stored_len], plain)?;
                        (job.actual_len, job.status) = frame(meta, base + at as u64, stored_len, plain, job.src);
                    } else if let Some(f) = gpu_floats {
                        let stored = &range[at..at + stored_len];
                        let mut lane_job = LaneJob {
                            tail: base + (at + f.tail.start) as u64,
                            dst: job.src,
                            joined_len: meta_base + l.joined_len(joins) as u64,
                            words: f.words as u32,
                            width: f.width as u16,
                            tail_len: f.tail.len() as u16,
                            ..LaneJob::default()
                        };
                        for (i, lane) in f.lanes.iter().enumerate() {
                            let src = base + (at + lane.stored.start) as u64;
                            let out = lanes_base + lanes_used;
                            match lane.codec {
                                FloatLaneCodec::Zstd => {
                                    whole(&stored[lane.stored.clone()], f.words)?;
                                    (lane_job.lane_len[i], lane_job.lane_status[i]) =
                                        frame(meta, src, lane.stored.len(), f.words, out);
                                }
                                FloatLaneCodec::Huffman => {
                                    let h = HuffJob {
                                        src,
                                        out,
                                        words: f.words as u64,
                                        stored_len: lane.stored.len() as u32,
                                        status: 0,
                                    };
                                    let at = l.huff_job(huffs);
                                    meta[at..at + 32].copy_from_slice(h.as_bytes());
                                    let job_at = meta_base + at as u64;
                                    (lane_job.lane_len[i], lane_job.lane_status[i]) =
                                        (job_at + HuffJob::WORDS_AT, job_at + HuffJob::STATUS_AT);
                                    huffs += 1;
                                }
                                FloatLaneCodec::Raw => {
                                    lane_job.lane[i] = src;
                                    continue;
                                }
                            }
                            lane_job.lane[i] = out;
                            lanes_used += f.words as u64;
                        }
                        meta[l.lane_job(joins)..][..128].copy_from_slice(lane_job.as_bytes());
                        job.actual_len = lane_job.joined_len;
                        joins += 1;
                    } else {
                        // Decoded here without hashing; the kernel checks the bytes.
                        if decoded_area.is_none() {
                            *decoded_area = Some(src.context().alloc_pinned(self.read_cap).map_err(cuda_err)?);
                        }
                        let area = decoded_area.as_mut().expect("allocated above");
                        let stored = &range[at..at + stored_len];
                        let out = &mut area.as_mut_slice()[decoded..][..plain];
                        let n = decoder.expand_into(c.loc.codec, stored, &c.id, out).map_err(|e| in_pack(e, read))?;
                        if n != plain {
                            return Err(in_pack(
                                StoreError::corrupt(
                                    ObjectKind::Chunk,
                                    c.id.to_hex(),
                                    format!("decodes to {n} bytes, not {plain}"),
                                ),
                                read,
                            ));
                        }
                        host_decoded = decoded + plain;
                    }
                    decoded += plain;
                }
            }
            meta[self.layout.job(k)..][..80].copy_from_slice(job.as_bytes());
            for &(e, o) in &c.targets[1..] {
                repeats.push((self.buffers.address(e, o, plain)?, dst, plain));
            }
            written += (plain * c.targets.len()) as u64;
        }
        // SAFETY (the copies and fills below): this slot's pinned buffers are not written again
        // before its event (recorded last) is waited on, held bytes never are, its device buffers are its own, and
        // every destination lies in a file's buffer (checked by `address`) that no other read
        // writes.
        unsafe {
            stream.copy_to_device_async(base, src, src_at, len).map_err(cuda_err)?;
            if let (Some(area), true) = (decoded_area.as_ref(), host_decoded > 0) {
                stream.copy_to_device_async(decoded_base, area, 0, host_decoded).map_err(cuda_err)?;
            }
            stream.copy_to_device_async(meta_base, meta_host, 0, self.layout.bytes()).map_err(cuda_err)?;
            for (dst, len) in fills {
                stream.fill_async(dst, 0, len).map_err(cuda_err)?;
            }
        }
        if let (Some(nvcomp), true) = (self.nvcomp, frames > 0) {
            let l = self.layout;
            let at = |array| meta_base + l.array(array, 0) as u64;
            let batch = ZstdBatch {
                count: frames,
                compressed_ptrs: at(0),
                compressed_bytes: at(1),
                out_capacity: at(2),
                out_bytes: at(3),
                out_ptrs: at(4),
                statuses: meta_base + l.status(0) as u64,
                temp: temp.as_ref().map_or(0, |t| t.ptr()),
                temp_bytes: self.temp_bytes,
            };
            // SAFETY: every address lies in this slot's staging and metadata buffers, written
            // above and kept alive (and unreused) until the slot's event says the work is done.
            unsafe { nvcomp.zstd_decompress_async(stream, &batch) }.map_err(cuda_err)?;
        }
        if let (Some(lanes), true) = (self.lanes, huffs > 0) {
            // SAFETY: the Huffman jobs (copied above) point into this slot's staging and lane
            // areas and its metadata, alive (and unreused) until its event is waited on.
            unsafe { lanes.decode(stream, meta_base + self.layout.huff_job(0) as u64, huffs as u32) }
                .map_err(cuda_err)?;
        }
        if let (Some(lanes), true) = (self.lanes, joins > 0) {
            // SAFETY: the lane jobs (copied above) point into this slot's staging, lane and
            // decode areas and its metadata, alive (and unreused) until its event is waited on.
            unsafe { lanes.join(stream, meta_base + self.layout.lane_job(0) as u64, joins as u32) }
                .map_err(cuda_err)?;
        }
        // SAFETY: the jobs (copied above) point into this slot's buffers and into the image's
        // buffers, all alive until the load drains every stream.
        unsafe {
            self.check.launch(stream, meta_base, read.chunks.len() as u32, self.failed, self.store.chunk_ids().key())
        }
        .map_err(cuda_err)?;
        for (dst, src, len) in repeats {
            // SAFETY: `src` was placed by the kernel queued before on this stream; `dst` is
            // another place of the same chunk in a file's buffer.
            unsafe { stream.copy_on_device_async(dst, src, len) }.map_err(cuda_err)?;
        }
        done.record(stream).map_err(cuda_err)?;
        slot.in_flight = true;
        Ok(written)
    }
}

/// Adds the pack to a chunk error so the user learns which object is damaged.
fn in_pack(e: StoreError, read: &RangeRead) -> StoreError {
    crate::engine::in_pack(e, &read.pack)
}
