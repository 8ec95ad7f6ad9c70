//! A restore served lazily from start to end, whoever runs CRIU (gstore itself for a process,
//! runc for a container): the guard forked and the socket bound before CRIU starts, the daemon
//! serving while the caller's restore runs, the outcome of both told apart, and the restore
//! profile followed or recorded.

use crate::error::LazyError;
use crate::fill::{serve, FillOptions, FillReport};
use crate::guard::Guard;
use crate::prepare::Prepared;
use crate::socket::LazySocket;
use gstore_store::{IndexedStore, ObjectId};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Why a lazy restore failed.
#[derive(Debug)]
pub enum Failed<E> {
    /// The caller's restore failed (nothing is left running); the daemon did not cause it.
    Restore(E),
    /// The daemon failed: the restored processes were killed; this is the cause.
    Fill(LazyError),
}

/// What a lazy restore gives back: the caller's restore's result, the fill, and what became
/// of the restore profile (followed, recorded, or why not).
pub type Served<R> = (R, FillReport, String);

/// Serves the memory of image `id` (prepared in `prepared`) to the CRIU that `restore` starts,
/// which connects to `socket_dir/lazy-pages.socket`; `restore` gets the guard, to name the
/// process group of a runtime it starts ([`Guard::add_runtime_group`]). `known_pids` are the pids the image
/// comes back with where they are this machine's (a process restored by gstore's CRIU); a
/// container's tasks are learned as they announce themselves. Returns once every page is in
/// place; a fill that fails kills the restored processes, and its error is the one reported.
pub fn serve_during<R, E>(
    store: &IndexedStore,
    id: &ObjectId,
    socket_dir: &Path,
    prepared: &Prepared,
    known_pids: &[i32],
    restore: impl FnOnce(&Guard) -> std::result::Result<R, E>,
) -> std::result::Result<Served<R>, Failed<E>> {
    let socket = LazySocket::bind(socket_dir).map_err(Failed::Fill)?;
    let workers = std::thread::available_parallelism().map_or(4, |n| n.get());
    let (profile, unreadable) = match store.profile(id) {
        Ok(p) => (p, None),
        Err(e) => (None, Some(e)),
    };
    let fill_opts = FillOptions { workers: if store.is_remote() { workers.max(16) } else { workers }, profile };
    let abort = AtomicBool::new(false);
    let (layout, chunks) = (&prepared.layout, prepared.chunks.clone());
    // Started before CRIU runs: CRIU releases the tasks without waiting for the daemon, so a
    // gstore killed before it holds their userfaultfds must still take the tasks with it.
    let guard = Guard::start(known_pids).map_err(Failed::Fill)?;
    let (restored, filled) = std::thread::scope(|scope| {
        let daemon = scope.spawn(|| {
            let conn = socket.accept(&abort)?;
            serve(store, layout, chunks, conn, &guard, &fill_opts, &abort)
        });
        let restored = restore(&guard);
        if restored.is_err() {
            abort.store(true, Ordering::Release);
        }
        let filled = daemon.join().unwrap_or(Err(LazyError::Protocol("the daemon thread panicked".into())));
        (restored, filled)
    });
    // The daemon released or killed the guard unless it stopped before the tasks arrived:
    // then a failed CRIU removed what it restored, and a CRIU that succeeded left tasks
    // nobody fills.
    match (&restored, &filled) {
        (_, Ok(_)) => {}
        (Err(_), Err(_)) => guard.release(),
        (Ok(_), Err(_)) => guard.kill(),
    }
    // A failed fill killed the restored tree: it is the cause of whatever else failed. A
    // daemon that only saw CRIU hang up (or was called off) did not cause CRIU's failure.
    let (r, fill) = match (restored, filled) {
        (Err(e), Err(LazyError::Protocol(_) | LazyError::Aborted)) => return Err(Failed::Restore(e)),
        (_, Err(e)) if !matches!(e, LazyError::Aborted) => return Err(Failed::Fill(e)),
        (Err(e), _) => return Err(Failed::Restore(e)),
        (Ok(_), Err(e)) => return Err(Failed::Fill(e)),
        (Ok(r), Ok(f)) => (r, f),
    };
    let note = match (fill.used_profile, unreadable) {
        (true, _) => "followed the stored profile".to_string(),
        (false, why) => {
            let recorded = match store.put_profile(id, &fill.profile) {
                Ok(()) => "recorded a profile for the next restore".to_string(),
                Err(e) => format!("could not store a profile for the next restore ({e})"),
            };
            match why {
                Some(e) => format!("the stored profile is unreadable ({e}); {recorded}"),
                None => recorded,
            }
        }
    };
    Ok((r, fill, note))
}
