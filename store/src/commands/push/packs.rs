//! The pack writers of a push: full packs queued to writer threads, each naming its pack in
//! the lease before it stores it (docs/GC.md, push step 2).

use super::PushReport;
use crate::commands::pack_fill::Filled;
use crate::dedup::similar::Sketch;
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::pack::FinishedPack;
use crate::repo::indexed::IndexedStore;
use crate::repo::leases::Lease;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// What a pack writer returns: the packs it wrote and the seconds it was busy.
pub(super) type Written = Result<(Vec<ObjectId>, f64)>;

/// Waits for the pack writers: the packs they wrote, or the first error; their busy seconds
/// go into `report`.
pub(super) fn join_writers(
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

/// A pack writer: takes built packs from `rx`, names them and (unless a dry run, without a
/// `lease`) stores them; returns the packs it wrote and the seconds it was busy. A failed
/// write sets `failed`, so the producer stops, and drains the queue before it returns.
pub(super) fn pack_writer(
    store: &IndexedStore,
    rx: &std::sync::Mutex<mpsc::Receiver<Filled>>,
    lease: Option<&Lease>,
    failed: &AtomicBool,
) -> Written {
    let mut written = Vec::new();
    let mut busy = 0.0;
    loop {
        // The guard is released before the upload: other writers take the next pack.
        let next = rx.lock().expect("pack queue lock").recv();
        let Ok(filled) = next else { return Ok((written, busy)) };
        let t = std::time::Instant::now();
        // Naming the pack hashes all of it: done here, on the writers, not on the thread that
        // appends chunks in order.
        let p = filled.pack.finish();
        written.push(p.id);
        // A dry run counts its packs and drops them.
        let Some(lease) = lease else { continue };
        let stored = write_pack(store, lease, p, &filled.sketches);
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

/// Full packs on their way to the writer threads.
pub(super) struct PackQueue<'a> {
    pub(super) tx: mpsc::SyncSender<Filled>,
    /// Set by a writer that failed: the push stops producing packs.
    pub(super) writer_failed: &'a AtomicBool,
}

impl PackQueue<'_> {
    pub(super) fn send(&self, p: Filled) -> Result<()> {
        let gone = || StoreError::Internal("pack writer stopped".into());
        if self.writer_failed.load(Ordering::SeqCst) {
            return Err(gone());
        }
        self.tx.send(p).map_err(|_| gone())
    }
}

/// Stores a pack this push wrote, naming it in the lease first (docs/GC.md, push step 2), then
/// records the `sketches` of its chunks in the index.
pub(crate) fn write_pack(
    store: &IndexedStore,
    lease: &Lease,
    p: FinishedPack,
    sketches: &[(ObjectId, Sketch)],
) -> Result<()> {
    lease.protect(&[p.id], &[])?;
    store.put_pack(p)?;
    store.index().add_sketches(sketches)
}
