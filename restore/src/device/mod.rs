//! The device memory sink: restores every file of an image into its own `cuMemAlloc`'d VRAM
//! buffer. Buffers and staging are allocated while the restore is planned; then one of two
//! paths fills them:
//!
//! - [`gpu_check`] (local stores, when the driver runs gstore's kernel): packs' bytes go to
//!   the GPU as stored; nvCOMP decodes zstd there when present; a BLAKE3 kernel checks every
//!   chunk against its id before the load returns.
//! - [`host_check`] (remote stores, whose range cache only keeps ranges the host has checked,
//!   and drivers without the kernel API): the CPU decodes and hashes, pinned buffers stage the
//!   verified bytes.

mod gpu_check;
mod held;
mod host_check;
mod spread;

pub use held::{bind_hold_socket, load_held, Holder};
pub use spread::{parts, restore_to_devices, Spread};

use crate::budget::Budget;
use crate::engine::Buffers;
use crate::plan::{self, Plan, RangeRead, ZeroRange};
use gstore_gpu_dump::cuda::{Context, DeviceBuffer, HostMemory};
use gstore_gpu_dump::GpuDumpError;
use gstore_store::format::manifest::{EntryKind, Manifest};
use gstore_store::progress::Progress;
use gstore_store::ObjectKind;
use gstore_store::{ChunkIds, IndexedStore, Result, Store, StoreError};
use std::collections::VecDeque;
use std::sync::{mpsc, Arc, Condvar, Mutex};

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
    /// Seconds the planner took (index lookups), alongside allocation and the first transfers.
    pub plan_s: f64,
    /// Seconds the device buffers and staging took to allocate and the check kernel to load
    /// (waiting for the CUDA context included), while the planner ran or before it, while
    /// the store's index opened ([`restore_prepared`]).
    pub alloc_s: f64,
    /// Seconds from then (from the planner's start, for a load prepared before) until every
    /// byte was checked in place.
    pub transfer_s: f64,
    /// Where chunks were checked and decoded, and why there.
    pub path: String,
    /// Where the transfer's workers spent their time (GPU-checked loads; zero otherwise).
    pub waits: TransferWaits,
}

/// Where a GPU-checked load's workers spent the transfer phase: seconds per worker, averaged
/// over the workers.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct TransferWaits {
    /// Reading stored bytes from the store into pinned staging.
    pub reading_s: f64,
    /// Waiting for a pinned staging slot's previous read to be copied to the device.
    pub copy_s: f64,
    /// Waiting for the planner to send the next read.
    pub planner_s: f64,
    /// Building a read's jobs on the host (chunk layouts, decodes the GPU cannot do).
    pub building_s: f64,
    /// In the driver, queueing a read's copies and kernels.
    pub launching_s: f64,
}

impl TransferWaits {
    /// The workers' mean.
    fn mean(each: &[TransferWaits]) -> TransferWaits {
        let n = each.len().max(1) as f64;
        let sum = |f: fn(&TransferWaits) -> f64| each.iter().map(f).sum::<f64>() / n;
        TransferWaits {
            reading_s: sum(|w| w.reading_s),
            copy_s: sum(|w| w.copy_s),
            planner_s: sum(|w| w.planner_s),
            building_s: sum(|w| w.building_s),
            launching_s: sum(|w| w.launching_s),
        }
    }
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

    /// Copies every buffer back to the host and checks each chunk's id (named by `ids`)
    /// against the entry of the same path in `m`: an end-to-end check of what landed in VRAM,
    /// independent of how the load checked it.
    pub fn read_back_and_check(&self, m: &Manifest, ids: &ChunkIds) -> Result<()> {
        let chunks: std::collections::HashMap<&str, &[gstore_store::format::manifest::ChunkRef]> =
            m.files().map(|(e, c)| (e.path.as_str(), c)).collect();
        for dev in &self.entries {
            let wrong = |detail: String| StoreError::corrupt(ObjectKind::DeviceBuffer, dev.path.clone(), detail);
            let list = chunks.get(dev.path.as_str()).ok_or_else(|| wrong("not in the image".into()))?;
            let mut host = vec![0u8; dev.buffer.len()];
            dev.buffer.context().copy_to_host(&mut host, dev.buffer.ptr()).map_err(StoreError::device)?;
            let mut off = 0usize;
            for c in *list {
                let bytes = host
                    .get(off..off + c.len as usize)
                    .ok_or_else(|| wrong(format!("shorter than its chunks ({} bytes)", host.len())))?;
                if ids.id(bytes) != c.id {
                    return Err(wrong(format!("bytes at {off} in VRAM do not match chunk {}", c.id.short())));
                }
                off += c.len as usize;
            }
            if off != host.len() {
                return Err(wrong(format!("{} bytes in VRAM, the image has {off}", host.len())));
            }
        }
        Ok(())
    }
}

/// A pool of staging slots shared by the restore's worker threads, taken oldest first: the
/// slot given back longest ago is the likeliest to have finished its work on the GPU.
struct Pool<T> {
    free: Mutex<VecDeque<T>>,
    available: Condvar,
}

impl<T> Pool<T> {
    fn new(items: Vec<T>) -> Pool<T> {
        Pool { free: Mutex::new(items.into()), available: Condvar::new() }
    }

    /// Takes a slot, waiting for one to come back when all are taken.
    fn take(&self) -> T {
        let mut free = self.free.lock().expect("pool lock");
        loop {
            if let Some(s) = free.pop_front() {
                return s;
            }
            free = self.available.wait(free).expect("pool lock");
        }
    }

    fn give(&self, item: T) {
        self.free.lock().expect("pool lock").push_back(item);
        self.available.notify_one();
    }

    fn into_inner(self) -> Vec<T> {
        self.free.into_inner().expect("pool lock").into()
    }
}

/// Where a read's stored bytes already are: a held image's pinned buffer and offset.
#[derive(Clone, Copy)]
struct HeldAt {
    buffer: usize,
    offset: usize,
}

/// A range read to load, and where its bytes are held (`None`: read them from the store).
struct PlannedRead {
    read: Arc<RangeRead>,
    held: Option<HeldAt>,
}

/// A plan as it arrives: range reads sent by the planner while it looks chunks up, and what
/// the manifest alone says.
struct Planned {
    reads: mpsc::Receiver<PlannedRead>,
    zeros: Vec<ZeroRange>,
    /// Plain bytes to place (zero runs excluded).
    total: u64,
}

/// Why a load checks its chunks on the host rather than on the GPU.
#[derive(Debug, thiserror::Error)]
enum HostChecks {
    /// The check kernel did not load on this GPU.
    #[error("the GPU check kernel is unavailable: {0}")]
    NoCheckKernel(GpuDumpError),
    /// The store is remote: its range cache keeps only ranges the host has checked.
    #[error("a remote store's range cache keeps only ranges the host has checked")]
    RemoteStore,
}

/// How the chunks will be checked: prepared alongside the plan.
enum Checker {
    Gpu(gpu_check::GpuLoad),
    Host(host_check::Ring, HostChecks),
}

/// Distinct chunks looked up per planning batch: the first reads start loading after one
/// batch, not after the whole image is planned.
const PLAN_BATCH: usize = 8192;

/// Reads whose ranges a local store is asked to read ahead of the workers (see
/// [`read_ahead`]): 128 device reads are 384 MiB asked of a cold disk ahead of the workers. On
/// the H200 machine's disk an 8 GiB cold load took 3.64 s with 128, 3.91 s with 64 and 3.93 s
/// with 32 (docs/BENCHMARKS.md, issue #62); a warm load reads nothing ahead either way.
const READ_AHEAD: usize = 128;

/// Passes the reads `planned` sends on to the workers, each once a local `store` has been
/// told it will be read: the kernel reads up to [`READ_AHEAD`] reads ahead of the workers
/// from a cold disk, in the order they will be read.
fn read_ahead(store: &IndexedStore, planned: mpsc::Receiver<PlannedRead>, to: mpsc::SyncSender<PlannedRead>) {
    for p in planned {
        store.will_read_pack_range(&p.read.pack, p.read.start..p.read.end);
        if to.send(p).is_err() {
            return; // the load stopped
        }
    }
}

/// Restores every file of `m` into VRAM on `ctx`'s device, staging through at most a quarter
/// (host checks) or half (GPU checks, which hold no decoded copies on the host) of
/// `budget` in pinned memory.
pub fn restore_to_device(
    store: &IndexedStore,
    m: &Manifest,
    ctx: &Context,
    budget: Budget,
    progress: &dyn Progress,
) -> Result<DeviceImage> {
    restore_to_device_with(store, m, || Ok(ctx.clone()), budget, progress)
}

/// [`restore_to_device`] onto the context `open_context` gives, which is called once the
/// planner is under way: a caller still starting CUDA (`cuInit` and the primary context take
/// a few hundred milliseconds) passes a function that waits for it, and the index lookups run
/// meanwhile.
pub fn restore_to_device_with(
    store: &IndexedStore,
    m: &Manifest,
    open_context: impl FnOnce() -> Result<Context>,
    budget: Budget,
    progress: &dyn Progress,
) -> Result<DeviceImage> {
    restore_to_device_needing(store, m, None, open_context, budget, progress)
}

/// [`restore_to_device_with`], given what `m` needs (`plan::Needs::of(m)`) where the caller
/// worked it out already, e.g. while the store's index opened.
pub fn restore_to_device_needing(
    store: &IndexedStore,
    m: &Manifest,
    needs: Option<plan::Needs>,
    open_context: impl FnOnce() -> Result<Context>,
    budget: Budget,
    progress: &dyn Progress,
) -> Result<DeviceImage> {
    std::thread::scope(|s| {
        // The staging's host memory is mapped while the CUDA context comes up (a caller still
        // starting CUDA passes a function that waits for it), so that CUDA then only locks it.
        let staging = s.spawn(|| Staging::map(store, budget));
        let prepare = || PreparedLoad::prepare(store, m, open_context, || joined(staging));
        load_planned(store, m, needs, device_read_cap(store, budget), prepare, progress)
    })
}

/// What the thread `handle` gave (its panic goes on).
fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// [`restore_to_device_needing`] with the device side of the load `device` gives
/// ([`PreparedDevice::prepare`], e.g. on a thread started before the manifest was read): the
/// planner starts at once, the files' VRAM is allocated meanwhile, and the transfer starts
/// with the first reads. `budget` must be the one the device side's staging was mapped for.
pub fn restore_prepared(
    store: &IndexedStore,
    m: &Manifest,
    needs: Option<plan::Needs>,
    device: impl FnOnce() -> Result<PreparedDevice>,
    budget: Budget,
    progress: &dyn Progress,
) -> Result<DeviceImage> {
    load_planned(store, m, needs, device_read_cap(store, budget), || device()?.with_files(m), progress)
}

/// The largest range read of a device load from `store`: remote stores check on the host, in
/// the engine's reads; local ones on the GPU.
fn device_read_cap(store: &Store, budget: Budget) -> u64 {
    if store.is_remote() {
        budget.max_read()
    } else {
        budget.device_read(u64::from(store.config().chunk_max))
    }
}

/// The host memory of a device load's pinned staging, mapped and faulted in (CPU work, done
/// before or while CUDA comes up, which then only locks it): a slot per range read in flight.
pub struct Staging {
    slots: Vec<HostMemory>,
    /// The largest range read of the load ([`device_read_cap`]).
    max_read: u64,
    /// Slots of a load whose chunks are checked on the host (when the kernel does not load
    /// here, those not mapped yet are mapped then).
    host_slots: u64,
}

impl Staging {
    /// Maps the staging of a load from `store` within `budget` ([`restore_to_device`] says
    /// how much), each slot faulted in on a thread of its own.
    pub fn map(store: &Store, budget: Budget) -> Result<Staging> {
        let max_read = device_read_cap(store, budget);
        let slots = budget.staging_slots(!store.is_remote(), max_read) as usize;
        let len = gpu_check::staging_len(max_read as usize);
        let slots = std::thread::scope(|m| {
            let made: Vec<_> =
                (0..slots).map(|_| m.spawn(move || HostMemory::map(len).map_err(StoreError::device))).collect();
            made.into_iter().map(joined).collect::<Result<Vec<_>>>()
        })?;
        Ok(Staging { slots, max_read, host_slots: budget.staging_slots(false, max_read) })
    }
}

/// What a device load needs before its image's manifest is read: the CUDA context, the
/// staging mapped and pinned, and how chunks will be checked (the load kernel loaded).
pub struct PreparedDevice {
    ctx: Context,
    checker: Checker,
    /// When its preparation started.
    started: std::time::Instant,
}

impl PreparedDevice {
    /// Prepares loads from `store` on `ctx`'s device through the staging `staging` gives
    /// ([`Staging::map`], e.g. on another thread, started earlier).
    pub fn prepare(store: &Store, ctx: Context, staging: impl FnOnce() -> Result<Staging>) -> Result<PreparedDevice> {
        let started = std::time::Instant::now();
        let Staging { slots: mut staging, max_read, host_slots } = staging()?;
        // A remote store's slots are sized for host checks (`Staging::map`).
        let gpu = if store.is_remote() {
            Err(HostChecks::RemoteStore)
        } else {
            gpu_check::GpuLoad::prepare(&ctx, &mut staging, max_read as usize, store.config().chunk_max as usize)?
                .map_err(HostChecks::NoCheckKernel)
        };
        let checker = match gpu {
            Ok(g) => Checker::Gpu(g),
            Err(why) => Checker::Host(host_check::Ring::allocate(&ctx, staging, host_slots, max_read as usize)?, why),
        };
        Ok(PreparedDevice { ctx, checker, started })
    }

    /// The load of `m` made ready: VRAM for every file allocated. Fails before any is
    /// allocated when the device has no room for the image.
    fn with_files(self, m: &Manifest) -> Result<PreparedLoad> {
        let (owned, buffers) = allocate_files(&self.ctx, m)?;
        let alloc_s = self.started.elapsed().as_secs_f64();
        Ok(PreparedLoad { owned, buffers, checker: self.checker, alloc_s })
    }
}

/// A device load made ready before (or while) it is planned: VRAM for every file, the staging
/// mapped and pinned, and how chunks will be checked.
struct PreparedLoad {
    owned: Vec<(String, DeviceBuffer)>,
    buffers: Buffers,
    checker: Checker,
    /// Seconds it took, waiting for the CUDA context and the staging included.
    alloc_s: f64,
}

impl PreparedLoad {
    /// Prepares a load of `m` from `store` onto the context `open_context` gives, through the
    /// staging `staging` gives: the files' VRAM is allocated while the kernel loads and the
    /// staging is pinned. Fails before any file's VRAM is allocated when the device has no
    /// room for the image.
    fn prepare(
        store: &Store,
        m: &Manifest,
        open_context: impl FnOnce() -> Result<Context>,
        staging: impl FnOnce() -> Result<Staging>,
    ) -> Result<PreparedLoad> {
        let t = std::time::Instant::now();
        let ctx = open_context()?;
        let (files, device) = std::thread::scope(|s| {
            let files = s.spawn(|| allocate_files(&ctx, m));
            let device = PreparedDevice::prepare(store, ctx.clone(), staging);
            (joined(files), device)
        });
        let (owned, buffers) = files?;
        Ok(PreparedLoad { owned, buffers, checker: device?.checker, alloc_s: t.elapsed().as_secs_f64() })
    }
}

/// Plans the load of `m` from `store` in reads of up to `max_read` bytes, on a thread of its
/// own, while `prepare` makes the load ready (or gives the load made ready before); then
/// loads each read as it arrives.
fn load_planned(
    store: &IndexedStore,
    m: &Manifest,
    needs: Option<plan::Needs>,
    max_read: u64,
    prepare: impl FnOnce() -> Result<PreparedLoad>,
    progress: &dyn Progress,
) -> Result<DeviceImage> {
    let t = std::time::Instant::now();
    let threads = rayon::current_num_threads().max(2) as u64;
    let (sender, planned) = mpsc::channel();
    // What the manifest needs (tens of milliseconds for a large model) is worked out on the
    // planner's thread, alongside the preparation; its zero runs come back from there.
    let (zeros_sender, zeros_from_planner) = mpsc::sync_channel(1);
    // The planner looks chunks up batch by batch while the load is made ready; the GPU path
    // then loads each read as it arrives.
    std::thread::scope(|s| {
        // A local store's reads go through the read-ahead on their way to the workers.
        let reads = if store.is_remote() {
            planned
        } else {
            let (to, reads) = mpsc::sync_channel(READ_AHEAD);
            s.spawn(move || read_ahead(store, planned, to));
            reads
        };
        let planner = s.spawn(move || {
            let t = std::time::Instant::now();
            let needs = needs.unwrap_or_else(|| plan::Needs::of(m));
            let _ = zeros_sender.send(needs.zeros.clone());
            needs.plan_batches(store, m, max_read, PLAN_BATCH, |batch| {
                for read in batch {
                    sender
                        .send(PlannedRead { read: Arc::new(read), held: None })
                        .map_err(|_| StoreError::Internal("the load stopped before its plan".into()))?;
                }
                Ok(())
            })?;
            Ok::<f64, StoreError>(t.elapsed().as_secs_f64())
        });
        let prepared = prepare();
        let ready = t.elapsed().as_secs_f64();
        let alloc_s = prepared.as_ref().map_or(ready, |p| p.alloc_s);
        let loaded = prepared.and_then(|PreparedLoad { owned, buffers, checker, .. }| {
            let zeros: Vec<ZeroRange> = zeros_from_planner
                .recv()
                .map_err(|_| StoreError::Internal("the planner stopped before it read the manifest".into()))?;
            let total = m.files().map(|(e, _)| e.size).sum::<u64>() - zeros.iter().map(|z| z.len).sum::<u64>();
            let planned = Planned { reads, zeros, total };
            let (path, waits) = checker.run(store, planned, buffers, threads as usize, progress)?;
            Ok((owned, path, waits))
        });
        // A load error comes first (the planner then only saw the load stop); a plan that
        // failed fails the load even though every read it did send was loaded.
        let planned = planner.join().expect("the planner does not panic");
        let ((owned, path, waits), plan_s) = match (loaded, planned) {
            (Ok(done), Ok(plan_s)) => (done, plan_s),
            (Err(e), _) | (Ok(_), Err(e)) => return Err(e),
        };
        let entries = owned.into_iter().map(|(path, buffer)| DeviceEntry { path, buffer }).collect();
        Ok(DeviceImage { entries, plan_s, alloc_s, transfer_s: t.elapsed().as_secs_f64() - ready, path, waits })
    })
}

impl Checker {
    /// Loads the reads `planned` sends into `buffers` with `workers` threads; returns where
    /// chunks were checked and decoded (for reports) and where the workers waited.
    fn run(
        self,
        store: &IndexedStore,
        planned: Planned,
        buffers: Buffers,
        workers: usize,
        progress: &dyn Progress,
    ) -> Result<(String, TransferWaits)> {
        match self {
            Checker::Gpu(mut g) => {
                let path = g.describe();
                Ok((path, g.run(store, store, planned, &[], &buffers, gpu_check::readers(workers), progress)?))
            }
            Checker::Host(ring, why) => {
                let Planned { reads, zeros, .. } = planned;
                let plan = Plan { reads: reads.iter().map(|p| Arc::unwrap_or_clone(p.read)).collect(), zeros };
                ring.run(store, &plan, buffers, progress)?;
                Ok((format!("chunks checked and decoded on the host ({why})"), TransferWaits::default()))
            }
        }
    }
}

/// Allocates a VRAM buffer on `ctx`'s device for every file of `m`, after checking the device
/// has room for all of them; each may be shared with another process
/// ([`DeviceBuffer::ipc_handle`]), which maps it at once.
fn allocate_files(ctx: &Context, m: &Manifest) -> Result<(Vec<(String, DeviceBuffer)>, Buffers)> {
    check_room(ctx, m.files().filter(|(e, _)| e.kind == EntryKind::File).map(|(e, _)| e.size).sum())?;
    Buffers::allocate(m, |e| {
        let buffer = ctx.alloc_shareable(e.size as usize).map_err(StoreError::device)?;
        let (base, len) = (buffer.ptr(), buffer.len());
        Ok((buffer, base, len))
    })
}

/// Fails, before anything is allocated, when `ctx`'s device has less than `image_bytes` free.
fn check_room(ctx: &Context, image_bytes: u64) -> Result<()> {
    let (free, _) = ctx.mem_info().map_err(StoreError::device)?;
    if image_bytes > free {
        return Err(StoreError::device(GpuDumpError::DeviceFull { device: ctx.device(), needed: image_bytes, free }));
    }
    Ok(())
}
