//! One file of an image written to a stream (`gstore cat`): its chunks located, read,
//! checked and decoded a batch at a time on every core, and written in order, so memory stays
//! bounded by the batch whatever the file's size.

use crate::plan::locate_chunk;
use gstore_store::manifest::{EntryKind, Manifest};
use gstore_store::{Result, Store, StoreError};
use rayon::prelude::*;
use std::io::Write;

/// Chunks decoded at once (at most this many times `chunk_max` bytes held).
const BATCH: usize = 64;

/// Writes the file at `path` in image `m` to `out`; returns its size. Every chunk is checked
/// against its id before any of its bytes are written.
pub fn write_file(store: &Store, m: &Manifest, path: &str, out: &mut dyn Write) -> Result<u64> {
    let (entry, chunks) = m.files().find(|(e, _)| e.path == path).ok_or_else(|| StoreError::NotFound {
        what: "file in the image",
        key: format!("{path} (`gstore show` lists the image's files)"),
    })?;
    if entry.kind != EntryKind::File {
        return Err(StoreError::Invalid(format!("{path} is a {}, not a file", entry.kind.name())));
    }
    let mut written = 0u64;
    for batch in chunks.chunks(BATCH) {
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
        for p in plain {
            let p = p?;
            out.write_all(&p).map_err(|e| StoreError::io("writing", "standard output", e))?;
            written += p.len() as u64;
        }
    }
    out.flush().map_err(|e| StoreError::io("writing", "standard output", e))?;
    Ok(written)
}
