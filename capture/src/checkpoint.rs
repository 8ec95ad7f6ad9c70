//! A running process checkpointed into the store, with rollback.

use crate::error::{CaptureError, Result};
use crate::staging::Staged;
use gstore_gpu_dump::checkpoint::{self, CaptureReport, CheckpointOptions, ImageKind, RestoreOptions};
use gstore_gpu_dump::{Criu, CudaDriver};
use gstore_store::progress::Progress;
use gstore_store::{push, Store, TagRef};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Which CRIU, and how it is called (shared by checkpoint and restore).
pub struct CriuChoice<'a> {
    /// The CRIU binary (`None`: look for one).
    pub path: Option<&'a Path>,
    /// Extra arguments passed to CRIU.
    pub extra: Vec<String>,
    /// The process is a shell job (has a controlling terminal).
    pub shell_job: bool,
}

/// What a checkpoint reports.
#[derive(Serialize)]
pub struct CheckpointReport {
    /// The capture phases.
    pub capture: CaptureReport,
    /// The push into the store.
    pub push: push::PushReport,
    /// Seconds from the lock until the process ran again (only when it was left running).
    pub paused_s: Option<f64>,
    /// Seconds in all.
    pub total_s: f64,
}

/// Checkpoints `pid` into the store as `tag`, staging the image in `staging_at` (else a new
/// directory). With `leave_running` the process runs on; otherwise CRIU ends it, and if the
/// push then fails the process is restored from the staged image (the error says so).
#[allow(clippy::too_many_arguments)]
pub fn checkpoint(
    store: &Store,
    pid: u32,
    tag: &TagRef,
    leave_running: bool,
    lock_timeout_ms: u32,
    criu: CriuChoice,
    staging_at: Option<PathBuf>,
    progress: &dyn Progress,
) -> Result<CheckpointReport> {
    let started = Instant::now();
    let criu_bin = Criu::find(criu.path)?;
    let cuda = CudaDriver::load().ok();
    let staged = Staged::new(staging_at, "checkpoint")?;
    let mut opts = CheckpointOptions::new(&criu_bin);
    opts.leave_running = leave_running;
    opts.shell_job = criu.shell_job;
    opts.lock_timeout_ms = lock_timeout_ms;
    opts.extra_criu_args = criu.extra.clone();
    opts.cuda = cuda.as_ref();
    let capture = checkpoint::checkpoint(pid, staged.path(), &opts).map_err(|source| {
        staged.remove_if_made();
        CaptureError::Checkpoint { pid, source }
    })?;
    let t = &capture.timings;
    let paused_s = leave_running.then(|| {
        t.lock_s.unwrap_or(0.0) + t.gpu_checkpoint_s.unwrap_or(0.0) + t.criu_dump_s + t.gpu_resume_s.unwrap_or(0.0)
    });
    let source = match push::push(store, staged.path(), tag, capture.metadata(), progress) {
        Ok(push) => {
            staged.remove_if_made();
            return Ok(CheckpointReport { capture, push, paused_s, total_s: started.elapsed().as_secs_f64() });
        }
        Err(e) => e,
    };
    let failed = |after: String| CaptureError::PushFailed { pid, after, source };
    if leave_running {
        staged.remove_if_made();
        return Err(failed(" (the process kept running)".into()));
    }
    // CRIU ended the process with the dump: bring it back from the staged image.
    let mut ropts = RestoreOptions::new(&criu_bin);
    ropts.cuda = cuda.as_ref();
    ropts.gpu = capture.image_kind == ImageKind::GpuProcess;
    ropts.original_pid = Some(pid);
    ropts.shell_job = criu.shell_job;
    Err(match checkpoint::restore(staged.path(), &ropts) {
        Ok(r) => {
            staged.remove_if_made();
            failed(format!("; the process was restored from the staged image and runs again as pid {}", r.pid))
        }
        Err(re) => failed(format!(
            ", and restoring the process from the staged image failed too ({re}); the image is kept at {}",
            staged.path().display()
        )),
    })
}
