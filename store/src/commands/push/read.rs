//! Reading a push's files: the bytes of each file (on disk, or pieces of memory), and the
//! batches of units the page cache lacks, read one batch ahead of the cores on reader
//! threads.

use super::source::{SourceEntry, Unit};
use super::Batches;
use crate::error::{Result, StoreError};
use crate::format::manifest::EntryKind;
use crate::memory::KEPT;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;

/// The bytes of one file being pushed.
pub(super) enum Content<'a> {
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
    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: u64, entry: &SourceEntry) -> Result<()> {
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

pub(super) fn open_files(entries: &[SourceEntry]) -> Result<Vec<Option<Content<'static>>>> {
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

/// The files a push reads units from.
pub(super) struct Reader<'a> {
    pub(super) entries: &'a [SourceEntry],
    pub(super) contents: &'a [Option<Content<'a>>],
}

impl Reader<'_> {
    /// Fills `buf` with the bytes at `offset` of entry `file`.
    pub(super) fn read(&self, file: usize, offset: u64, buf: &mut [u8]) -> Result<()> {
        let content = self.contents[file].as_ref().ok_or_else(|| StoreError::Internal("a read of no file".into()))?;
        content.read_exact_at(buf, offset, &self.entries[file])
    }

    /// Whether the page cache holds `u`'s bytes, as far as its first, middle and last byte
    /// tell without waiting for the disk (memory always does).
    pub(super) fn cached(&self, u: &Unit) -> bool {
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
pub(super) fn read_ahead<'scope, 'a: 'scope>(
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
pub(super) fn read_units(units: &mut [Unit], reader: &Reader<'_>) -> Result<()> {
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
