//! Images held in pinned host memory by a long-lived process (`gstore hold`), loaded from
//! there into other processes' GPU memory. The loading process allocates its files' buffers
//! and sends their CUDA IPC handles over a Unix socket; the holder copies the held pack
//! ranges, as stored, to the GPU and decodes and checks every chunk there (the GPU-checked
//! path) straight into those buffers. No file is read and no byte is copied on the host: a
//! load runs at what the DMA engines and the check kernels allow, and every chunk is still
//! checked against its id before the loader hears that the load succeeded.
//!
//! The protocol: one load per connection, each message one JSON object on one line.
//! 1. Loader: `{"image": REF}` (a name the holder was started with, or 8 or more hex digits
//!    of an image id). Holder: `{"image": ID, "files": [{"path": P, "len": N}, ...]}`, or
//!    `{"error": TEXT}`.
//! 2. Loader: `{"device": ORDINAL, "handles": [HEX, ...]}`, one 128-hex-digit
//!    `cuIpcMemHandle` per file in that order (an empty file's is all zeros). Holder, once every
//!    chunk is checked in place or the load failed: `{"bytes": N, "path": TEXT}`, or
//!    `{"error": TEXT}`.

use super::gpu_check::{staging_len, GpuLoad};
use super::{check_room, DeviceEntry, DeviceImage, HeldAt, Planned, PlannedRead, TransferWaits, PLAN_BATCH};
use crate::budget::Budget;
use crate::engine::Buffers;
use crate::plan::{self, RangeRead, ZeroRange};
use gstore_gpu_dump::cuda::{Context, HostMemory, IpcBuffer, IpcHandle, PinnedBuffer};
use gstore_store::codec::KnownBases;
use gstore_store::format::manifest::Manifest;
use gstore_store::progress::{Progress, Silent, Unit};
use gstore_store::ObjectKind;
use gstore_store::{IndexedStore, ObjectId, Result, Store, StoreError};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{mpsc, Arc};

/// How long the holder waits for a loader's next message.
const LOADER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Pinned memory is taken in pieces of this size (the last one of an image smaller).
const PIECE: usize = 1 << 30;

/// One image held: its reads, each with where its bytes are.
struct HeldImage {
    name: String,
    id: ObjectId,
    manifest: Manifest,
    reads: Vec<(Arc<RangeRead>, HeldAt)>,
    zeros: Vec<ZeroRange>,
    /// Plain bytes the reads place.
    total: u64,
}

/// Holds images in pinned host memory and serves loads of them into other processes' GPU
/// memory ([`load_held`] there).
pub struct Holder {
    ctx: Context,
    load: GpuLoad,
    read_cap: usize,
    workers: usize,
    images: Vec<HeldImage>,
    memory: Vec<PinnedBuffer>,
    /// The plain bases of the held images' delta chunks, read while the index was open.
    bases: KnownBases,
}

impl Holder {
    /// Prepares loads on `ctx`'s device, in range reads sized for `memory_budget`, of chunks
    /// of at most `chunk_max` bytes: the check and decode kernels, and a staging slot (device
    /// memory for three reads) per worker. Fails when this GPU cannot check chunks itself.
    pub fn new(ctx: &Context, budget: Budget, chunk_max: usize) -> Result<Holder> {
        let read_cap = budget.max_read() as usize;
        let workers = rayon::current_num_threads().max(2);
        let mut staging: Vec<HostMemory> = (0..workers + 4)
            .map(|_| HostMemory::map(staging_len(0)).map_err(StoreError::device))
            .collect::<Result<_>>()?;
        let load = GpuLoad::prepare(ctx, &mut staging, read_cap, chunk_max)?.map_err(|e| {
            StoreError::device(e).stopped(
                "gstore hold checks every chunk on the GPU and cannot start",
                "it needs a GPU whose driver loads gstore's check kernel",
            )
        })?;
        Ok(Holder {
            ctx: ctx.clone(),
            load,
            read_cap,
            workers,
            images: Vec::new(),
            memory: Vec::new(),
            bases: KnownBases::default(),
        })
    }

    /// Where chunks are checked and decoded, for reports.
    pub fn describe(&self) -> String {
        self.load.describe()
    }

    /// Bytes of pinned host memory held.
    pub fn pinned_bytes(&self) -> u64 {
        self.memory.iter().map(|m| m.len() as u64).sum()
    }

    /// Plain bytes of the delta bases held in host memory for the held images' delta chunks.
    pub fn base_bytes(&self) -> u64 {
        self.bases.bytes()
    }

    /// Plain bytes of the held images' files.
    pub fn image_bytes(&self) -> u64 {
        self.images.iter().map(|i| i.manifest.files().map(|(e, _)| e.size).sum::<u64>()).sum()
    }

    /// Plans every image of `images` (name, id, manifest) in `store` (opened with its index)
    /// and reads every range its loads need, as stored, into pinned host memory, reporting
    /// stored bytes to `progress`. The bytes are checked on the GPU at each load, not here.
    pub fn hold(
        &mut self,
        store: &IndexedStore,
        images: Vec<(String, ObjectId, Manifest)>,
        progress: &dyn Progress,
    ) -> Result<()> {
        let read_cap = self.read_cap as u64;
        let first_piece = self.memory.len();
        // Each read gets a place in a piece of pinned memory, in order, as it is planned.
        let mut sizes: Vec<usize> = Vec::new();
        let mut held = Vec::with_capacity(images.len());
        for (name, id, manifest) in images {
            let needs = plan::Needs::of(&manifest);
            let zeros = needs.zeros.clone();
            let mut reads = Vec::new();
            needs.plan_batches(store, &manifest, read_cap, PLAN_BATCH, |batch| {
                reads.extend(batch);
                Ok(())
            })?;
            let total = reads.iter().map(RangeRead::plain_bytes).sum();
            let reads = reads
                .into_iter()
                .map(|r| {
                    let at = place(&mut sizes, first_piece, (r.end - r.start) as usize);
                    (Arc::new(r), at)
                })
                .collect();
            held.push(HeldImage { name, id, manifest, reads, zeros, total });
        }
        // Delta chunks decode on the host at each load, against bases read now: loads run
        // without the index.
        let bases = held.iter().flat_map(|i| &i.reads).flat_map(|(r, _)| r.chunks.iter().filter_map(|c| c.loc.bases));
        let bases = store.known_bases(bases)?;
        let stored: u64 = sizes.iter().map(|&s| s as u64).sum();
        let meminfo = std::fs::read_to_string("/proc/meminfo")
            .map_err(|e| StoreError::io("reading the machine's free memory from", "/proc/meminfo", e))?;
        room_to_hold(stored, &meminfo)?;
        let mut memory = sizes
            .par_iter()
            .map(|&len| {
                self.ctx.register(HostMemory::map(len).map_err(StoreError::device)?).map_err(StoreError::device)
            })
            .collect::<Result<Vec<_>>>()?;
        // Each piece is cut into the ranges placed in it, in order; the ranges are read in
        // parallel.
        let mut pieces = memory.iter_mut().map(PinnedBuffer::as_mut_slice);
        let mut current: &mut [u8] = &mut [];
        let mut jobs: Vec<(&RangeRead, &mut [u8])> = Vec::new();
        for (r, at) in held.iter().flat_map(|i| &i.reads) {
            if at.offset == 0 {
                current = pieces.next().expect("a piece begins at each read placed at offset 0");
            }
            let (this, rest) = std::mem::take(&mut current).split_at_mut((r.end - r.start) as usize);
            current = rest;
            jobs.push((r, this));
        }
        progress.start("holding", stored, Unit::Bytes);
        let read = jobs.into_par_iter().try_for_each(|(r, into)| {
            store.read_pack_range_into(&r.pack, r.start..r.end, into)?;
            progress.advance(into.len() as u64);
            Ok::<(), StoreError>(())
        });
        progress.finish();
        read?;
        self.memory.append(&mut memory);
        self.images.extend(held);
        self.bases.extend(bases);
        Ok(())
    }
}

/// Places `len` bytes after the last piece's bytes in `sizes` (pieces numbered from
/// `first_piece`), or at the start of a new piece when they would pass [`PIECE`].
fn place(sizes: &mut Vec<usize>, first_piece: usize, len: usize) -> HeldAt {
    let next = first_piece + sizes.len();
    match sizes.last_mut() {
        Some(used) if *used + len <= PIECE => {
            let at = HeldAt { buffer: next - 1, offset: *used };
            *used += len;
            at
        }
        _ => {
            sizes.push(len);
            HeldAt { buffer: next, offset: 0 }
        }
    }
}

/// The first message of a load, and the holder's answer.
#[derive(Serialize, Deserialize)]
struct ImageRequest {
    image: String,
}

#[derive(Serialize, Deserialize)]
struct HeldFile {
    path: String,
    len: u64,
}

#[derive(Serialize, Deserialize)]
struct ImageAnswer {
    image: String,
    files: Vec<HeldFile>,
}

/// The second message of a load, and the holder's answer.
#[derive(Serialize, Deserialize)]
struct LoadRequest {
    device: u32,
    handles: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct LoadAnswer {
    bytes: u64,
    path: String,
}

#[derive(Serialize, Deserialize)]
struct ErrorAnswer {
    error: String,
}

impl Holder {
    /// Answers loads on `listener`, one connection at a time, until accepting fails; `log` is
    /// told of each load and of each that failed (the loader is told too). `store` is opened
    /// without its index, so that other gstore commands can use the store meanwhile: it gives
    /// the chunk id key, and delta chunks decode against the bases read when the images were
    /// held.
    pub fn serve(&mut self, store: &Store, listener: &UnixListener, log: &dyn Fn(&str)) -> Result<()> {
        for conn in listener.incoming() {
            let conn = conn.map_err(|e| StoreError::io("accepting a load on", "the hold socket", e))?;
            match self.answer(store, conn) {
                Ok(line) => log(&line),
                Err(e) => log(&format!("a load failed: {e}")),
            }
        }
        Ok(())
    }

    /// Runs one load; the error returned has been sent to the loader where it could be.
    fn answer(&mut self, store: &Store, conn: UnixStream) -> Result<String> {
        // Loads are answered one at a time: a loader that stops talking is given up on.
        conn.set_read_timeout(Some(LOADER_PATIENCE)).map_err(|e| StoreError::io("using", "the hold socket", e))?;
        let mut reader = BufReader::new(conn.try_clone().map_err(|e| StoreError::io("using", "the hold socket", e))?);
        let mut writer = conn;
        let r = self.answer_on(store, &mut reader, &mut writer);
        if let Err(e) = &r {
            let _ = send(&mut writer, &ErrorAnswer { error: e.to_string() });
        }
        r
    }

    fn answer_on(&mut self, store: &Store, reader: &mut impl BufRead, writer: &mut UnixStream) -> Result<String> {
        let ImageRequest { image } = receive(reader)?;
        let k = self.find(&image)?;
        let img = &self.images[k];
        let files: Vec<HeldFile> =
            img.manifest.files().map(|(e, _)| HeldFile { path: e.path.clone(), len: e.size }).collect();
        send(writer, &ImageAnswer { image: img.id.to_hex(), files })?;
        let LoadRequest { device, handles } = receive(reader)?;
        if device != self.ctx.device() {
            return Err(StoreError::Refused(format!(
                "this gstore hold loads into cuda:{}, not cuda:{device}",
                self.ctx.device()
            )));
        }
        let mut handles = handles.into_iter();
        let opening = std::time::Instant::now();
        let (mapped, buffers) = Buffers::allocate(&img.manifest, |e| {
            let hex = handles.next().ok_or_else(|| bad_request("fewer handles than the image has files"))?;
            let handle = parse_handle(&hex)?;
            if e.size == 0 {
                return Ok((None, 0, 0));
            }
            let b: IpcBuffer = self.ctx.open_ipc(&handle, e.size as usize).map_err(StoreError::device)?;
            let base = b.ptr();
            Ok((Some(b), base, e.size as usize))
        })?;
        if handles.next().is_some() {
            return Err(bad_request("more handles than the image has files"));
        }
        let (sender, reads) = mpsc::channel();
        for (read, at) in &img.reads {
            sender
                .send(PlannedRead { read: Arc::clone(read), held: Some(*at) })
                .map_err(|_| StoreError::Internal("the load stopped before its reads were queued".into()))?;
        }
        drop(sender);
        let planned = Planned { reads, zeros: img.zeros.clone(), total: img.total };
        let (open_s, t) = (opening.elapsed().as_secs_f64(), std::time::Instant::now());
        let bytes = img.manifest.files().map(|(e, _)| e.size).sum::<u64>();
        let name = img.name.clone();
        self.load.run(store, &self.bases, planned, &self.memory, &buffers, self.workers, &Silent)?;
        // The loader may free its buffers once it hears back: they are unmapped first.
        let (load_s, t) = (t.elapsed().as_secs_f64(), std::time::Instant::now());
        drop(mapped);
        let close_s = t.elapsed().as_secs_f64();
        send(writer, &LoadAnswer { bytes, path: self.load.describe() })?;
        Ok(format!(
            "loaded {name} ({bytes} bytes): handles opened in {open_s:.3} s, loaded in {load_s:.3} s ({:.1} GB/s), closed in {close_s:.3} s",
            bytes as f64 / load_s.max(1e-9) / 1e9
        ))
    }

    /// The held image `reference` names: a name it was held by, or a prefix (8 hex digits or
    /// more) of its id.
    fn find(&self, reference: &str) -> Result<usize> {
        let images = &self.images;
        let by_id = |i: &HeldImage| reference.len() >= 8 && i.id.to_hex().starts_with(&reference.to_ascii_lowercase());
        images.iter().position(|i| i.name == reference).or_else(|| images.iter().position(by_id)).ok_or_else(|| {
            let names: Vec<&str> = images.iter().map(|i| i.name.as_str()).collect();
            StoreError::NotFound {
                what: ObjectKind::HeldImage,
                key: format!("{reference} (this gstore hold holds {})", names.join(", ")),
            }
        })
    }
}

/// Refuses to pin `bytes` when `meminfo` (`/proc/meminfo`'s text) says the machine has less
/// available: pinned memory cannot be swapped or reclaimed, and touching more than there is
/// would end in the kernel's OOM killer rather than an error.
fn room_to_hold(bytes: u64, meminfo: &str) -> Result<()> {
    let available = gstore_gpu_dump::procfs::meminfo_bytes(meminfo, "MemAvailable")
        .ok_or_else(|| StoreError::Internal("/proc/meminfo has no MemAvailable line".into()))?;
    if bytes > available {
        return Err(StoreError::Refused(format!(
            "holding these images takes {bytes} bytes of pinned memory and the machine has {available} available; nothing was held"
        )));
    }
    Ok(())
}

fn bad_request(detail: &str) -> StoreError {
    StoreError::Refused(format!("a load request to gstore hold: {detail}"))
}

fn parse_handle(digits: &str) -> Result<IpcHandle> {
    if digits.len() != 128 {
        return Err(bad_request("an IPC handle is not 128 hex digits"));
    }
    let mut out = [0u8; 64];
    hex::decode_to_slice(digits, &mut out).map_err(|_| bad_request("an IPC handle is not hex"))?;
    Ok(IpcHandle(out))
}

fn to_hex(handle: &IpcHandle) -> String {
    hex::encode(handle.0)
}

fn send(writer: &mut UnixStream, message: &impl Serialize) -> Result<()> {
    let mut line = serde_json::to_vec(message).map_err(|e| StoreError::Internal(e.to_string()))?;
    line.push(b'\n');
    writer.write_all(&line).map_err(|e| StoreError::io("writing to", "the hold socket", e))
}

/// Reads one message; an error answer from the other side becomes an error here.
fn receive<T: serde::de::DeserializeOwned>(reader: &mut impl BufRead) -> Result<T> {
    let mut line = String::new();
    let n = reader.read_line(&mut line).map_err(|e| StoreError::io("reading from", "the hold socket", e))?;
    if n == 0 {
        return Err(StoreError::Unavailable {
            action: "loading through",
            key: "the hold socket".into(),
            message: "the other side hung up mid-load".into(),
            reached: true,
        });
    }
    if let Ok(ErrorAnswer { error }) = serde_json::from_str::<ErrorAnswer>(&line) {
        return Err(StoreError::Refused(format!("gstore hold: {error}")));
    }
    serde_json::from_str(&line).map_err(|e| bad_request(&format!("unreadable message ({e})")))
}

/// Loads the image `reference` names from the `gstore hold` answering at `socket` into VRAM
/// on `ctx`'s device: allocates a buffer per file here, lets the holder fill and check them,
/// and returns them once it says every chunk matched. The phases: allocation here, then the
/// holder's load (plan time is 0: the holder planned when it read the image).
pub fn load_held(socket: &Path, reference: &str, ctx: &Context) -> Result<DeviceImage> {
    let t = std::time::Instant::now();
    let conn = UnixStream::connect(socket).map_err(|e| {
        StoreError::io("connecting to gstore hold (is `gstore hold --socket PATH IMAGE` running?) at", socket, e)
    })?;
    let mut reader = BufReader::new(conn.try_clone().map_err(|e| StoreError::io("using", socket, e))?);
    let mut writer = conn;
    send(&mut writer, &ImageRequest { image: reference.to_string() })?;
    let ImageAnswer { files, .. } = receive(&mut reader)?;
    check_room(ctx, files.iter().map(|f| f.len).sum())?;
    let mut entries = Vec::with_capacity(files.len());
    let mut handles = Vec::with_capacity(files.len());
    for f in files {
        let buffer = ctx.alloc_shareable(f.len as usize).map_err(StoreError::device)?;
        handles.push(if buffer.is_empty() {
            "0".repeat(128)
        } else {
            to_hex(&buffer.ipc_handle().map_err(StoreError::device)?)
        });
        entries.push(DeviceEntry { path: f.path, buffer });
    }
    let alloc_s = t.elapsed().as_secs_f64();
    send(&mut writer, &LoadRequest { device: ctx.device(), handles })?;
    let LoadAnswer { path, .. } = receive(&mut reader)?;
    Ok(DeviceImage {
        entries,
        plan_s: 0.0,
        alloc_s,
        transfer_s: t.elapsed().as_secs_f64() - alloc_s,
        path: format!("held by gstore hold at {}: {path}", socket.display()),
        waits: TransferWaits::default(),
    })
}

/// Listens at `path` for loads, readable and writable by this user alone (mode 0600: a load
/// reads held images). A socket file left by a holder that is gone is replaced; one that a
/// holder still answers on is an error.
pub fn bind_hold_socket(path: &Path) -> Result<UnixListener> {
    if UnixStream::connect(path).is_ok() {
        return Err(StoreError::Conflict(format!("a gstore hold already answers at {}", path.display())));
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            std::fs::remove_file(path).map_err(|e| StoreError::io("removing the stale socket", path, e))?;
        }
        Ok(_) => {
            return Err(StoreError::Path {
                path: path.to_path_buf(),
                why: "exists and is not a socket: not replacing it".into(),
            })
        }
        Err(_) => {}
    }
    // SAFETY: umask only swaps the process's file mode mask; the old one is put back below.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    bound.map_err(|e| StoreError::io("listening for loads at", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn handles_go_through_hex_and_bad_ones_are_refused() {
        let mut bytes = [0u8; 64];
        bytes.iter_mut().enumerate().for_each(|(k, b)| *b = (k * 37 + 5) as u8);
        let hex = to_hex(&IpcHandle(bytes));
        assert_eq!(hex.len(), 128);
        assert_eq!(parse_handle(&hex).unwrap(), IpcHandle(bytes));
        for bad in [
            &hex[..126],
            &format!("{}zz", &hex[..126]),
            &format!("{}+f", &hex[..126]),
            &format!("{hex}00"),
            &"é".repeat(64),
        ] {
            assert!(parse_handle(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_fill_pieces_in_order_and_a_read_that_would_pass_one_starts_the_next() {
        const MIB: usize = 1 << 20;
        let mut sizes = Vec::new();
        let placed: Vec<(usize, usize)> = [600 * MIB, 424 * MIB, MIB, 16 * MIB]
            .into_iter()
            .map(|len| place(&mut sizes, 2, len))
            .map(|at| (at.buffer, at.offset))
            .collect();
        assert_eq!(placed, [(2, 0), (2, 600 * MIB), (3, 0), (3, MIB)]);
        assert_eq!(sizes, [PIECE, 17 * MIB]);
    }

    #[test]
    fn images_larger_than_available_memory_are_refused() {
        let meminfo = "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\n";
        assert!(room_to_hold(2048 * 1024, meminfo).is_ok());
        let err = room_to_hold(2048 * 1024 + 1, meminfo).unwrap_err().to_string();
        assert!(err.contains("takes 2097153 bytes of pinned memory and the machine has 2097152 available"), "{err}");
        assert!(room_to_hold(1, "MemTotal: 5 kB\n").is_err(), "no MemAvailable line");
    }

    #[test]
    fn the_socket_is_this_users_alone_and_a_stale_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hold.sock");
        let first = bind_hold_socket(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let err = bind_hold_socket(&path).unwrap_err().to_string();
        assert!(err.contains("already answers at"), "{err}");
        // The holder is gone; its socket file stays until the next one replaces it.
        drop(first);
        assert!(path.exists());
        let _second = bind_hold_socket(&path).unwrap();
        assert!(UnixStream::connect(&path).is_ok());
    }
}
