//! Pushing a file or directory tree into the store as one image.
//!
//! Files are cut into work units of at most one segment. A batch of units is read, chunked,
//! hashed and (for chunks the store lacks) compressed on every core — units the page cache
//! lacks are read ahead, on reader threads, while the batch before is processed; then, in
//! order, new chunks are appended to the open pack and each file's chunk list grows. Full
//! packs go to a writer thread that stores the pack and then indexes it, so the next batch is
//! processed while the previous pack is written. The manifest is written after the last pack
//! is indexed, and the tag after the manifest: a crash at any point leaves every earlier
//! image intact.
//!
//! A push holds a lease (docs/GC.md) naming every pack it writes, before it writes it, and
//! the packs it deduplicated against. Once those are named, it checks that none of them has
//! a gc tombstone or is gone; chunks it relied on in such packs are read again from the
//! source and uploaded anew. The lease goes away after the tag is written.

pub(crate) mod source;
pub mod stream;

use crate::codec::{self, Codec, DeltaBases};
use crate::commands::pack_fill::PackFill;
use crate::dedup::chunker;
use crate::dedup::deltas::Deltas;
use crate::dedup::similar::{self, Sketch};
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::ObjectKey;
use crate::format::lease::{self, Lease};
use crate::format::manifest::{ChunkRef, Entry, EntryKind, Manifest};
use crate::format::now_unix;
use crate::format::pack::{FinishedPack, PackBuilder};
use crate::format::tag::{TagRecord, TagRef};
use crate::memory::KEPT;
use crate::progress::Progress;
use crate::repo::indexed::IndexedStore;
use crate::repo::store::Store;
use serde::Serialize;
use source::{SourceEntry, Unit};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// Input bytes processed in parallel before the ordered append step: at least this much, and
/// at least two segments per worker thread so every core has work.
const MIN_BATCH_BYTES: u64 = 64 * 1024 * 1024;

/// What a push did.
#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    /// The new image's manifest id (its root hash).
    pub manifest: ObjectId,
    /// The tag it was given.
    pub tag: String,
    /// Entries in the image.
    pub entries: usize,
    /// Plain bytes in the image.
    pub logical_bytes: u64,
    /// Chunks in the image (zero chunks included).
    pub chunks: u64,
    /// Chunks this push added to the store.
    pub new_chunks: u64,
    /// Plain bytes of the chunks this push added.
    pub new_plain_bytes: u64,
    /// Bytes this push added to packs (after compression).
    pub new_stored_bytes: u64,
    /// Bytes of all-zero chunks (stored as markers).
    pub zero_bytes: u64,
    /// Packs written.
    pub packs: u64,
    /// New chunks stored as deltas against similar stored chunks (of page images).
    pub delta_chunks: u64,
    /// Chunks found in packs gc had tombstoned or deleted meanwhile, uploaded again.
    pub reuploaded_chunks: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// A dry run: nothing was written; the counts say what the push would add, and
    /// `manifest` is the id the image would get.
    pub dry_run: bool,
    /// Where the time went, stage by stage (which stage sets the pace).
    pub stages: PushStages,
}

impl PushReport {
    /// The report of a push to `tag` of `total` bytes (0 for a stream, counted as it comes)
    /// that has not begun.
    fn starting(tag: &TagRef, total: u64, dry_run: bool) -> PushReport {
        PushReport {
            // Set when the manifest is made, the push's last step.
            manifest: ObjectId([0; 32]),
            tag: tag.to_string(),
            entries: 0,
            logical_bytes: total,
            chunks: 0,
            new_chunks: 0,
            new_plain_bytes: 0,
            new_stored_bytes: 0,
            zero_bytes: 0,
            packs: 0,
            delta_chunks: 0,
            reuploaded_chunks: 0,
            seconds: 0.0,
            dry_run,
            stages: PushStages::default(),
        }
    }
}

/// Seconds each stage of a push's pipeline was busy or waiting: segments are read, chunked,
/// hashed, looked up and compressed on every core (`process`), appended in order into packs
/// (`append`), and packs named and stored by the writers (`write`). The stage that waits least
/// sets the pace.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PushStages {
    /// Wall seconds the cores spent processing batches of segments.
    pub process_s: f64,
    /// Seconds processed batches waited for the append stage.
    pub process_waited_s: f64,
    /// Seconds the append stage worked.
    pub append_s: f64,
    /// Seconds it waited for processed batches.
    pub append_waited_s: f64,
    /// Seconds it waited for a free pack writer.
    pub append_blocked_s: f64,
    /// Seconds the writers spent naming and storing packs, summed over writers.
    pub write_s: f64,
}

/// A chunk after the parallel stage.
struct Cut {
    id: ObjectId,
    len: u32,
    zero: bool,
    /// Encoded bytes, only for chunks the index did not know.
    stored: Option<(Codec, Vec<u8>)>,
    /// The pack the index found the chunk in, for chunks deduplicated against the store.
    found_in: Option<ObjectId>,
    /// For a chunk stored as a delta: its bases.
    bases: Option<DeltaBases>,
    /// The resemblance sketch of a new chunk of a page image stored whole (a future base).
    sketch: Option<Sketch>,
}

/// A chunk this push relies on in a pack it did not write: where to read it again.
struct Relied {
    id: ObjectId,
    file: usize,
    offset: u64,
    len: u32,
}

/// Pushes `source` (a file or a directory tree) as a new image tagged `tag`, with `meta`
/// recorded in the manifest.
pub fn push(
    store: &IndexedStore,
    source: &std::path::Path,
    tag: &TagRef,
    meta: BTreeMap<String, serde_json::Value>,
    progress: &dyn Progress,
) -> Result<PushReport> {
    push_selected(store, source, &|_| true, false, tag, meta, progress)
}

/// [`push`] of the entries of `source` that `keep` accepts (given each entry's path in the
/// image); a directory left out leaves out everything below it. A `dry_run` reads, chunks and
/// looks up everything but writes nothing (no pack, manifest, tag or lease).
pub fn push_selected(
    store: &IndexedStore,
    source: &std::path::Path,
    keep: &dyn Fn(&str) -> bool,
    dry_run: bool,
    tag: &TagRef,
    meta: BTreeMap<String, serde_json::Value>,
    progress: &dyn Progress,
) -> Result<PushReport> {
    // Refused before any work rather than when the tag is written.
    tag.check_new()?;
    let mut entries = source::scan(source)?;
    let mut dropped: Vec<String> = Vec::new();
    entries.retain(|e| {
        let below_dropped = dropped.iter().any(|d| e.rel.strip_prefix(d.as_str()).is_some_and(|r| r.starts_with('/')));
        if below_dropped || !keep(&e.rel) {
            if e.kind == EntryKind::Dir {
                dropped.push(e.rel.clone());
            }
            return false;
        }
        true
    });
    let contents = open_files(&entries)?;
    push_entries(store, Input::Files { entries: &entries, contents: &contents }, dry_run, tag, meta, progress)
}

/// Pushes files held in memory as a new image tagged `tag`: each `(path, pieces)` becomes a
/// regular file (mode 0644) at that relative path whose bytes are its pieces one after
/// another (a header and tensors, say), in the order given; parent directories are implied,
/// not stored. Paths must be relative, `/`-separated, without `.` or `..` parts, and
/// distinct. The pieces are read in place: no copy besides the chunks' own encoding.
pub fn push_pieces(
    store: &IndexedStore,
    files: &[(String, Vec<&[u8]>)],
    tag: &TagRef,
    meta: BTreeMap<String, serde_json::Value>,
    progress: &dyn Progress,
) -> Result<PushReport> {
    tag.check_new()?;
    let mut names = HashSet::new();
    let mut entries = Vec::with_capacity(files.len());
    let mut contents = Vec::with_capacity(files.len());
    for (path, parts) in files {
        crate::format::manifest::check_relative_path(path)
            .map_err(|why| StoreError::Invalid(format!("file {path:?}: {why}")))?;
        if !names.insert(path.as_str()) {
            return Err(StoreError::Invalid(format!("file {path:?} is given twice")));
        }
        let mut starts = Vec::with_capacity(parts.len());
        let mut size = 0u64;
        for p in parts {
            starts.push(size);
            size += p.len() as u64;
        }
        entries.push(SourceEntry::in_memory(path, size));
        contents.push(Some(Content::Pieces { parts, starts }));
    }
    push_entries(store, Input::Files { entries: &entries, contents: &contents }, false, tag, meta, progress)
}

/// Pushes the files fed through `source` while the push runs (a CRIU dump streaming its image,
/// say: [`stream`]) as a new image tagged `tag`. Pieces are chunked, stored and indexed
/// as they arrive; the image is written and tagged only once the feeder has said it is
/// complete ([`stream::StreamSink::finish`], which also gives the manifest's
/// metadata). A feeder that stops without finishing fails the push: nothing is tagged.
///
/// A streamed byte is read once, so the push cannot read a chunk again later: before it
/// relies on a chunk stored in another pack, that pack is named in the push's lease and
/// checked to be there without a gc tombstone (docs/GC.md, push step 3), and a chunk in a
/// pack that fails the check is stored anew.
pub fn push_stream(
    store: &IndexedStore,
    source: stream::StreamSource,
    tag: &TagRef,
    progress: &dyn Progress,
) -> Result<PushReport> {
    tag.check_new()?;
    push_entries(store, Input::Stream(source), false, tag, BTreeMap::new(), progress)
}

/// Where a push's files come from.
enum Input<'a> {
    /// Files on disk or in memory, read at offsets; every piece is planned before the push.
    Files {
        /// The entries.
        entries: &'a [SourceEntry],
        /// Each file's bytes (none for directories and symlinks).
        contents: &'a [Option<Content<'a>>],
    },
    /// Files fed while the push runs.
    Stream(stream::StreamSource),
}

/// The bytes of one file being pushed.
enum Content<'a> {
    /// A file on disk, read at offsets.
    File(std::fs::File),
    /// Pieces of memory, one after another.
    Pieces {
        /// The pieces.
        parts: &'a [&'a [u8]],
        /// Where each piece starts in the file.
        starts: Vec<u64>,
    },
}

impl Content<'_> {
    /// Fills `buf` from `offset`; a file that is shorter now than when it was scanned has
    /// shrunk while it was being pushed.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64, entry: &SourceEntry) -> Result<()> {
        match self {
            Content::File(f) => f.read_exact_at(buf, offset).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    StoreError::Conflict(format!(
                        "{} shrank while it was being pushed: push it again once it is still",
                        entry.abs.display()
                    ))
                } else {
                    StoreError::io("reading", &entry.abs, e)
                }
            }),
            Content::Pieces { parts, starts } => {
                let size = starts.last().zip(parts.last()).map_or(0, |(s, p)| s + p.len() as u64);
                if offset.checked_add(buf.len() as u64).is_none_or(|end| end > size) {
                    return Err(StoreError::Internal(format!("read past the end of {}", entry.rel)));
                }
                let mut at = offset;
                let mut filled = 0;
                let mut i = starts.partition_point(|&s| s <= at).saturating_sub(1);
                while filled < buf.len() {
                    let from = (at - starts[i]) as usize;
                    let n = parts[i].len().saturating_sub(from).min(buf.len() - filled);
                    if n > 0 {
                        buf[filled..filled + n].copy_from_slice(&parts[i][from..from + n]);
                    }
                    filled += n;
                    at += n as u64;
                    i += 1;
                }
                Ok(())
            }
        }
    }
}

fn push_entries(
    store: &IndexedStore,
    input: Input<'_>,
    dry_run: bool,
    tag: &TagRef,
    mut meta: BTreeMap<String, serde_json::Value>,
    progress: &dyn Progress,
) -> Result<PushReport> {
    let started = std::time::Instant::now();
    if !dry_run {
        store.backend().check_tag_write(&tag.name)?;
    }
    // A stream's files and metadata are known once it ends.
    let streamed = stream::Received::default();
    let (batches, total, reader) = batches_of(store, input, &streamed);
    // Pieces read once cannot be read again at the end: the packs they rely on are vetted first.
    let vet_found = reader.is_none();
    progress.start("pushing", total, crate::progress::Unit::Bytes);

    let mut report = PushReport::starting(tag, total, dry_run);
    let lease = if dry_run { None } else { Some(Lease::take(store.backend(), &format!("push {tag}"))?) };
    let mut relied: HashMap<ObjectId, Vec<Relied>> = HashMap::new();
    let mut file_chunks: Vec<Vec<ChunkRef>> = Vec::new();

    let writers = store.upload_concurrency();
    let (tx, rx) = mpsc::sync_channel::<PackBuilder>(writers);
    let rx = std::sync::Mutex::new(rx);
    let writer_failed = AtomicBool::new(false);
    let queue = PackQueue { tx, writer_failed: &writer_failed };
    let result = std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..writers)
            .map(|_| {
                let (rx, lease, failed) = (&rx, lease.as_ref(), &writer_failed);
                scope.spawn(move || pack_writer(store, rx, lease, failed))
            })
            .collect();
        let out = Appended { file_chunks: &mut file_chunks, report: &mut report, relied: &mut relied };
        let parent = meta.get("parent").and_then(|p| p.as_str()).and_then(|p| TagRef::parse(p).ok());
        let deltas = Deltas::new(store, lease.as_ref(), tag, parent);
        if reader.as_ref().is_some_and(|r| r.entries.iter().any(|e| crate::dedup::deltas::is_tensor_file(&e.rel))) {
            deltas.parent_files();
        }
        let work = Work { deltas: &deltas, reader: reader.as_ref(), vet_found };
        let appended = append_all(&work, batches, out, &queue, progress);
        drop(queue);
        // A writer error explains an append error (a closed channel), so report it first.
        let written = join_writers(handles, &mut report)?;
        report.packs = written.len() as u64;
        for p in &written {
            relied.remove(p);
        }
        appended
    });
    progress.finish();
    result?;
    let entries: std::borrow::Cow<'_, [SourceEntry]> = match &reader {
        Some(reader) => {
            if let Some(lease) = &lease {
                report.reuploaded_chunks = reupload_unreliable(store, lease, reader, relied)?;
            }
            std::borrow::Cow::Borrowed(reader.entries)
        }
        None => std::borrow::Cow::Owned(streamed_in_order(&streamed, &mut meta, &mut file_chunks)),
    };
    file_chunks.resize(entries.len(), Vec::new());
    report.entries = entries.len();
    report.logical_bytes = file_chunks.iter().flatten().map(|c| c.len as u64).sum();

    let mut manifest = manifest_of(&entries, file_chunks, meta);
    let id = match lease {
        Some(lease) => {
            let id = store_manifest(store, &lease, &mut manifest)?;
            let _: TagRecord = store.set_tag(tag, id)?;
            id
        }
        None => ObjectId::of(&manifest.encode()),
    };
    report.manifest = id;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The batches of units `input` is pushed in, its size where known before it is read (a
/// stream's is not), and where its units are read from (a stream's carry their bytes).
fn batches_of<'a>(
    store: &IndexedStore,
    input: Input<'a>,
    streamed: &'a stream::Received,
) -> (Batches<'a>, u64, Option<Reader<'a>>) {
    let batch_bytes = MIN_BATCH_BYTES.max(2 * rayon::current_num_threads() as u64 * store.config().segment_size);
    match input {
        Input::Files { entries, contents } => {
            let units = plan_units(entries, store.config());
            let total = units.iter().map(|u| u.len).sum();
            (Box::new(batch_units(units, batch_bytes).into_iter().map(Ok)), total, Some(Reader { entries, contents }))
        }
        Input::Stream(source) => (Box::new(source.batches(batch_bytes, streamed)), 0, None),
    }
}

/// What a pack writer returns: the packs it wrote and the seconds it was busy.
type Written = Result<(Vec<ObjectId>, f64)>;

/// Waits for the pack writers: the packs they wrote, or the first error; their busy seconds
/// go into `report`.
fn join_writers(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Written>>,
    report: &mut PushReport,
) -> Result<Vec<ObjectId>> {
    let mut written: Result<Vec<ObjectId>> = Ok(Vec::new());
    for h in handles {
        let r = h.join().expect("pack writer thread does not panic");
        written = match (written, r) {
            (Ok(mut a), Ok((b, busy))) => {
                a.extend(b);
                report.stages.write_s += busy;
                Ok(a)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
    }
    written
}

/// A stream's files in path order, with `file_chunks` (in arrival order) put in the same
/// order; the metadata the stream ended with goes into `meta`.
fn streamed_in_order(
    streamed: &stream::Received,
    meta: &mut BTreeMap<String, serde_json::Value>,
    file_chunks: &mut Vec<Vec<ChunkRef>>,
) -> Vec<SourceEntry> {
    let (entries, more) = streamed.take();
    meta.extend(more);
    file_chunks.resize(entries.len(), Vec::new());
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[a].rel.cmp(&entries[b].rel));
    let mut arrived = std::mem::take(file_chunks);
    *file_chunks = order.iter().map(|&i| std::mem::take(&mut arrived[i])).collect();
    order.iter().map(|&i| entries[i].clone()).collect()
}

/// A pack writer: takes built packs from `rx`, names them and (unless a dry run, without a
/// `lease`) stores them; returns the packs it wrote and the seconds it was busy. A failed
/// write sets `failed`, so the producer stops, and drains the queue before it returns.
fn pack_writer(
    store: &IndexedStore,
    rx: &std::sync::Mutex<mpsc::Receiver<PackBuilder>>,
    lease: Option<&Lease>,
    failed: &AtomicBool,
) -> Written {
    let mut written = Vec::new();
    let mut busy = 0.0;
    loop {
        // The guard is released before the upload: other writers take the next pack.
        let next = rx.lock().expect("pack queue lock").recv();
        let Ok(builder) = next else { return Ok((written, busy)) };
        let t = std::time::Instant::now();
        // Naming the pack hashes all of it: done here, on the writers, not on the thread that
        // appends chunks in order.
        let p = builder.finish();
        written.push(p.id);
        // A dry run counts its packs and drops them.
        let Some(lease) = lease else { continue };
        let stored = write_pack(store, lease, p);
        busy += t.elapsed().as_secs_f64();
        if let Err(e) = stored {
            // Stop the producer, and take what it already queued so it never waits on a queue
            // nobody empties.
            failed.store(true, Ordering::SeqCst);
            while rx.lock().expect("pack queue lock").recv().is_ok() {}
            return Err(e);
        }
    }
}

/// The manifest of a push of `entries`, whose chunks are `file_chunks` (one list per entry),
/// with metadata `meta`, created now (or at `SOURCE_DATE_EPOCH`).
fn manifest_of(
    entries: &[SourceEntry],
    file_chunks: Vec<Vec<ChunkRef>>,
    meta: BTreeMap<String, serde_json::Value>,
) -> Manifest {
    Manifest {
        created_unix: creation_time(),
        meta,
        entries: entries
            .iter()
            .zip(&file_chunks)
            .map(|(e, c)| Entry {
                path: e.rel.clone(),
                kind: e.kind,
                mode: e.mode,
                size: if e.kind == EntryKind::File { c.iter().map(|c| c.len as u64).sum() } else { 0 },
                target: e.target.clone(),
                chunks: c.len() as u64,
            })
            .collect(),
        chunks: file_chunks.into_iter().flatten().collect(),
    }
}

/// The creation time a push records: `SOURCE_DATE_EPOCH` (seconds) when set, for reproducible
/// images (the same tree pushed twice gets the same manifest id), else now.
fn creation_time() -> u64 {
    crate::environment::source_date_epoch().unwrap_or_else(now_unix)
}

/// Every file's segments (chunker::segments), as units of work.
fn plan_units(entries: &[SourceEntry], cfg: &crate::StoreConfig) -> Vec<Unit> {
    let files = entries.iter().enumerate().filter(|(_, e)| e.kind == EntryKind::File);
    files
        .flat_map(|(i, e)| {
            let page_image = similar::is_page_image_path(&e.rel);
            chunker::segments(e.size, cfg).into_iter().map(move |s| Unit {
                file: i,
                offset: s.start,
                len: s.end - s.start,
                page_image,
                data: None,
            })
        })
        .collect()
}

/// `units` in batches of about `batch_bytes` (at least one unit each), in order.
fn batch_units(units: Vec<Unit>, batch_bytes: u64) -> Vec<Vec<Unit>> {
    let mut batches: Vec<Vec<Unit>> = Vec::new();
    let mut bytes = 0;
    for u in units {
        match batches.last_mut() {
            Some(b) if bytes + u.len <= batch_bytes => {
                bytes += u.len;
                b.push(u);
            }
            _ => {
                bytes = u.len;
                batches.push(vec![u]);
            }
        }
    }
    batches
}

/// Batches of units in push order: the pieces of each file in file order.
type Batches<'a> = Box<dyn Iterator<Item = Result<Vec<Unit>>> + Send + 'a>;

/// What processing a unit needs besides the unit.
struct Work<'a> {
    deltas: &'a Deltas<'a>,
    /// Where units that do not carry their bytes are read from (none for a stream).
    reader: Option<&'a Reader<'a>>,
    /// Rely on a chunk found in another pack only once that pack is vetted (named in the lease
    /// and found without a tombstone), for pushes that cannot read their input again.
    vet_found: bool,
}

fn open_files(entries: &[SourceEntry]) -> Result<Vec<Option<Content<'static>>>> {
    entries
        .iter()
        .map(|e| match e.kind {
            EntryKind::File => std::fs::File::open(&e.abs)
                .map(|f| Some(Content::File(f)))
                .map_err(|err| StoreError::io("opening", &e.abs, err)),
            _ => Ok(None),
        })
        .collect()
}

/// Full packs on their way to the writer threads.
struct PackQueue<'a> {
    tx: mpsc::SyncSender<PackBuilder>,
    /// Set by a writer that failed: the push stops producing packs.
    writer_failed: &'a AtomicBool,
}

impl PackQueue<'_> {
    fn send(&self, p: PackBuilder) -> Result<()> {
        let gone = || StoreError::Internal("pack writer stopped".into());
        if self.writer_failed.load(Ordering::SeqCst) {
            return Err(gone());
        }
        self.tx.send(p).map_err(|_| gone())
    }
}

/// What the ordered append step fills in.
struct Appended<'a> {
    file_chunks: &'a mut Vec<Vec<ChunkRef>>,
    report: &'a mut PushReport,
    relied: &'a mut HashMap<ObjectId, Vec<Relied>>,
}

/// What the thread pool hands the appending thread: a batch's units and each unit's chunks.
type Processed = Result<(Vec<Unit>, Vec<Result<Vec<Cut>>>)>;

/// Processes `batches` on the thread pool and appends their chunks, in order, to packs sent
/// to `queue`, recording each file's chunks and the report in `out`.
fn append_all(
    work: &Work<'_>,
    batches: Batches<'_>,
    out: Appended<'_>,
    queue: &PackQueue<'_>,
    progress: &dyn Progress,
) -> Result<()> {
    let mut appender = Appender { work, out, queue, seen: HashSet::new(), pack: PackFill::new(work.deltas.store) };
    // The next batch is read, chunked, hashed and compressed on every core while this thread
    // appends the previous one in order: the ordered step no longer leaves the cores idle.
    let appended = std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = mpsc::sync_channel::<Processed>(1);
        let producer = scope.spawn(move || process_batches(work, batches, progress, tx));
        let result = (|| loop {
            let t = std::time::Instant::now();
            let Ok(processed) = rx.recv() else { return Ok(()) };
            let (batch, cuts) = processed?;
            appender.out.report.stages.append_waited_s += t.elapsed().as_secs_f64();
            appender.batch(&batch, cuts)?;
        })();
        drop(rx);
        let (busy, waited) = producer.join().expect("the push's producer does not panic");
        appender.out.report.stages.process_s = busy;
        appender.out.report.stages.process_waited_s = waited;
        result
    });
    // Each thread's buffer and encoder go with the push (a long-lived process keeps nothing
    // of it between pushes).
    rayon::broadcast(|_| WORKER.with(|w| w.borrow_mut().take()));
    appended?;
    if let Some(last) = appender.pack.last() {
        queue.send(last)?;
    }
    Ok(())
}

/// Reads `batches` and processes their units on the thread pool, two batches in flight, and
/// sends each processed batch, in order, to `tx`. Returns the seconds spent waiting for the
/// pool and the seconds spent waiting for the appending side.
fn process_batches(
    work: &Work<'_>,
    batches: Batches<'_>,
    progress: &dyn Progress,
    tx: mpsc::SyncSender<Processed>,
) -> (f64, f64) {
    let (mut busy, mut waited) = (0.0, 0.0);
    std::thread::scope(|reading| {
        rayon::in_place_scope(|units| {
            // Two batches in flight: cores done with the older batch's units take the newer
            // one's while the older one's last units finish (with one, every batch ended with
            // cores idle behind its slowest unit: ~9 % of a warm push of CRIU images on two
            // cores).
            let mut in_flight = std::collections::VecDeque::new();
            let mut batches = read_ahead(reading, batches, work.reader);
            loop {
                if in_flight.len() < 2 {
                    if let Some(batch) = batches.next() {
                        in_flight.push_back(batch.map(|b| start_batch(units, work, progress, b)));
                        continue;
                    }
                }
                let Some(oldest) = in_flight.pop_front() else { break };
                let t = std::time::Instant::now();
                let processed = oldest.map(Started::finish);
                busy += t.elapsed().as_secs_f64();
                let t = std::time::Instant::now();
                // The appending side stopped (an error): so does this one (and dropping the
                // read-ahead's receiver stops the reads; units started finish).
                if tx.send(processed).is_err() {
                    break;
                }
                waited += t.elapsed().as_secs_f64();
            }
        });
    });
    (busy, waited)
}

/// The ordered step of a push: appends each new chunk once to the pack being filled, and
/// records every chunk of every file.
struct Appender<'a> {
    work: &'a Work<'a>,
    out: Appended<'a>,
    queue: &'a PackQueue<'a>,
    /// Chunks this push already appended.
    seen: HashSet<ObjectId>,
    pack: PackFill<'a>,
}

impl Appender<'_> {
    /// Appends the chunks of one processed batch, unit by unit, in file order.
    fn batch(&mut self, batch: &[Unit], cuts: Vec<Result<Vec<Cut>>>) -> Result<()> {
        let t = std::time::Instant::now();
        let mut blocked = 0.0;
        for (u, cuts) in batch.iter().zip(cuts) {
            if self.out.file_chunks.len() <= u.file {
                self.out.file_chunks.resize(u.file + 1, Vec::new());
            }
            let mut offset = u.offset;
            for c in cuts? {
                let len = c.len;
                blocked += self.chunk(u.file, offset, c)?;
                offset += len as u64;
            }
        }
        let stages = &mut self.out.report.stages;
        stages.append_blocked_s += blocked;
        stages.append_s += t.elapsed().as_secs_f64() - blocked;
        Ok(())
    }

    /// Records chunk `c` at `offset` of file `file`, and appends it when it is new to the
    /// store and to this push. Returns the seconds spent waiting to hand a full pack on.
    fn chunk(&mut self, file: usize, offset: u64, c: Cut) -> Result<f64> {
        let report = &mut *self.out.report;
        report.chunks += 1;
        self.out.file_chunks[file].push(ChunkRef { id: c.id, len: c.len, zero: c.zero });
        if c.zero {
            report.zero_bytes += c.len as u64;
            return Ok(0.0);
        }
        if let Some(pack) = c.found_in.filter(|_| !self.work.vet_found) {
            self.out.relied.entry(pack).or_default().push(Relied { id: c.id, file, offset, len: c.len });
        }
        let Some((codec, stored)) = c.stored else { return Ok(0.0) };
        if !self.seen.insert(c.id) {
            return Ok(0.0);
        }
        report.new_chunks += 1;
        report.new_plain_bytes += c.len as u64;
        report.new_stored_bytes += stored.len() as u64;
        match c.bases {
            Some(bases) => {
                report.delta_chunks += 1;
                self.pack.push_delta(c.id, bases, stored, c.len)
            }
            None => self.pack.push_owned(c.id, codec, stored, c.len),
        }
        if let Some(sketch) = c.sketch {
            self.pack.add_sketch(c.id, sketch);
        }
        let Some(full) = self.pack.full() else { return Ok(0.0) };
        let w = std::time::Instant::now();
        self.queue.send(full)?;
        Ok(w.elapsed().as_secs_f64())
    }
}

/// A batch whose units are being processed on the thread pool.
struct Started {
    batch: std::sync::Arc<Vec<Unit>>,
    done: mpsc::Receiver<(usize, Result<Vec<Cut>>)>,
}

/// Starts processing each unit of `batch` as its own task of `scope`.
fn start_batch<'s>(
    scope: &rayon::Scope<'s>,
    work: &'s Work<'s>,
    progress: &'s dyn Progress,
    batch: Vec<Unit>,
) -> Started {
    let batch = std::sync::Arc::new(batch);
    let (tx, done) = mpsc::channel();
    for i in 0..batch.len() {
        let (batch, tx) = (batch.clone(), tx.clone());
        scope.spawn(move |_| {
            let cuts = process_unit(work, &batch[i]);
            progress.advance(batch[i].len);
            // Let go of the batch before saying so: once every unit has sent, the batch is
            // the receiver's alone.
            drop(batch);
            // The receiver is gone only when the push stopped.
            let _ = tx.send((i, cuts));
        });
    }
    Started { batch, done }
}

impl Started {
    /// Waits for every unit and returns the batch (its read bytes dropped: appending needs
    /// only where each unit was) with each unit's chunks, in order.
    fn finish(self) -> (Vec<Unit>, Vec<Result<Vec<Cut>>>) {
        let mut cuts: Vec<Option<Result<Vec<Cut>>>> = (0..self.batch.len()).map(|_| None).collect();
        for _ in 0..cuts.len() {
            let (i, c) = self.done.recv().expect("every started unit sends its chunks");
            cuts[i] = Some(c);
        }
        let Ok(mut batch) = std::sync::Arc::try_unwrap(self.batch) else {
            unreachable!("every unit let go of its batch before it sent its chunks")
        };
        batch.iter_mut().for_each(|u| u.data = None);
        (batch, cuts.into_iter().map(|c| c.expect("received above")).collect())
    }
}

/// What each thread working on a push keeps between units.
struct Worker {
    /// The settings `encoder` was made for.
    settings: (i32, bool, bool, u8),
    encoder: codec::Encoder,
    /// A unit the page cache held, read by this worker.
    data: Vec<u8>,
}

thread_local! {
    /// Made once per thread and reused: a segment-sized buffer and two zstd contexts allocated
    /// per unit cost page faults and address-space lock contention that stopped pushes from
    /// scaling past 8 cores (benches/push_scaling.sh, docs/BENCHMARKS.md).
    static WORKER: std::cell::RefCell<Option<Worker>> = const { std::cell::RefCell::new(None) };
}

/// The files a push reads units from.
struct Reader<'a> {
    entries: &'a [SourceEntry],
    contents: &'a [Option<Content<'a>>],
}

impl Reader<'_> {
    /// Fills `buf` with the bytes at `offset` of entry `file`.
    fn read(&self, file: usize, offset: u64, buf: &mut [u8]) -> Result<()> {
        let content = self.contents[file].as_ref().ok_or_else(|| StoreError::Internal("a read of no file".into()))?;
        content.read_exact_at(buf, offset, &self.entries[file])
    }

    /// Whether the page cache holds `u`'s bytes, as far as its first, middle and last byte
    /// tell without waiting for the disk (memory always does).
    fn cached(&self, u: &Unit) -> bool {
        let Some(Content::File(f)) = &self.contents[u.file] else { return true };
        [u.offset, u.offset + u.len / 2, u.offset + u.len.saturating_sub(1)].into_iter().all(|at| {
            let mut byte = 0u8;
            let iov = libc::iovec { iov_base: (&raw mut byte).cast(), iov_len: 1 };
            // SAFETY: one iovec over `byte`, which lives across the call.
            let n = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, at as libc::off_t, libc::RWF_NOWAIT) };
            // A filesystem that cannot tell (tmpfs before Linux 6.6) keeps files in memory.
            n == 1 || (n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP))
        })
    }
}

/// `batches` with the units whose bytes the page cache lacks read one batch ahead of the
/// caller: while the cores chunk, hash and compress a batch, those of the next are read on
/// threads of `scope`, so that reads waiting for the disk leave no core idle (on two cores, a
/// push of 1 GiB of page images from a cold cache: 2.6 s read by the workers, 2.1 s read
/// ahead). Units the cache holds are left to the workers: copying them ahead too, on more
/// threads than cores, made warm pushes on 16 cores 7 % slower. Units that carry their bytes
/// (streamed pieces) pass as they are. Dropping the returned iterator stops the reads.
fn read_ahead<'scope, 'a: 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    batches: Batches<'a>,
    reader: Option<&'a Reader<'a>>,
) -> mpsc::IntoIter<Result<Vec<Unit>>> {
    let (tx, rx) = mpsc::sync_channel(0);
    scope.spawn(move || {
        for batch in batches {
            let batch = match reader {
                Some(reader) => batch.and_then(|mut units| read_units(&mut units, reader).map(|()| units)),
                None => batch,
            };
            if tx.send(batch).is_err() {
                return;
            }
        }
    });
    rx.into_iter()
}

/// Threads reading a batch ahead, whatever the core count: a push of files from a cold page
/// cache is as fast as the disk reads them, and one thread's reads (the kernel's read-ahead,
/// 128 KiB at a time) were a fraction of what the disk gives several at once (a two-core VM:
/// one `dd` 540 MB/s, four side by side 2.0 GB/s).
const READERS: usize = 4;

/// Reads the units of `units` that lack their bytes and are not in the page cache into kept
/// buffers, on [`READERS`] threads (each reads a run of consecutive units).
fn read_units(units: &mut [Unit], reader: &Reader<'_>) -> Result<()> {
    let per_reader = units.len().div_ceil(READERS).max(1);
    let read_run = |run: &mut [Unit]| -> Result<()> {
        for u in run.iter_mut().filter(|u| u.data.is_none() && !reader.cached(u)) {
            u.data = Some(KEPT.read(u.len as usize, |buf| reader.read(u.file, u.offset, buf))?);
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let mut runs = units.chunks_mut(per_reader);
        let first = runs.next();
        let others: Vec<_> = runs.map(|run| s.spawn(move || read_run(run))).collect();
        let mut result = first.map_or(Ok(()), read_run);
        for h in others {
            let r = h.join().expect("a push's reader does not panic");
            result = result.and(r);
        }
        result
    })
}

fn process_unit(work: &Work<'_>, u: &Unit) -> Result<Vec<Cut>> {
    let deltas = work.deltas;
    let store = deltas.store;
    let cfg = store.config();
    let settings = (cfg.zstd_level, cfg.float_codec, cfg.huffman_lanes, cfg.min_saving);
    WORKER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|w| w.settings != settings) {
            *slot = Some(Worker { settings, encoder: codec::Encoder::for_config(cfg)?, data: Vec::new() });
        }
        let Worker { encoder, data: buf, .. } = slot.as_mut().expect("made above");
        let data: &[u8] = match (&u.data, work.reader) {
            (Some(data), _) => data,
            (None, Some(reader)) => {
                buf.resize(u.len as usize, 0);
                reader.read(u.file, u.offset, buf)?;
                buf
            }
            (None, None) => return Err(StoreError::Internal("a streamed piece without its bytes".into())),
        };
        // The chunk before, in this segment: in the parent image, what followed it is a
        // likely base for a changed chunk.
        let mut before: Option<ObjectId> = None;
        // A tensor file the parent image holds at the same size is cut where it was cut there, each
        // chunk then tried as an XOR delta against the parent's chunk at the same place.
        let aligned = work.reader.and_then(|r| {
            let e = &r.entries[u.file];
            deltas.aligned_spans(&e.rel, e.size, u.offset, u.len)
        });
        let spans: Vec<(chunker::Span, Option<ChunkRef>)> = match aligned {
            Some(spans) => spans.into_iter().map(|(span, c)| (span, Some(c))).collect(),
            None => chunker::cut_segment(data, cfg).into_iter().map(|span| (span, None)).collect(),
        };
        spans
            .into_iter()
            .map(|(span, parent)| {
                let at = u.offset + span.start as u64;
                let plain = &data[span];
                let id = store.chunk_ids().id(plain);
                let before = before.replace(id);
                let zero = codec::is_all_zero(plain);
                let found = if zero { None } else { store.index().locate_for_dedup(&id)? };
                let found_in = match found {
                    // A stored delta is relied on only with its base (whose pack the lease must
                    // name too); otherwise the chunk is stored anew.
                    Some(l) if !deltas.bases_are_reliable(l.bases)? => None,
                    Some(l) if work.vet_found && !deltas.vet(l.pack)? => None,
                    other => other.map(|l| l.pack),
                };
                let mut cut =
                    Cut { id, len: plain.len() as u32, zero, stored: None, found_in, bases: None, sketch: None };
                if zero || found_in.is_some() {
                    return Ok(cut);
                }
                let (codec, stored) = encoder.encode(plain);
                let sketch = if u.page_image { similar::sketch(plain, at) } else { None };
                let aligned = match &parent {
                    Some(p) => deltas.encode_aligned(encoder, plain, p, stored.len())?,
                    None => None,
                };
                let delta = match (&sketch, aligned) {
                    (_, Some(d)) => Some(d),
                    (Some(sketch), None) => deltas.encode(encoder, &id, plain, at, before, sketch, stored.len())?,
                    (None, None) => None,
                };
                match delta {
                    Some((bases, delta)) => {
                        cut.stored = Some((Codec::Delta, delta));
                        cut.bases = Some(bases);
                    }
                    None => {
                        cut.stored = Some((codec, stored));
                        cut.sketch = sketch;
                    }
                }
                Ok(cut)
            })
            .collect()
    })
}

/// Stores a new image's manifest and returns its id: refused first when readers would refuse
/// it ([`Manifest::validate`]: nothing is stored or tagged), or when what the lease protects
/// may have gone while it was removed ([`Lease::confirm`]); then named in the lease, then
/// written. A manifest is named by its content, so an identical one may exist already with a
/// gc tombstone and be deleted any moment (docs/GC.md, push step 5): then the creation time
/// moves on a second, giving a new id, until the id has no tombstone.
pub(crate) fn store_manifest(store: &Store, lease: &Lease, manifest: &mut Manifest) -> Result<ObjectId> {
    manifest.validate()?;
    lease.confirm()?;
    loop {
        let bytes = manifest.encode();
        let id = ObjectId::of(&bytes);
        lease.protect(&[], &[id])?;
        if !lease::has_tombstone(store.backend(), &ObjectKey::Manifest(id))? {
            store.put_manifest(&id, bytes)?;
            return Ok(id);
        }
        manifest.created_unix += 1;
    }
}

/// Stores a pack this push wrote, naming it in the lease first (docs/GC.md, push step 2).
pub(crate) fn write_pack(store: &IndexedStore, lease: &Lease, p: FinishedPack) -> Result<()> {
    lease.protect(&[p.id], &[])?;
    store.put_pack(p)
}

/// Names the packs this push deduplicated against in its lease, then uploads again every
/// chunk it relied on in a pack that gc has tombstoned or deleted meanwhile (docs/GC.md, push
/// step 4). Returns how many chunks were uploaded again.
fn reupload_unreliable(
    store: &IndexedStore,
    lease: &Lease,
    reader: &Reader<'_>,
    mut relied: HashMap<ObjectId, Vec<Relied>>,
) -> Result<u64> {
    if relied.is_empty() {
        return Ok(0);
    }
    let packs: Vec<ObjectId> = relied.keys().copied().collect();
    lease.protect(&packs, &[])?;
    let (bad, doomed) = lease::unreliable_packs(store.backend(), &packs.iter().copied().collect())?;
    let index = store.index();
    index.set_doomed(&doomed)?;
    let cfg = store.config();
    let mut encoder = codec::Encoder::for_config(cfg)?;
    let mut pack = PackFill::new(store);
    let mut seen = HashSet::new();
    let mut n = 0;
    let flush = |pack: PackBuilder| write_pack(store, lease, pack.finish());
    let mut bad: Vec<ObjectId> = bad.into_iter().collect();
    bad.sort();
    for p in bad {
        if !doomed.contains(&p) {
            index.remove_pack(&p)?;
        }
        for r in relied.remove(&p).unwrap_or_default() {
            if !seen.insert(r.id) {
                continue;
            }
            let mut data = vec![0u8; r.len as usize];
            reader.read(r.file, r.offset, &mut data)?;
            if store.chunk_ids().id(&data) != r.id {
                let path = reader.entries[r.file].abs.display();
                return Err(StoreError::Conflict(format!(
                    "{path} changed while it was being pushed: push it again once it is still"
                )));
            }
            let (codec, stored) = encoder.encode(&data);
            pack.push_owned(r.id, codec, stored, r.len);
            n += 1;
            if let Some(full) = pack.full() {
                flush(full)?;
            }
        }
    }
    if let Some(last) = pack.last() {
        flush(last)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::repo::location::StoreLocation;

    #[test]
    fn a_manifest_id_with_a_tombstone_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::memory();
        let loc = StoreLocation::Custom { description: "memory".into(), dir: dir.path().to_path_buf() };
        Store::init_backend(&b, &loc, &crate::StoreConfig::default()).unwrap();
        let store = Store::open_backend(b.clone(), &loc).unwrap();
        let mut m = Manifest { created_unix: 100, meta: BTreeMap::new(), entries: Vec::new(), chunks: Vec::new() };
        let first = ObjectId::of(&m.encode());
        // gc tombstoned an identical manifest: the push must take another id.
        b.put(&ObjectKey::Manifest(first).tombstone(), b"{}".to_vec()).unwrap();
        let lease = Lease::take(&b, "push t").unwrap();
        let id = store_manifest(&store, &lease, &mut m).unwrap();
        assert_ne!(id, first);
        assert_eq!(store.get_manifest(&id).unwrap(), m);
        assert_eq!((m.created_unix, ObjectId::of(&m.encode())), (101, id));
        let rec: crate::format::lease::LeaseRecord =
            crate::format::lease::LeaseRecord::from_json(&b.get(lease.key()).unwrap(), &lease.key().to_string())
                .unwrap();
        assert!(rec.manifest_ids().any(|m| m == id), "the new id is leased");
    }

    proptest::proptest! {
        #[test]
        fn pieces_read_as_their_concatenation(
            parts in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 0..8),
            at in 0usize..400,
            len in 0usize..100,
        ) {
            let whole: Vec<u8> = parts.concat();
            let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
            let mut starts = Vec::new();
            let mut size = 0u64;
            for p in &slices {
                starts.push(size);
                size += p.len() as u64;
            }
            let content = Content::Pieces { parts: &slices, starts };
            let entry = SourceEntry::in_memory("f", size);
            let mut buf = vec![0u8; len];
            let r = content.read_exact_at(&mut buf, at as u64, &entry);
            if at + len <= whole.len() {
                proptest::prop_assert!(r.is_ok());
                proptest::prop_assert_eq!(&buf[..], &whole[at..at + len]);
            } else {
                proptest::prop_assert!(r.is_err());
            }
        }
    }

    #[test]
    fn a_file_the_page_cache_lacks_is_read_ahead_into_the_same_image() {
        let dir = tempfile::tempdir().unwrap();
        // More than one batch of units (16 MiB segments, batches of at least 64 MiB).
        let data: Vec<u8> = (0..70u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let file = dir.path().join("pages-1.img");
        std::fs::write(&file, &data).unwrap();
        let silent = crate::progress::Silent;
        let pushed = |name: &str| {
            let loc = StoreLocation::Local(dir.path().join(name));
            Store::init(&loc, &crate::StoreConfig::default()).unwrap();
            let store = Store::open_indexed(&loc, &|_| {}).unwrap();
            let r = push(&store, &file, &TagRef::parse("m:x").unwrap(), BTreeMap::new(), &silent).unwrap();
            store.get_manifest(&r.manifest).unwrap().chunks
        };
        let from_cache = pushed("cached");
        // Out of the page cache, as after a reboot: every unit is read ahead.
        let f = std::fs::File::open(&file).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice on an open descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let entries = source::scan(&file).unwrap();
        let contents = open_files(&entries).unwrap();
        let reader = Reader { entries: &entries, contents: &contents };
        let units = plan_units(&entries, &crate::StoreConfig::default());
        assert!(units.len() > 4 && units.iter().all(|u| !reader.cached(u)), "the file left the page cache");
        assert_eq!(pushed("uncached"), from_cache, "read ahead, the file is cut into the same chunks");
        assert_eq!(from_cache.iter().map(|c| c.len as usize).sum::<usize>(), data.len());
    }

    #[test]
    fn a_file_that_shrank_before_it_was_read_ahead_fails_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pages-1.img");
        std::fs::write(&file, vec![7u8; 20 << 20]).unwrap();
        let entries = source::scan(&file).unwrap();
        let contents = open_files(&entries).unwrap();
        let mut units = plan_units(&entries, &crate::StoreConfig::default());
        std::fs::File::options().write(true).open(&file).unwrap().set_len(1 << 20).unwrap();
        let reader = Reader { entries: &entries, contents: &contents };
        let e = read_units(&mut units, &reader).unwrap_err();
        assert!(e.to_string().contains("pages-1.img shrank while it was being pushed"), "{e}");
    }

    #[test]
    fn pieces_push_as_the_file_they_make_up() {
        let dir = tempfile::tempdir().unwrap();
        let loc = StoreLocation::Local(dir.path().join("store"));
        Store::init(&loc, &crate::StoreConfig::default()).unwrap();
        let store = Store::open_indexed(&loc, &|_| {}).unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let file = dir.path().join("model.bin");
        std::fs::write(&file, &data).unwrap();
        let silent = crate::progress::Silent;
        let a = push(&store, &file, &TagRef::parse("m:file").unwrap(), BTreeMap::new(), &silent).unwrap();
        let pieces = vec![&data[..10], &data[10..10], &data[10..1_234_567], &data[1_234_567..]];
        let files = vec![("model.bin".to_string(), pieces)];
        let b = push_pieces(&store, &files, &TagRef::parse("m:pieces").unwrap(), BTreeMap::new(), &silent).unwrap();
        assert_eq!((b.new_chunks, b.logical_bytes, b.entries), (0, data.len() as u64, 1), "every chunk deduplicated");
        let chunks = |r: &PushReport| store.get_manifest(&r.manifest).unwrap().chunks;
        assert_eq!(chunks(&a), chunks(&b));
        let bad = vec![("../x".to_string(), vec![&data[..1]])];
        let e = push_pieces(&store, &bad, &TagRef::parse("m:bad").unwrap(), BTreeMap::new(), &silent).unwrap_err();
        assert!(e.to_string().contains("../x"), "{e}");
        let twice = vec![("a".to_string(), vec![&data[..1]]), ("a".to_string(), vec![&data[..1]])];
        let e = push_pieces(&store, &twice, &TagRef::parse("m:twice").unwrap(), BTreeMap::new(), &silent).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }
}
