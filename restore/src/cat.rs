//! One file of an image read as a stream (`gstore cat`, archives and registry blobs written
//! from images): a window of the file at a time restored into memory by the restore engine
//! (chunks read as merged ranges from many threads, checked and decoded, as a restore does),
//! and handed out in order, so memory stays bounded by the window whatever the file's size.

use crate::budget::Budget;
use crate::host::restore_to_memory;
use gstore_store::format::manifest::{EntryKind, Manifest};
use gstore_store::progress::Silent;
use gstore_store::ObjectKind;
use gstore_store::{IndexedStore, Result, StoreError};
use std::io::{Read, Write};

/// Bytes of the file restored at a time, and the restore engine's memory budget for them: a
/// remote store's reads wait on the network, so its windows are larger (each starts its reads
/// anew). At 1 Gbit/s and 20 ms a 256 MiB file streamed in 4.4 s in 64 MiB windows and 3.1 s
/// in one of 256 MiB, against 2.8 s for a restore to disk (~40 s chunk by chunk, as before);
/// but 32 streams at once of 256 MiB windows (~650 MB each) ran this 24 GiB machine out of
/// memory, so windows stay at 64 MiB.
fn window(store: &IndexedStore) -> (u64, Budget) {
    if store.is_remote() {
        (64 << 20, Budget::of(128 << 20))
    } else {
        (32 << 20, Budget::of(64 << 20))
    }
}

/// The bytes of one file of an image, as a [`Read`]. Every chunk is checked against its id
/// before any of its bytes are handed out; a failure is an [`std::io::Error`] wrapping the
/// [`StoreError`] (see [`FileReader::store_error`]).
pub struct FileReader<'a> {
    store: &'a IndexedStore,
    m: &'a Manifest,
    path: String,
    size: u64,
    /// Where in the file the next window starts.
    next: u64,
    /// The current window (its chunks whole), and the part of it not yet handed out.
    ready: memmap2::MmapMut,
    at: usize,
    end: usize,
}

impl<'a> FileReader<'a> {
    /// A reader of the file at `path` in image `m`, and its size.
    pub fn open(store: &'a IndexedStore, m: &'a Manifest, path: &str) -> Result<(FileReader<'a>, u64)> {
        let entry = m.entries.iter().find(|e| e.path == path).ok_or_else(|| StoreError::NotFound {
            what: ObjectKind::ImageFile,
            key: format!("{path} (`gstore show` lists the image's files)"),
        })?;
        if entry.kind != EntryKind::File {
            return Err(StoreError::Invalid(format!("{path} is a {}, not a file", entry.kind.name())));
        }
        let empty = memmap2::MmapMut::map_anon(0)
            .map_err(|e| StoreError::Internal(format!("an empty mapping for {path}: {e}")))?;
        let reader =
            FileReader { store, m, path: path.to_string(), size: entry.size, next: 0, ready: empty, at: 0, end: 0 };
        Ok((reader, entry.size))
    }

    /// The store error behind an I/O error this reader returned, if it was one.
    pub fn store_error(e: std::io::Error) -> StoreError {
        match e.downcast::<StoreError>() {
            Ok(e) => e,
            Err(e) => StoreError::io("reading", "an image's file", e),
        }
    }

    /// Restores the next window of the file into `ready`.
    fn fill(&mut self) -> Result<()> {
        let (window, budget) = window(self.store);
        let len = window.min(self.size - self.next);
        let (pieces, skips) = self.m.pieces(&[(self.path.clone(), self.next, len)])?;
        let mut window = restore_to_memory(self.store, &pieces, budget, &Silent)?;
        let entry = window.entries.pop().ok_or_else(|| StoreError::Internal("a window restored nothing".into()))?;
        self.ready = entry.data;
        self.at = skips[0] as usize;
        self.end = self.at + len as usize;
        self.next += len;
        Ok(())
    }
}

impl Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.end {
            if self.next == self.size {
                return Ok(0);
            }
            self.fill().map_err(std::io::Error::other)?;
        }
        let n = buf.len().min(self.end - self.at);
        buf[..n].copy_from_slice(&self.ready[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Writes the file at `path` in image `m` to `out`; returns its size. Every chunk is checked
/// against its id before any of its bytes are written.
pub fn write_file(store: &IndexedStore, m: &Manifest, path: &str, out: &mut dyn Write) -> Result<u64> {
    let (mut reader, _) = FileReader::open(store, m, path)?;
    let mut written = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(FileReader::store_error)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(|e| StoreError::io("writing", "standard output", e))?;
        written += n as u64;
    }
    out.flush().map_err(|e| StoreError::io("writing", "standard output", e))?;
    Ok(written)
}
