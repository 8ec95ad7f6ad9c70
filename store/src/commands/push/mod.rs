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

mod packs;
mod read;
pub(crate) mod source;
pub mod stream;

use crate::codec::{self, Codec, DeltaBases};
use crate::commands::pack_fill::{Filled, PackFill};
use crate::dedup::chunker;
use crate::dedup::deltas::Deltas;
use crate::dedup::similar::{self, Sketch};
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::ObjectKey;
use crate::format::manifest::{ChunkRef, Entry, EntryKind, Manifest};
use crate::format::meta::ImageMeta;
use crate::format::now_unix;
use crate::format::tag::{TagRecord, TagRef};
use crate::progress::Progress;
use crate::repo::indexed::IndexedStore;
use crate::repo::leases::{self as lease, Lease};
use crate::repo::store::Store;
pub(crate) use packs::write_pack;
use packs::{join_writers, pack_writer, PackQueue};
use read::{open_files, read_ahead, Content, Reader};
use serde::Serialize;
use source::{SourceEntry, Unit};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
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
    meta: ImageMeta,
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
    meta: ImageMeta,
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
    meta: ImageMeta,
    progress: &dyn Progress,
) -> Result<PushReport> {
    tag.check_new()?;
    let mut names = HashSet::new();
    let mut entries = Vec::with_capacity(files.len());
    let mut contents = Vec::with_capacity(files.len());
    for (path, parts) in files {
        crate::format::manifest::check_relative_path(path)
            .map_err(|why| StoreError::Entry { entry: format!("file {path:?}"), why })?;
        if !names.insert(path.as_str()) {
            return Err(StoreError::Entry { entry: format!("file {path:?}"), why: "given twice".into() });
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
    push_entries(store, Input::Stream(source), false, tag, ImageMeta::default(), progress)
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

fn push_entries(
    store: &IndexedStore,
    input: Input<'_>,
    dry_run: bool,
    tag: &TagRef,
    mut meta: ImageMeta,
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
    let (tx, rx) = mpsc::sync_channel::<Filled>(writers);
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
        let parent = meta.parent.as_deref().and_then(|p| TagRef::parse(p).ok());
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

/// A stream's files in path order, with `file_chunks` (in arrival order) put in the same
/// order; the metadata the stream ended with goes into `meta`.
fn streamed_in_order(
    streamed: &stream::Received,
    meta: &mut ImageMeta,
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

/// The manifest of a push of `entries`, whose chunks are `file_chunks` (one list per entry),
/// with metadata `meta`, created now (or at `SOURCE_DATE_EPOCH`).
fn manifest_of(entries: &[SourceEntry], file_chunks: Vec<Vec<ChunkRef>>, meta: ImageMeta) -> Manifest {
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
    let flush = |f: Filled| write_pack(store, lease, f.pack.finish(), &f.sketches);
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
mod tests;
