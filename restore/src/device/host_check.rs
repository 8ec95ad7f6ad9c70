//! Loads that check chunks on the host: the engine decodes and hashes every chunk on the CPU
//! and the sink copies the verified bytes into a ring of pinned buffers, each copied to VRAM
//! on its own stream, so the CPU work of one batch overlaps with the DMA of earlier ones.

use super::Pool;
use crate::engine::{self, Buffers, Piece, Sink};
use crate::plan::Plan;
use gstore_gpu_dump::cuda::{Context, Event, HostMemory, PinnedBuffer, Stream};
use gstore_store::progress::Progress;
use gstore_store::{IndexedStore, Result, StoreError};

/// A pinned staging buffer with the stream that copies it and the event marking that copy.
struct Slot {
    pinned: PinnedBuffer,
    stream: Stream,
    done: Event,
    in_flight: bool,
}

/// The ring of staging slots.
pub(super) struct Ring(Pool<Slot>);

impl Ring {
    /// Makes `slots` pinned buffers of `bytes` each, with their streams and events: the
    /// mappings of `staging` registered first (extra ones unmapped), more mapped if it is short.
    pub(super) fn allocate(ctx: &Context, staging: Vec<HostMemory>, slots: u64, bytes: usize) -> Result<Ring> {
        let mut staging = staging.into_iter();
        let mut ring = Vec::new();
        for _ in 0..slots {
            let memory = match staging.next() {
                Some(m) => m,
                None => HostMemory::map(bytes).map_err(StoreError::device)?,
            };
            ring.push(Slot {
                pinned: ctx.register(memory).map_err(StoreError::device)?,
                stream: ctx.stream().map_err(StoreError::device)?,
                done: ctx.event().map_err(StoreError::device)?,
                in_flight: false,
            });
        }
        Ok(Ring(Pool::new(ring)))
    }

    /// Runs `plan` into `buffers`, then waits for every copy.
    pub(super) fn run(
        self,
        store: &IndexedStore,
        plan: &Plan,
        buffers: Buffers,
        progress: &dyn Progress,
    ) -> Result<()> {
        let sink = DeviceSink { buffers, ring: &self.0 };
        let r = sink.zero(plan).and_then(|()| engine::run(store, plan, &sink, progress));
        // Every queued copy finishes before its staging buffer can be freed.
        let mut drained = Ok(());
        for slot in self.0.into_inner() {
            if slot.in_flight {
                drained = drained.and(slot.done.synchronize().map_err(StoreError::device));
            }
        }
        r.and(drained)
    }
}

struct DeviceSink<'a> {
    buffers: Buffers,
    ring: &'a Pool<Slot>,
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
            slot.done.synchronize().map_err(StoreError::device)?;
            slot.in_flight = false;
        }
        let total: usize = pieces.iter().map(|p| p.data.len()).sum();
        if total > slot.pinned.len() {
            return Err(StoreError::Internal(format!(
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
                    // SAFETY: the slot is not written again before its event (recorded below) is
                    // waited on; `d` lies in a file's buffer (checked by `address`).
                    unsafe { slot.stream.copy_to_device_async(d, &slot.pinned, s, l) }.map_err(StoreError::device)?;
                    Some((dst, at, p.data.len()))
                }
                None => Some((dst, at, p.data.len())),
            };
            at += p.data.len();
        }
        if let Some((d, s, l)) = run {
            // SAFETY: as above.
            unsafe { slot.stream.copy_to_device_async(d, &slot.pinned, s, l) }.map_err(StoreError::device)?;
        }
        slot.done.record(&slot.stream).map_err(StoreError::device)?;
        slot.in_flight = true;
        Ok(())
    }

    /// Zero-fills the plan's zero runs (device memory does not start zeroed), copying from a
    /// zeroed staging buffer: this path serves drivers without the kernel API's memset.
    fn zero(&self, plan: &Plan) -> Result<()> {
        let mut slot = self.ring.take();
        let r = (|| {
            if slot.in_flight {
                slot.done.synchronize().map_err(StoreError::device)?;
            }
            slot.pinned.as_mut_slice().fill(0);
            let step = slot.pinned.len() as u64;
            for z in &plan.zeros {
                let base = self.buffers.address(z.entry, z.offset, z.len as usize)?;
                let mut off = 0;
                while off < z.len {
                    let n = step.min(z.len - off);
                    // SAFETY: the zeroed slot is not written before its event is waited on; the
                    // range lies in a file's buffer (checked by `address`).
                    unsafe { slot.stream.copy_to_device_async(base + off, &slot.pinned, 0, n as usize) }
                        .map_err(StoreError::device)?;
                    off += n;
                }
            }
            slot.done.record(&slot.stream).map_err(StoreError::device)?;
            slot.in_flight = true;
            Ok(())
        })();
        self.ring.give(slot);
        r
    }
}
