//! The host memory sink: restores every file of an image into its own page-aligned buffer.

use crate::budget::Budget;
use crate::engine::{self, Buffers, Piece, Sink};
use crate::plan;
use gstore_store::format::manifest::Manifest;
use gstore_store::progress::Progress;
use gstore_store::{IndexedStore, Result, StoreError};

/// One restored file in host memory.
pub struct HostEntry {
    /// The entry's path in the image.
    pub path: String,
    /// Its bytes, in a page-aligned anonymous mapping (empty files have an empty one).
    pub data: memmap2::MmapMut,
}

/// Every file of an image, restored into host memory, in manifest order.
pub struct HostImage {
    /// The files.
    pub entries: Vec<HostEntry>,
}

impl HostImage {
    /// The bytes of the file at `path`, if the image has one.
    pub fn get(&self, path: &str) -> Option<&[u8]> {
        self.entries.iter().find(|e| e.path == path).map(|e| &e.data[..])
    }

    /// Total bytes held.
    pub fn len(&self) -> u64 {
        self.entries.iter().map(|e| e.data.len() as u64).sum()
    }

    /// True when the image has no file bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Raw views of the buffers; the plan guarantees that concurrent batches never overlap.
struct HostSink {
    buffers: Buffers,
}

impl Sink for HostSink {
    fn write_batch(&self, pieces: &[Piece<'_>]) -> Result<()> {
        for p in pieces {
            let dst = self.buffers.address(p.entry, p.offset, p.data.len())?;
            // SAFETY: in bounds (checked by `address`); the buffer outlives the restore; plan
            // targets are disjoint, so no two threads write the same bytes.
            unsafe { std::ptr::copy_nonoverlapping(p.data.as_ptr(), dst as *mut u8, p.data.len()) };
        }
        Ok(())
    }
}

/// Restores every file of `m` into page-aligned host memory (zero chunks cost nothing: the
/// mappings start zeroed).
pub fn restore_to_memory(
    store: &IndexedStore,
    m: &Manifest,
    budget: Budget,
    progress: &dyn Progress,
) -> Result<HostImage> {
    let plan = plan::plan(store, m, budget.max_read())?;
    let (owned, buffers) = Buffers::allocate(m, |e| {
        let mut data = memmap2::MmapMut::map_anon(e.size as usize)
            .map_err(|err| StoreError::Internal(format!("allocating {} bytes for {}: {err}", e.size, e.path)))?;
        let (base, len) = (data.as_mut_ptr() as u64, data.len());
        Ok((data, base, len))
    })?;
    engine::run(store, &plan, &HostSink { buffers }, progress)?;
    Ok(HostImage { entries: owned.into_iter().map(|(path, data)| HostEntry { path, data }).collect() })
}
