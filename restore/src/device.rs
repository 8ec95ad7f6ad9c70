//! The device memory sink: restores every file of an image into its own `cuMemAlloc`'d VRAM
//! buffer, staging through a ring of pinned host buffers copied on several streams, so chunk
//! decoding on the CPU overlaps with the DMA of earlier batches. The device buffers and the
//! ring are allocated while the restore is planned.

use crate::engine::{self, Buffers, Piece, Sink};
use crate::plan::{self, Plan};
use gstore_gpu_dump::cuda::{Context, DeviceBuffer, Event, PinnedBuffer, Stream};
use gstore_store::manifest::Manifest;
use gstore_store::progress::Progress;
use gstore_store::{Result, Store, StoreError};
use std::sync::{Condvar, Mutex};

/// One restored file in device memory.
pub struct DeviceEntry {
    /// The entry's path in the image.
    pub path: String,
    /// Its bytes in VRAM.
    pub buffer: DeviceBuffer,
}

/// Every file of an image, restored into device memory, in manifest order.
pub struct DeviceImage {
    /// The files.
    pub entries: Vec<DeviceEntry>,
    /// Seconds spent planning (index lookups).
    pub plan_s: f64,
    /// Seconds spent allocating device buffers and the pinned staging ring, alongside the
    /// planning.
    pub alloc_s: f64,
    /// Seconds spent fetching, verifying, decoding and copying, once both were done.
    pub transfer_s: f64,
}

impl DeviceImage {
    /// Total bytes held.
    pub fn len(&self) -> u64 {
        self.entries.iter().map(|e| e.buffer.len() as u64).sum()
    }

    /// True when the image has no file bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A pinned staging buffer with the stream that copies it and the event marking that copy.
struct Slot {
    pinned: PinnedBuffer,
    stream: Stream,
    done: Event,
    in_flight: bool,
}

/// A pool of slots shared by the restore's worker threads.
struct Ring {
    free: Mutex<Vec<Slot>>,
    available: Condvar,
}

impl Ring {
    fn take(&self) -> Slot {
        let mut free = self.free.lock().expect("ring lock");
        loop {
            if let Some(s) = free.pop() {
                return s;
            }
            free = self.available.wait(free).expect("ring lock");
        }
    }

    fn give(&self, slot: Slot) {
        self.free.lock().expect("ring lock").push(slot);
        self.available.notify_one();
    }
}

struct DeviceSink<'a> {
    buffers: Buffers,
    ring: &'a Ring,
}

fn cuda_err(e: gstore_gpu_dump::GpuDumpError) -> StoreError {
    StoreError::Device(e.to_string())
}

impl Sink for DeviceSink<'_> {
    fn write_batch(&self, pieces: &[Piece<'_>]) -> Result<()> {
        let mut slot = self.ring.take();
        let r = self.stage(&mut slot, pieces);
        self.ring.give(slot);
        r
    }
}

impl DeviceSink<'_> {
    /// Copies `pieces` into the slot's pinned buffer (after its previous copy finished) and
    /// queues one async copy per run of contiguous destination bytes.
    fn stage(&self, slot: &mut Slot, pieces: &[Piece<'_>]) -> Result<()> {
        if slot.in_flight {
            slot.done.synchronize().map_err(cuda_err)?;
            slot.in_flight = false;
        }
        let total: usize = pieces.iter().map(|p| p.data.len()).sum();
        if total > slot.pinned.len() {
            return Err(StoreError::Invalid(format!(
                "a batch of {total} bytes exceeds the {}-byte staging buffer",
                slot.pinned.len()
            )));
        }
        let mut at = 0;
        // (device address, staging offset, length) of the copy being assembled
        let mut run: Option<(u64, usize, usize)> = None;
        for p in pieces {
            let dst = self.buffers.address(p.entry, p.offset, p.data.len())?;
            slot.pinned.as_mut_slice()[at..at + p.data.len()].copy_from_slice(p.data);
            run = match run {
                Some((d, s, l)) if d + l as u64 == dst && s + l == at => Some((d, s, l + p.data.len())),
                Some((d, s, l)) => {
                    slot.stream.copy_to_device_async(d, &slot.pinned, s, l).map_err(cuda_err)?;
                    Some((dst, at, p.data.len()))
                }
                None => Some((dst, at, p.data.len())),
            };
            at += p.data.len();
        }
        if let Some((d, s, l)) = run {
            slot.stream.copy_to_device_async(d, &slot.pinned, s, l).map_err(cuda_err)?;
        }
        slot.done.record(&slot.stream).map_err(cuda_err)?;
        slot.in_flight = true;
        Ok(())
    }

    /// Zero-fills the plan's zero runs (device memory does not start zeroed).
    fn zero(&self, plan: &Plan) -> Result<()> {
        let mut slot = self.ring.take();
        let r = (|| {
            if slot.in_flight {
                slot.done.synchronize().map_err(cuda_err)?;
            }
            slot.pinned.as_mut_slice().fill(0);
            let step = slot.pinned.len() as u64;
            for z in &plan.zeros {
                let base = self.buffers.address(z.entry, z.offset, z.len as usize)?;
                let mut off = 0;
                while off < z.len {
                    let n = step.min(z.len - off);
                    slot.stream.copy_to_device_async(base + off, &slot.pinned, 0, n as usize).map_err(cuda_err)?;
                    off += n;
                }
            }
            slot.done.record(&slot.stream).map_err(cuda_err)?;
            slot.in_flight = true;
            Ok(())
        })();
        self.ring.give(slot);
        r
    }
}

/// Restores every file of `m` into VRAM on `ctx`'s device. The pinned staging ring takes a
/// quarter of `memory_budget`.
pub fn restore_to_device(
    store: &Store,
    m: &Manifest,
    ctx: &Context,
    memory_budget: u64,
    progress: &dyn Progress,
) -> Result<DeviceImage> {
    let t = std::time::Instant::now();
    let max_read = engine::max_read_for(memory_budget);
    let slots = ((memory_budget / 4) / max_read).clamp(2, 2 * rayon::current_num_threads().max(2) as u64);
    // The device buffers and the ring are allocated while the restore is planned.
    let (plan, allocated) = std::thread::scope(|s| {
        let alloc = s.spawn(|| {
            let t = std::time::Instant::now();
            let (owned, buffers) = Buffers::allocate(m, |e| {
                let buffer = ctx.alloc(e.size as usize).map_err(cuda_err)?;
                let (base, len) = (buffer.ptr(), buffer.len());
                Ok((buffer, base, len))
            })?;
            let mut ring = Vec::new();
            for _ in 0..slots {
                ring.push(Slot {
                    pinned: ctx.alloc_pinned(max_read as usize).map_err(cuda_err)?,
                    stream: ctx.stream().map_err(cuda_err)?,
                    done: ctx.event().map_err(cuda_err)?,
                    in_flight: false,
                });
            }
            Ok::<_, StoreError>((owned, buffers, ring, t.elapsed().as_secs_f64()))
        });
        let t = std::time::Instant::now();
        let plan = plan::plan(store, m, max_read).map(|p| (p, t.elapsed().as_secs_f64()));
        (plan, alloc.join().expect("allocation does not panic"))
    });
    let (owned, buffers, ring, alloc_s) = allocated?;
    let (plan, plan_s) = plan?;
    let entries = owned.into_iter().map(|(path, buffer)| DeviceEntry { path, buffer }).collect();
    let ring = Ring { free: Mutex::new(ring), available: Condvar::new() };
    let sink = DeviceSink { buffers, ring: &ring };
    let setup_s = t.elapsed().as_secs_f64();
    sink.zero(&plan)?;
    engine::run(store, &plan, &sink, progress)?;
    for slot in ring.free.into_inner().expect("ring lock") {
        if slot.in_flight {
            slot.done.synchronize().map_err(cuda_err)?;
        }
    }
    Ok(DeviceImage { entries, plan_s, alloc_s, transfer_s: t.elapsed().as_secs_f64() - setup_s })
}
