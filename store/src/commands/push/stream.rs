//! Pushes fed while they run ([`crate::commands::push::push_stream`]): other threads hand over files
//! piece by piece (CRIU's image files arriving through pipes while a process is dumped, say),
//! and the push chunks, stores and indexes them as they come.
//!
//! A file's pieces are whole segments ([`crate::StoreConfig::segment_size`]) but its last, so
//! a streamed file is cut into the same chunks as the same bytes pushed from disk, and the two
//! deduplicate against each other. At most about `buffer` bytes wait between the feeders and
//! the push; past that a feeder waits.

use crate::commands::push::source::Unit;
use crate::commands::push::source::{self, SourceEntry};
use crate::dedup::similar;
use crate::error::{Result, StoreError};
use crate::format::manifest::EntryKind;
use crate::format::meta::ImageMeta;
use crate::repo::indexed::IndexedStore;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Mutex;

/// What feeders send to the push.
enum Streamed {
    /// A new entry (a file, directory or symlink); entries are numbered from 0 in the order
    /// they arrive.
    Entry { path: String, kind: EntryKind, mode: u32, target: Option<String> },
    /// The next piece of file number `file`.
    Piece { file: usize, data: Vec<u8> },
    /// Every file is complete; the manifest gets this metadata.
    End(Box<ImageMeta>),
}

/// The two ends of a streamed push into `store`, with at most about `buffer` bytes waiting
/// between them (two segments at least).
pub fn channel(store: &IndexedStore, buffer: u64) -> (StreamSink, StreamSource) {
    let segment = store.config().segment_size.max(1);
    let (tx, rx) = mpsc::sync_channel((buffer / segment).max(2) as usize);
    (StreamSink { tx, segment: segment as usize, files: Mutex::default() }, StreamSource { rx })
}

/// Pushes image `tag` fed by `feed` on this thread while the push runs beside it, with at
/// most about `buffer` bytes between them; `feed` finishes the sink (or drops it, and nothing
/// is tagged). When both fail, the error that says why is returned ([`outcome`]).
pub fn push_fed<T, E: From<StoreError>>(
    store: &IndexedStore,
    tag: &crate::TagRef,
    buffer: u64,
    progress: &dyn crate::progress::Progress,
    feed: impl FnOnce(StreamSink) -> std::result::Result<T, E>,
) -> std::result::Result<(crate::commands::push::PushReport, T), E> {
    let (sink, source) = channel(store, buffer);
    std::thread::scope(|s| {
        let pushing = s.spawn(|| crate::commands::push::push_stream(store, source, tag, progress));
        let fed = feed(sink);
        let pushed = pushing.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        outcome(pushed, fed)
    })
}

/// How a streamed push and its feeding went, together: when both failed, a push that failed
/// on its own says why (the feeding only met its end), and a push stopped by the feeding
/// leaves the feeding's error.
pub fn outcome<T, E: From<StoreError>>(
    pushed: Result<crate::commands::push::PushReport>,
    fed: std::result::Result<T, E>,
) -> std::result::Result<(crate::commands::push::PushReport, T), E> {
    match (pushed, fed) {
        (Ok(r), Ok(t)) => Ok((r, t)),
        (Err(StoreError::StreamStopped), Err(e)) => Err(e),
        (Err(e), _) => Err(e.into()),
        (Ok(_), Err(e)) => Err(e),
    }
}

/// The feeding end of a streamed push: files are added and filled from any thread.
pub struct StreamSink {
    tx: SyncSender<Streamed>,
    segment: usize,
    /// The paths of the entries added so far.
    files: Mutex<HashSet<String>>,
}

impl StreamSink {
    /// Adds a regular file at `path` (relative, `/`-separated, no `.` or `..` parts) with
    /// permission bits `mode`, to be filled through the returned [`StreamedFile`].
    pub fn file(&self, path: &str, mode: u32) -> Result<StreamedFile<'_>> {
        let index = self.entry(path, EntryKind::File, mode, None)?;
        Ok(StreamedFile { sink: self, index, path: path.to_string() })
    }

    /// Adds a directory at `path` with permission bits `mode` (its parents need not have
    /// been added).
    pub fn dir(&self, path: &str, mode: u32) -> Result<()> {
        self.entry(path, EntryKind::Dir, mode, None).map(drop)
    }

    /// Adds a symlink at `path` pointing at `target`.
    pub fn symlink(&self, path: &str, target: &str) -> Result<()> {
        self.entry(path, EntryKind::Symlink, 0o777, Some(target.to_string())).map(drop)
    }

    /// Adds every entry below `root` (as a push of the directory finds them) but those whose
    /// path is in `skip`, files read from disk to their ends.
    pub fn tree(&self, root: &Path, skip: &HashSet<String>) -> Result<()> {
        for e in source::scan(root)?.into_iter().filter(|e| !skip.contains(&e.rel)) {
            match e.kind {
                EntryKind::Dir => self.dir(&e.rel, e.mode)?,
                EntryKind::Symlink => self.symlink(&e.rel, e.target.as_deref().unwrap_or_default())?,
                EntryKind::File => {
                    let mut f = std::fs::File::open(&e.abs).map_err(|err| StoreError::io("reading", &e.abs, err))?;
                    self.file(&e.rel, e.mode)?.read_from(&mut f)?;
                }
            }
        }
        Ok(())
    }

    /// Adds an entry; returns its number.
    fn entry(&self, path: &str, kind: EntryKind, mode: u32, target: Option<String>) -> Result<usize> {
        crate::format::manifest::check_relative_path(path)
            .map_err(|why| StoreError::Entry { entry: format!("streamed {} {path:?}", kind.name()), why })?;
        let mut files = self.files.lock().expect("streamed files lock");
        if !files.insert(path.to_string()) {
            return Err(StoreError::Entry { entry: format!("streamed entry {path:?}"), why: "arrived twice".into() });
        }
        // Sent under the lock: the push numbers entries in the order it receives them.
        self.send(Streamed::Entry { path: path.to_string(), kind, mode, target })?;
        Ok(files.len() - 1)
    }

    /// Says that every file is complete, adding `meta` to the image's metadata: the push then
    /// writes the image and its tag. A sink dropped without this fails the push.
    pub fn finish(self, meta: ImageMeta) -> Result<()> {
        self.send(Streamed::End(Box::new(meta)))
    }

    fn send(&self, s: Streamed) -> Result<()> {
        self.tx.send(s).map_err(|_| {
            StoreError::Internal("the push fed by this stream has stopped (its own error says why)".into())
        })
    }
}

/// One file of a streamed push, filled in order.
pub struct StreamedFile<'a> {
    sink: &'a StreamSink,
    index: usize,
    path: String,
}

impl StreamedFile<'_> {
    /// Reads `r` to its end into the file, a segment at a time; returns the bytes read.
    pub fn read_from(&mut self, r: &mut dyn Read) -> Result<u64> {
        let mut total = 0;
        loop {
            let mut data = crate::memory::fresh_buffer(self.sink.segment);
            let n = r
                .take(self.sink.segment as u64)
                .read_to_end(&mut data)
                .map_err(|e| StoreError::io("receiving", &self.path, e))?;
            total += n as u64;
            if n > 0 {
                self.sink.send(Streamed::Piece { file: self.index, data })?;
            }
            if n < self.sink.segment {
                return Ok(total);
            }
        }
    }
}

/// The receiving end of a streamed push, for [`crate::commands::push::push_stream`].
pub struct StreamSource {
    rx: Receiver<Streamed>,
}

/// What a stream delivered besides its pieces: its files (sizes as received) and the
/// metadata it ended with.
#[derive(Default)]
pub(crate) struct Received(Mutex<(Vec<SourceEntry>, ImageMeta)>);

impl Received {
    /// The files and metadata, taken out.
    pub(crate) fn take(&self) -> (Vec<SourceEntry>, ImageMeta) {
        std::mem::take(&mut *self.0.lock().expect("received files lock"))
    }
}

impl StreamSource {
    /// The stream's pieces as the push's units, in batches of up to about `batch_bytes`: a
    /// batch waits for one piece per worker thread (or the end), then takes what is waiting.
    /// Files and metadata go into `received`. A stream whose sink went without
    /// [`StreamSink::finish`] ends with an error.
    pub(crate) fn batches(
        self,
        batch_bytes: u64,
        received: &Received,
    ) -> impl Iterator<Item = Result<Vec<Unit>>> + Send + '_ {
        let min_units = rayon::current_num_threads();
        let mut ended = false;
        std::iter::from_fn(move || {
            if ended {
                return None;
            }
            let mut batch = Vec::new();
            let mut bytes = 0;
            while bytes < batch_bytes {
                let next = if batch.len() < min_units {
                    self.rx.recv().ok()
                } else {
                    match self.rx.try_recv() {
                        Ok(s) => Some(s),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => None,
                    }
                };
                let mut got = received.0.lock().expect("received files lock");
                match next {
                    None => {
                        ended = true;
                        return Some(Err(StoreError::StreamStopped));
                    }
                    Some(Streamed::End(meta)) => {
                        got.1 = *meta;
                        ended = true;
                        break;
                    }
                    Some(Streamed::Entry { path, kind, mode, target }) => {
                        got.0.push(SourceEntry { abs: PathBuf::from(&path), rel: path, kind, mode, size: 0, target })
                    }
                    Some(Streamed::Piece { file, data }) => {
                        let entry = &mut got.0[file];
                        let len = data.len() as u64;
                        let page_image = similar::is_page_image_path(&entry.rel);
                        batch.push(Unit { file, offset: entry.size, len, page_image, data: Some(data.into()) });
                        entry.size += len;
                        bytes += len;
                    }
                }
            }
            (!batch.is_empty() || !ended).then_some(Ok(batch))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::push::{self, PushReport};
    use crate::format::meta::Kind;
    use crate::progress::Silent;
    use crate::repo::location::StoreLocation;
    use crate::Store;
    use crate::TagRef;

    fn store(dir: &std::path::Path) -> IndexedStore {
        let loc = StoreLocation::Local(dir.join("store"));
        Store::init(&loc, &crate::StoreConfig::default()).unwrap();
        Store::open_indexed(&loc, &|_| {}).unwrap()
    }

    /// Bytes that chunk well and compress a little.
    fn data(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8 & 0x3f).collect()
    }

    /// Pushes `files` as a stream, each fed on its own thread, side by side; the sink finishes
    /// (with metadata) or is dropped.
    fn push_streamed(store: &IndexedStore, files: &[(&str, Vec<u8>)], tag: &str, finish: bool) -> Result<PushReport> {
        let (sink, source) = channel(store, 64 << 20);
        let tag = TagRef::parse(tag).unwrap();
        std::thread::scope(|s| {
            let pushing = s.spawn(|| push::push_stream(store, source, &tag, &Silent));
            std::thread::scope(|feeders| {
                for (path, bytes) in files {
                    let sink = &sink;
                    feeders.spawn(move || {
                        let mut f = sink.file(path, 0o600).unwrap();
                        // A pipe gives short reads: so does this reader.
                        let mut r = std::io::BufReader::with_capacity(4097, &bytes[..]);
                        assert_eq!(f.read_from(&mut r).unwrap(), bytes.len() as u64);
                    });
                }
            });
            if finish {
                let meta = ImageMeta::of_kind(Kind::CpuProcess);
                sink.finish(meta).unwrap();
            } else {
                drop(sink);
            }
            pushing.join().unwrap()
        })
    }

    #[test]
    fn a_streamed_image_is_the_image_of_the_same_files_pushed_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let files = [("pages-1.img", data(40 << 20, 1)), ("pagemap-1.img", data(3000, 2)), ("empty.img", Vec::new())];
        let streamed = push_streamed(&store, &files, "s:1", true).unwrap();
        assert_eq!((streamed.entries, streamed.logical_bytes), (3, (40 << 20) + 3000));
        let tree = dir.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        for (path, bytes) in &files {
            std::fs::write(tree.join(path), bytes).unwrap();
        }
        let pushed = push::push(&store, &tree, &TagRef::parse("s:2").unwrap(), ImageMeta::default(), &Silent).unwrap();
        assert_eq!(pushed.new_chunks, 0, "every chunk of the same bytes was already stored by the stream");
        let manifest = |r: &PushReport| store.get_manifest(&r.manifest).unwrap();
        let (a, b) = (manifest(&streamed), manifest(&pushed));
        assert_eq!(a.chunks, b.chunks);
        let paths = |m: &crate::format::manifest::Manifest| {
            m.entries.iter().map(|e| (e.path.clone(), e.size)).collect::<Vec<_>>()
        };
        assert_eq!(paths(&a), paths(&b), "files in path order, sizes as streamed");
        assert!(a.entries.iter().all(|e| e.mode == 0o600));
        assert_eq!(a.meta.kind, Some(Kind::CpuProcess), "the metadata the stream ended with");
    }

    #[test]
    fn a_stream_that_stops_unfinished_tags_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let e = push_streamed(&store, &[("pages-1.img", data(5 << 20, 3))], "s:1", false).unwrap_err();
        assert!(e.to_string().contains("stopped before it was complete"), "{e}");
        assert!(store.get_tag(&TagRef::parse("s:1").unwrap()).unwrap().is_none());
        let (sink, _source) = channel(&store, 1 << 20);
        let _f = sink.file("a", 0o600).unwrap();
        assert!(sink.file("a", 0o600).err().unwrap().to_string().contains("arrived twice"));
        assert!(sink.file("../a", 0o600).is_err());
    }

    #[test]
    fn a_stream_relies_only_on_packs_it_has_vetted() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let files = [("weights.bin", data(8 << 20, 4))];
        let first = push_streamed(&store, &files, "s:1", true).unwrap();
        let again = push_streamed(&store, &files, "s:2", true).unwrap();
        assert_eq!(again.new_chunks, 0, "the same bytes deduplicate");
        // gc tombstones the packs meanwhile: a stream cannot read its bytes again at the end,
        // so it stores the chunks anew rather than rely on packs about to go.
        let packs = store.backend().list("packs/").unwrap();
        assert!(!packs.is_empty());
        for p in &packs {
            store.backend().put(&p.key.tombstone(), b"{}".to_vec()).unwrap();
        }
        let third = push_streamed(&store, &files, "s:3", true).unwrap();
        assert_eq!(third.new_chunks, first.new_chunks, "every chunk stored again");
        assert_eq!(third.reuploaded_chunks, 0);
    }
}
