//! Seeds: directories a restore node already holds (an earlier restore of the same image, or
//! of an image sharing most of its chunks) whose bytes a directory restore copies instead of
//! fetching them from the store.
//!
//! A seed's files are cut into chunks exactly as a push cuts a file (fixed segments, FastCDC
//! inside each, the store's chunk sizes) and each chunk is hashed as the store names chunks
//! (keyed on an encrypted store). A chunk of the image whose id is among them, wherever it lies
//! in the seed (another file, another offset), is read from there, hashed again (the seed may
//! have changed since it was indexed) and written; only the others are fetched, and a fetched
//! delta chunk whose base the seed holds takes the base from there. A seed is only
//! ever read, never trusted: a file that changed, vanished or cannot be read costs a fetch,
//! never a wrong byte.

use crate::handles::{self, Handles};
use crate::plan::{PlannedChunk, RangeRead, Target};
use gstore_store::dedup::chunker;
use gstore_store::progress::{Progress, Unit};
use gstore_store::{ChunkIds, ObjectId, Result, StoreConfig, StoreError};
use rayon::prelude::*;
use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where a chunk lies in a seed: the file, its offset there, its length.
#[derive(Debug, Clone, Copy)]
struct Place {
    file: u32,
    offset: u64,
    len: u32,
}

/// The chunks of one or more seed directories, by id.
pub struct Seed {
    /// The seed's files.
    files: Vec<PathBuf>,
    /// Those open now: each is opened as it is read, a bounded number at a time.
    open: Handles,
    chunks: HashMap<ObjectId, Place>,
    /// Bytes of the seed's files read to index them.
    indexed_bytes: u64,
}

impl Seed {
    /// Indexes the regular files below `dirs` (symlinks are not followed) for a store with
    /// chunk sizes `cfg` and chunk ids `ids`. A seed that is not a directory is an error;
    /// a file inside it that cannot be opened is passed over.
    pub fn index(dirs: &[PathBuf], cfg: &StoreConfig, ids: &ChunkIds, progress: &dyn Progress) -> Result<Seed> {
        let mut files = Vec::new();
        for dir in dirs {
            match fs::symlink_metadata(dir) {
                Ok(md) if md.is_dir() => collect_files(dir, &mut files)?,
                Ok(_) => {
                    return Err(StoreError::Path { path: dir.to_path_buf(), why: "the seed is not a directory".into() })
                }
                Err(e) => return Err(StoreError::io("reading seed", dir, e)),
            }
        }
        let segments: Vec<(u32, std::ops::Range<u64>)> = files
            .iter()
            .enumerate()
            .flat_map(|(i, (_, len))| chunker::segments(*len, cfg).into_iter().map(move |s| (i as u32, s)))
            .collect();
        let indexed_bytes: u64 = files.iter().map(|(_, len)| len).sum();
        progress.start("indexing seed", indexed_bytes, Unit::Bytes);
        let files: Vec<PathBuf> = files.into_iter().map(|(path, _)| path).collect();
        let open = Handles::new(handles::open_limit());
        let found: Vec<Vec<(ObjectId, Place)>> = segments
            .par_iter()
            .map_init(Vec::new, |buf, (file, range)| {
                buf.resize((range.end - range.start) as usize, 0);
                let read = read_at(&open, &files, *file, buf, range.start);
                progress.advance(range.end - range.start);
                // A file that shrank since it was listed gives nothing from here on.
                let Ok(()) = read else { return Vec::new() };
                chunker::cut_segment(buf, cfg)
                    .into_iter()
                    .map(|span| {
                        let place =
                            Place { file: *file, offset: range.start + span.start as u64, len: span.len() as u32 };
                        (ids.id(&buf[span]), place)
                    })
                    .collect()
            })
            .collect();
        progress.finish();
        Ok(Seed { files, open, chunks: found.into_iter().flatten().collect(), indexed_bytes })
    }

    /// Bytes read to index the seed.
    pub fn indexed_bytes(&self) -> u64 {
        self.indexed_bytes
    }

    /// Copies chunk `c` from the seed to each of its targets through `write`, if the seed holds
    /// it (checked against its id as it is read). False when it does not, or when reading or
    /// writing failed: the chunk is then fetched (and a failing write reported) as any other.
    pub fn copy(&self, c: &PlannedChunk, ids: &ChunkIds, write: impl Fn(Target, &[u8]) -> Result<()>) -> bool {
        match self.read(&c.id) {
            Some(buf) if buf.len() == c.loc.plain_len as usize && ids.id(&buf) == c.id => {
                c.targets.iter().all(|&t| write(t, &buf).is_ok())
            }
            _ => false,
        }
    }

    /// The delta bases of `read`'s chunks that the seed holds, with their bytes as read (the
    /// store checks them against their ids: [`gstore_store::IndexedStore::offer_bases`]).
    pub fn bases_of(&self, read: &RangeRead) -> Vec<(ObjectId, Vec<u8>)> {
        let mut ids: Vec<ObjectId> = read.chunks.iter().filter_map(|c| c.loc.bases).flat_map(|b| b.iter()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().filter_map(|id| Some((id, self.read(&id)?))).collect()
    }

    /// The bytes where the seed held chunk `id` when it was indexed (unchecked), if it did and
    /// they can still be read.
    fn read(&self, id: &ObjectId) -> Option<Vec<u8>> {
        let place = self.chunks.get(id)?;
        let mut buf = vec![0u8; place.len as usize];
        read_at(&self.open, &self.files, place.file, &mut buf, place.offset).ok()?;
        Some(buf)
    }
}

/// Fills `buf` from `offset` of seed file `file` (one of `files`, opened through `open`).
fn read_at(open: &Handles, files: &[PathBuf], file: u32, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let path = &files[file as usize];
    open.get(file as usize, || open_file(path))?.read_exact_at(buf, offset)
}

/// Opens seed file `path` for reading, never through a symlink.
fn open_file(path: &Path) -> std::io::Result<File> {
    fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Lists every regular file below `dir` (not following symlinks) that can be opened, with its
/// length; each is closed again, and opened as it is read.
fn collect_files(dir: &Path, files: &mut Vec<(PathBuf, u64)>) -> Result<()> {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let rd = fs::read_dir(&d).map_err(|e| StoreError::io("reading seed", &d, e))?;
        for item in rd.flatten() {
            let Ok(ft) = item.file_type() else { continue };
            if ft.is_dir() {
                todo.push(item.path());
            } else if ft.is_file() {
                if let Ok(f) = open_file(&item.path()) {
                    let len = f.metadata().map_or(0, |md| md.len());
                    if len > 0 {
                        files.push((item.path(), len));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gstore_store::codec::Codec;
    use gstore_store::progress::Silent;
    use gstore_store::repo::index::ChunkLocation;
    use std::sync::Mutex;

    fn noise(n: usize, seed: u8) -> Vec<u8> {
        let mut v = vec![0u8; n];
        blake3::Hasher::new().update(&[seed]).finalize_xof().fill(&mut v);
        v
    }

    /// The planned chunk of `plain` going to entry 0 at offset 7.
    fn planned(plain: &[u8], ids: &ChunkIds) -> PlannedChunk {
        let loc = ChunkLocation {
            pack: ObjectId::of(b"pack"),
            offset: 0,
            stored_len: plain.len() as u32,
            plain_len: plain.len() as u32,
            codec: Codec::Raw,
            bases: None,
        };
        PlannedChunk { id: ids.id(plain), loc, targets: [(0, 7)].into() }
    }

    #[test]
    fn a_seed_gives_the_chunks_it_holds_and_nothing_once_it_changed() {
        let cfg = StoreConfig::default();
        let ids = ChunkIds::Keyed([9; 32]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let data = noise(3 << 20, 1);
        std::fs::write(dir.path().join("sub/file"), &data).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let seed = Seed::index(&[dir.path().to_path_buf()], &cfg, &ids, &Silent).unwrap();
        assert_eq!(seed.indexed_bytes(), data.len() as u64, "the symlink is not followed");

        // The first chunk as a push cuts it is found and copied to its target.
        let first = &data[chunker::cut_segment(&data, &cfg)[0].clone()];
        let written = Mutex::new(Vec::new());
        let write = |t: Target, b: &[u8]| {
            written.lock().unwrap().push((t, b.to_vec()));
            Ok(())
        };
        assert!(seed.copy(&planned(first, &ids), &ids, write));
        assert_eq!(*written.lock().unwrap(), vec![((0, 7), first.to_vec())]);
        // Bytes cut elsewhere are not a chunk of the seed.
        assert!(!seed.copy(&planned(&data[1..first.len() + 1], &ids), &ids, write));

        // Changed after it was indexed: the chunk is checked again as it is read.
        std::fs::write(dir.path().join("sub/file"), noise(3 << 20, 2)).unwrap();
        assert!(!seed.copy(&planned(first, &ids), &ids, write));
        assert_eq!(written.lock().unwrap().len(), 1, "nothing more was written");
    }

    #[test]
    fn a_seed_that_is_no_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = Seed::index(&[file], &StoreConfig::default(), &ChunkIds::Plain, &Silent).err().unwrap();
        assert!(err.to_string().contains("is not a directory"), "{err}");
        let err = Seed::index(&[dir.path().join("gone")], &StoreConfig::default(), &ChunkIds::Plain, &Silent);
        assert!(err.err().unwrap().to_string().contains("gone"));
    }
}
