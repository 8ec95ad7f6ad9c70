//! One file of an image read as a stream (`gstore cat`, archives written from images): its
//! chunks located, read, checked and decoded a batch at a time on every core, and handed out in
//! order, so memory stays bounded by the batch whatever the file's size.

use crate::plan::locate_chunk;
use gstore_store::format::manifest::{ChunkRef, EntryKind, Manifest};
use gstore_store::{Result, Store, StoreError};
use rayon::prelude::*;
use std::io::{Read, Write};

/// Chunks decoded at once (at most this many times `chunk_max` bytes held).
const BATCH: usize = 64;

/// The bytes of one file of an image, as a [`Read`]. Every chunk is checked against its id
/// before any of its bytes are handed out; a failure is an [`std::io::Error`] wrapping the
/// [`StoreError`] (see [`FileReader::store_error`]).
pub struct FileReader<'a> {
    store: &'a Store,
    path: String,
    chunks: &'a [ChunkRef],
    /// The next chunk to decode.
    next: usize,
    /// Decoded bytes not yet handed out, and how far into them the reader is.
    ready: Vec<u8>,
    at: usize,
}

impl<'a> FileReader<'a> {
    /// A reader of the file at `path` in image `m`, and its size.
    pub fn open(store: &'a Store, m: &'a Manifest, path: &str) -> Result<(FileReader<'a>, u64)> {
        let (entry, chunks) = m.files().find(|(e, _)| e.path == path).ok_or_else(|| StoreError::NotFound {
            what: "file in the image",
            key: format!("{path} (`gstore show` lists the image's files)"),
        })?;
        if entry.kind != EntryKind::File {
            return Err(StoreError::Invalid(format!("{path} is a {}, not a file", entry.kind.name())));
        }
        let reader = FileReader { store, path: path.to_string(), chunks, next: 0, ready: Vec::new(), at: 0 };
        Ok((reader, entry.size))
    }

    /// The store error behind an I/O error this reader returned, if it was one.
    pub fn store_error(e: std::io::Error) -> StoreError {
        match e.downcast::<StoreError>() {
            Ok(e) => e,
            Err(e) => StoreError::io("reading", "an image's file", e),
        }
    }

    /// Decodes the next batch of chunks into `ready`.
    fn fill(&mut self) -> Result<()> {
        let end = (self.next + BATCH).min(self.chunks.len());
        let batch = &self.chunks[self.next..end];
        let path = &self.path;
        let store = self.store;
        let plain: Vec<Result<Vec<u8>>> = batch
            .par_iter()
            .map(|c| {
                if c.zero {
                    return Ok(vec![0; c.len as usize]);
                }
                let loc = locate_chunk(store, &c.id, c.len, path)?;
                store.read_checked_range(&loc.pack, loc.range(), |stored| {
                    let mut plain = Vec::with_capacity(c.len as usize);
                    store.decoder().decode_append(loc.codec, stored, c.len as usize, &c.id, &mut plain)?;
                    Ok(plain)
                })
            })
            .collect();
        self.ready.clear();
        self.at = 0;
        for p in plain {
            self.ready.extend_from_slice(&p?);
        }
        self.next = end;
        Ok(())
    }
}

impl Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.ready.len() {
            if self.next == self.chunks.len() {
                return Ok(0);
            }
            self.fill().map_err(std::io::Error::other)?;
        }
        let n = buf.len().min(self.ready.len() - self.at);
        buf[..n].copy_from_slice(&self.ready[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Writes the file at `path` in image `m` to `out`; returns its size. Every chunk is checked
/// against its id before any of its bytes are written.
pub fn write_file(store: &Store, m: &Manifest, path: &str, out: &mut dyn Write) -> Result<u64> {
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
