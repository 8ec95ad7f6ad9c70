//! A container checkpointed through its runtime straight into the store: podman exports the
//! checkpoint archive into a FIFO, and gstore pushes its entries as they arrive, so the
//! archive never lands on disk (podman's CRIU images do, in podman's own storage, as its
//! export works from them).

use crate::archive::{self, ArchiveInfo};
use crate::error::{ContainerError, Result};
use crate::podman::Podman;

use gstore_store::commands::push::PushReport;
use gstore_store::format::meta::{ImageMeta, Runtime};
use gstore_store::progress::Progress;
use gstore_store::{IndexedStore, TagRef};
use serde::Serialize;
use std::time::Instant;

/// What a container checkpoint reports.
#[derive(Serialize)]
pub struct ContainerCheckpointReport {
    /// The container's name.
    pub container: String,
    /// Its id.
    pub id: String,
    /// The image it runs.
    pub image: String,
    /// Whether it runs on.
    pub left_running: bool,
    /// The archive as read.
    pub archive: ArchiveInfo,
    /// The push into the store.
    pub push: PushReport,
    /// Seconds in all.
    pub total_s: f64,
}

/// Checkpoints the running container `name` into the store as `tag`. Without
/// `leave_running` the container stops (podman's checkpoint); if storing its archive fails,
/// it is restored from the checkpoint podman kept and runs again (the error says so). A store
/// that refuses the tag (a server token that may not write it) fails the call before the
/// container is touched.
pub fn checkpoint(
    store: &IndexedStore,
    podman: &Podman,
    name: &str,
    tag: &TagRef,
    leave_running: bool,
    progress: &dyn Progress,
) -> Result<ContainerCheckpointReport> {
    let started = Instant::now();
    tag.check_new()?;
    store.backend().check_tag_write(&tag.name)?;
    let c = podman.inspect(name)?;
    if !c.running {
        return Err(ContainerError::Runtime {
            command: format!("podman container checkpoint {name}"),
            status: format!("not started: the container is {}", c.status),
            stderr: "only a running container can be checkpointed".into(),
        });
    }
    let dir = tempfile::Builder::new()
        .prefix("gstore-container-")
        .tempdir()
        .map_err(|e| ContainerError::io("creating", std::env::temp_dir(), e))?;
    let fifo = dir.path().join("checkpoint.tar");
    gstore_gpu_dump::fifo::make(&fifo).map_err(|e| ContainerError::io("creating FIFO", &fifo, e))?;
    let meta = ImageMeta {
        runtime: Some(Runtime { engine: "podman".into(), version: podman.version() }),
        criu_version: Some(podman.criu().version()),
        kernel: Some(kernel()),
        ..ImageMeta::default()
    };
    let (mut reader, held) =
        gstore_gpu_dump::fifo::open_held(&fifo).map_err(|e| ContainerError::io("opening FIFO", &fifo, e))?;
    let (child, command) = podman.start_checkpoint(&c.name, &fifo, leave_running)?;
    let (pushed, dumped) = std::thread::scope(|s| {
        let pushing = s.spawn(|| {
            let pushed = archive::push_archive(store, &mut reader, "podman's checkpoint archive", tag, meta, progress);
            if pushed.is_err() {
                // podman blocks for ever on an export whose reader went away: the rest of the
                // archive is read and dropped, so podman ends (and keeps its checkpoint).
                let _ = std::io::copy(&mut reader, &mut std::io::sink());
            }
            pushed
        });
        let dumped = Podman::wait(child, command);
        // podman is done writing: the archive ends (also when podman never opened the FIFO).
        drop(held);
        (pushing.join().expect("the container's push does not panic"), dumped)
    });
    match (pushed, dumped) {
        (Ok((push, archive)), Ok(())) => Ok(ContainerCheckpointReport {
            container: c.name,
            id: c.id,
            image: c.image,
            left_running: leave_running,
            archive,
            push,
            total_s: started.elapsed().as_secs_f64(),
        }),
        // podman's failure explains an archive that ended early.
        (_, Err(e)) => Err(e),
        (Err(source), Ok(())) => {
            let after = if leave_running {
                " (the container kept running)".to_string()
            } else {
                match podman.restore_kept(&c.name) {
                    Ok(()) => "; the container was restored from podman's kept checkpoint and runs again".into(),
                    Err(e) => format!(
                        "; restoring the container from podman's kept checkpoint failed too ({e}): \
                         `podman container restore {}` may still bring it back",
                        c.name
                    ),
                }
            };
            Err(ContainerError::PushFailed { container: c.name, after, source: Box::new(source) })
        }
    }
}

/// This machine's kernel release (`uname -r`).
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}
