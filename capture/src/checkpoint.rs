//! A running process checkpointed into the store, with rollback.

use crate::cooperate;
use crate::error::{CaptureError, Result};
use crate::staging::Staged;
use crate::streamer::{self, Ended, Gate};
use gstore_gpu_dump::checkpoint::{self, CaptureReport, CheckpointOptions, ImageKind, RestoreOptions};
use gstore_gpu_dump::criu::DUMP_LOG;
use gstore_gpu_dump::GpuDumpError;
use gstore_gpu_dump::{Criu, CudaDriver};
use gstore_store::commands::push::stream::{self, StreamSink};
use gstore_store::progress::Progress;
use gstore_store::StoreError;
use gstore_store::{commands::push, IndexedStore, TagRef};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
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
    /// Seconds from the lock until the process ran again (only when it was left running;
    /// with weights left out, from the release until they were back).
    pub paused_s: Option<f64>,
    /// The weights left out of the image ([`crate::cooperate`]), when processes of the tree
    /// registered theirs.
    pub weights: Option<WeightsReport>,
    /// Seconds in all.
    pub total_s: f64,
}

/// Checkpoints `pid` into the store as `tag`. The image streams from CRIU into the store
/// while the process is dumped ([`crate::streamer`]); without `leave_running` CRIU ends the
/// process only once its image is stored and tagged, and if storing fails the process runs on
/// (the error says so). With `staging_at` the image is written to that directory first and
/// pushed from it; if that push fails after CRIU ended the process, the process is restored
/// from the staged image. A store that refuses the tag (a server token that may not write it)
/// fails the call before the process is touched.
#[allow(clippy::too_many_arguments)]
pub fn checkpoint(
    store: &IndexedStore,
    pid: u32,
    tag: &TagRef,
    leave_running: bool,
    lock_timeout_ms: u32,
    criu: CriuChoice,
    staging_at: Option<PathBuf>,
    progress: &dyn Progress,
) -> Result<CheckpointReport> {
    let started = Instant::now();
    store.backend().check_tag_write(&tag.name)?;
    let criu_bin = Criu::find(criu.path)?;
    let cuda = CudaDriver::load().ok();
    let mut opts = CheckpointOptions::new(&criu_bin);
    opts.leave_running = leave_running;
    opts.shell_job = criu.shell_job;
    opts.lock_timeout_ms = lock_timeout_ms;
    opts.extra_criu_args = criu.extra.clone();
    opts.cuda = cuda.as_ref();
    let found = cooperate::find(pid);
    let registered = !found.is_empty();
    // The weights of a process that changed them since it registered stay in the image.
    let cooperate::Released { regs, changed, seconds: release_s } = cooperate::release(found)?;
    opts.metadata = cooperate::metadata(&regs);
    // A process left running copies its weights back from this process's GPU memory, loaded
    // from the store while the process is dumped.
    let prefetch = leave_running && regs.iter().any(|r| r.gpu().is_some());
    let models = regs.iter().filter(|r| r.gpu().is_some()).map(|r| (r, cooperate::model_manifest(store, r)));
    let (r, refilled) = cooperate::while_prefetching(store, models, gstore_restore::Budget::DEFAULT, prefetch, |_| {
        let r = match staging_at {
            Some(dir) => Staged::new(Some(dir), "checkpoint")
                .and_then(|staging| staged(store, pid, tag, opts, staging, started, progress)),
            None => streamed(store, pid, tag, opts, started, progress),
        };
        // Every process that runs on (left running, rolled back, or restored from a staged
        // image after a failed push) gets its weights back before this returns.
        let refilled = (!regs.is_empty()).then(|| cooperate::refill(&regs, prefetch));
        (r, refilled)
    });
    // Where the image's lazy memory is stored, recorded for a restore on this machine.
    let r = r.map(|mut report| {
        gstore_lazy::prepare::locate_ahead(store, &report.push.manifest);
        report.total_s = started.elapsed().as_secs_f64();
        report
    });
    if !registered {
        return r;
    }
    let mut report = r?;
    let refill_s = refilled.transpose()?.filter(|_| leave_running);
    let bytes = regs.iter().map(|r| r.bytes).sum();
    report.paused_s = report.paused_s.map(|p| p + release_s + refill_s.unwrap_or(0.0));
    report.weights = Some(WeightsReport { processes: regs.len(), bytes, release_s, refill_s, changed });
    Ok(report)
}

/// The weights a checkpoint left out of the image.
#[derive(Serialize)]
pub struct WeightsReport {
    /// Processes that released theirs.
    pub processes: usize,
    /// Bytes of GPU memory left out.
    pub bytes: u64,
    /// Seconds until every process had released them.
    pub release_s: f64,
    /// Seconds until every process left running had them back (`None`: it was not left
    /// running).
    pub refill_s: Option<f64>,
    /// Registered processes whose weights had changed since they registered: the image holds
    /// those weights, as any process's memory, and their registrations ended.
    pub changed: Vec<cooperate::ChangedWeights>,
}

/// Seconds from the lock until the process ran again, for a process left running.
fn paused_s(capture: &CaptureReport) -> Option<f64> {
    let t = &capture.timings;
    capture.leave_running.then(|| {
        t.lock_s.unwrap_or(0.0) + t.gpu_checkpoint_s.unwrap_or(0.0) + t.criu_dump_s + t.gpu_resume_s.unwrap_or(0.0)
    })
}

/// The checkpoint through a staging directory: dump, then push the directory.
fn staged(
    store: &IndexedStore,
    pid: u32,
    tag: &TagRef,
    opts: CheckpointOptions<'_>,
    staged: Staged,
    started: Instant,
    progress: &dyn Progress,
) -> Result<CheckpointReport> {
    let leave_running = opts.leave_running;
    let capture = checkpoint::checkpoint(pid, staged.path(), &opts).map_err(|source| {
        let e = keep_criu_log(CaptureError::Checkpoint { pid, source, kept_log: String::new() }, &staged);
        staged.remove_if_made();
        e
    })?;
    let source = match push::push(store, staged.path(), tag, capture.metadata(), progress) {
        Ok(push) => {
            staged.remove_if_made();
            let paused_s = paused_s(&capture);
            let total_s = started.elapsed().as_secs_f64();
            return Ok(CheckpointReport { capture, push, paused_s, weights: None, total_s });
        }
        Err(e) => e,
    };
    let failed = |after: String| CaptureError::PushFailed { pid, after, source };
    if leave_running {
        staged.remove_if_made();
        return Err(failed(" (the process kept running)".into()));
    }
    // CRIU ended the process with the dump: bring it back from the staged image.
    let mut ropts = RestoreOptions::new(opts.criu);
    ropts.cuda = opts.cuda;
    ropts.gpu = capture.image_kind == ImageKind::GpuProcess;
    ropts.original_pid = Some(pid);
    ropts.shell_job = opts.shell_job;
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

/// The checkpoint streamed into the store while CRIU dumps (`criu dump --stream`).
fn streamed(
    store: &IndexedStore,
    pid: u32,
    tag: &TagRef,
    opts: CheckpointOptions<'_>,
    started: Instant,
    progress: &dyn Progress,
) -> Result<CheckpointReport> {
    // Holds CRIU's socket, the gate and CRIU's log; the image itself never lands here.
    let staged = Staged::new(None, "checkpoint")?;
    let r =
        streamed_via(store, pid, tag, opts, staged.path(), started, progress).map_err(|e| keep_criu_log(e, &staged));
    staged.remove_if_made();
    r
}

/// A failed checkpoint's error quotes the end of CRIU's log from the staging directory,
/// which is about to go: the log is kept beside it, and the error says where.
fn keep_criu_log(e: CaptureError, staged: &Staged) -> CaptureError {
    match e {
        CaptureError::Checkpoint { pid, source, .. } => {
            let kept_log = staged
                .keep(DUMP_LOG)
                .map(|p| format!(" (CRIU's whole log, {DUMP_LOG}, is kept at {})", p.display()))
                .unwrap_or_default();
            CaptureError::Checkpoint { pid, source, kept_log }
        }
        other => other,
    }
}

/// [`streamed`], with `dir` for CRIU's socket, the gate and CRIU's log.
fn streamed_via(
    store: &IndexedStore,
    pid: u32,
    tag: &TagRef,
    mut opts: CheckpointOptions<'_>,
    dir: &Path,
    started: Instant,
    progress: &dyn Progress,
) -> Result<CheckpointReport> {
    std::fs::create_dir_all(dir).map_err(|source| CaptureError::Staging { path: dir.to_path_buf(), source })?;
    let gate = Gate::create(dir)?;
    let listener = streamer::listen(dir)?;
    let (tell, dump_started) = mpsc::channel();
    opts.stream = true;
    opts.action_script = Some(gate.script.clone());
    opts.dump_starts = Some(tell);
    let leave_running = opts.leave_running;
    let (sink, source) = stream::channel(store, stream_buffer());
    let (pushed, push_ended) = mpsc::channel::<bool>();
    let outcome = std::thread::scope(|s| {
        let pushing = s.spawn(move || {
            // A process left running comes first: its dump, then its own work once it runs
            // again; the store catches up with what CPU is left.
            let push = || push::push_stream(store, source, tag, progress);
            let r = if leave_running { in_background(push) } else { push() };
            let _ = pushed.send(r.is_ok());
            r
        });
        let (listener, gate) = (&listener, &gate);
        let receiving = s.spawn(move || -> Result<Option<StreamSink>> {
            let ended = streamer::receive(listener, gate, &sink);
            match ended {
                // The process runs on at once; the image is finished once CRIU has returned.
                Ok(Ended::Dumped) if leave_running => {
                    gate.answer(true);
                    Ok(Some(sink))
                }
                // Store and tag the image, then let CRIU end the process.
                Ok(Ended::Dumped) => {
                    let stored = match dump_started.try_recv() {
                        Ok((mut report, at)) => {
                            report.timings.criu_dump_s = at.elapsed().as_secs_f64();
                            sink.finish(report.metadata()).is_ok() && push_ended.recv().unwrap_or(false)
                        }
                        Err(_) => false,
                    };
                    gate.answer(stored);
                    Ok(None)
                }
                Ok(Ended::Exited) => Ok(None),
                Err(e) => {
                    gate.answer(false);
                    Err(e)
                }
            }
        });
        let captured = checkpoint::checkpoint(pid, dir, &opts);
        gate.tell_exited();
        let received = receiving.join().expect("the image receiver does not panic");
        let received = match (received, &captured) {
            (Ok(Some(sink)), Ok(capture)) => sink.finish(capture.metadata()).map_err(CaptureError::from),
            // A sink left unfinished is dropped here: the push stops, nothing is tagged.
            (Ok(_), _) => Ok(()),
            (Err(e), _) => Err(e),
        };
        let pushed = pushing.join().expect("the streamed push does not panic");
        (captured, received, pushed)
    });
    let (captured, received, pushed) = outcome;
    // What became of the process, for an error.
    let after = match &captured {
        Ok(_) if leave_running => " (the process kept running)".to_string(),
        Ok(_) => " after CRIU ended the process".to_string(),
        Err(GpuDumpError::Resumed { .. }) => " (the process kept running)".to_string(),
        Err(e) => format!("; the checkpoint failed too: {e}"),
    };
    match (pushed, received, captured) {
        (Ok(push), Ok(()), Ok(capture)) => {
            let paused_s = paused_s(&capture);
            Ok(CheckpointReport { capture, push, paused_s, weights: None, total_s: started.elapsed().as_secs_f64() })
        }
        (Err(source), _, _) if !matches!(source, StoreError::StreamStopped) => {
            Err(CaptureError::PushFailed { pid, after, source })
        }
        (_, Err(source), _) => Err(CaptureError::Streaming { pid, after, source: Box::new(source) }),
        (_, _, Err(source)) => Err(CaptureError::Checkpoint { pid, source, kept_log: String::new() }),
        (pushed, Ok(()), Ok(_)) => {
            Err(CaptureError::PushFailed { pid, after, source: pushed.err().unwrap_or(StoreError::StreamStopped) })
        }
    }
}

/// Bytes of image that may wait in memory between CRIU and the store: a quarter of the memory
/// available, from 256 MiB to 8 GiB. The more, the sooner CRIU is done with the process.
fn stream_buffer() -> u64 {
    let available = gstore_gpu_dump::procfs::meminfo_bytes(&gstore_gpu_dump::procfs::meminfo(), "MemAvailable");
    (available.unwrap_or(0) / 4).clamp(256 << 20, 8 << 30)
}

/// Runs `f` on this thread with it, the threads it starts and the rayon pool's threads at the
/// lowest CPU priority (nice 19), then gives this thread and the pool their priorities back.
fn in_background<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY (both): getpriority/setpriority of the calling thread (its tid) only.
    let get = || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
    let set = |nice: i32| unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    let before = rayon::broadcast(|_| {
        let old = get();
        set(19);
        old
    });
    let own = get();
    set(19);
    let r = f();
    // Lowering nice again needs CAP_SYS_NICE (CRIU needs root anyway); without it they stay low.
    set(own);
    rayon::broadcast(|ctx| set(before[ctx.index()]));
    r
}
