//! A process image restored from the store and started.

use crate::checkpoint::CriuChoice;
use crate::cooperate;
use crate::error::{CaptureError, Result};
use crate::staging::Staged;
use gstore_gpu_dump::checkpoint::{self, ImageKind, RestoreOptions, RestoreReport};
use gstore_gpu_dump::cuda::ffi::GpuPair;
use gstore_gpu_dump::{check_compatible, Criu, CudaDriver, GpuDumpError, GpuMap, ImageNeeds, MachineInfo};
use gstore_lazy::mode::Mode;
use gstore_store::format::manifest::Manifest;
use gstore_store::progress::Progress;
use gstore_store::{IndexedStore, ObjectId};
use serde::Serialize;
use std::cell::{OnceCell, RefCell};
use std::path::{Path, PathBuf};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

/// What a restore-and-run reports.
#[derive(Serialize)]
pub struct RunReport {
    /// The restored process.
    pub pid: u32,
    /// How memory came back: lazy (served from the store while the process runs) or eager
    /// (the whole image written out first).
    pub mode: Mode,
    /// Why the eager path was taken although it was not asked for.
    pub eager_reason: Option<String>,
    /// Seconds before the image was written: resolving it, reading its manifest and checking
    /// the model images its left-out weights come from.
    pub setup_s: f64,
    /// Seconds to write the image (lazy: only what CRIU reads itself) out of the store.
    pub materialize_s: f64,
    /// The CRIU and GPU phases.
    pub restore: RestoreReport,
    /// The lazy fill (lazy mode only).
    pub fill: Option<gstore_lazy::FillReport>,
    /// What became of the restore profile (lazy mode only): followed, recorded, or why not.
    pub profile: Option<String>,
    /// Seconds from the GPU state's return until every process whose weights the image left
    /// out had refilled them from the store (`None`: it left none out).
    pub weights_refill_s: Option<f64>,
    /// Seconds from the command's start until those weights were in this process's GPU
    /// memory, offered to the restored processes (`None`: nothing was prefetched, or a
    /// prefetch failed and its process loaded from the store itself).
    pub weights_prefetch_s: Option<f64>,
    /// Seconds in all.
    pub total_s: f64,
}

/// How a restore-and-run proceeds.
pub struct RunOptions {
    /// Write the whole image out first (no lazy pages).
    pub eager: bool,
    /// How long to wait for the image's pids to be free.
    pub pid_wait: Duration,
    /// The memory the restore may hold in flight.
    pub memory_budget: gstore_restore::Budget,
    /// Where the image's GPUs go (`--gpu-map`); empty: by the rule in `gstore_gpu_dump::gpumap`.
    pub gpu_map: GpuMap,
}

/// Restores the process image `reference` and starts it, writing the image into `keep_at`
/// (kept) or a staging directory (removed). Memory is served lazily from the store unless
/// `opts.eager` is set or this machine cannot (then the report says why).
pub fn run(
    store: &IndexedStore,
    reference: &str,
    criu: CriuChoice,
    keep_at: Option<PathBuf>,
    opts: RunOptions,
    progress: &dyn Progress,
) -> Result<RunReport> {
    let started = Instant::now();
    let id = store.resolve(reference)?;
    let m = store.get_manifest(&id)?;
    let image = ImageNeeds::from_metadata(&m.meta).map_err(|e| {
        let detail = match m.kind() {
            None => "it holds files, as `gstore push` stores them".to_string(),
            Some(kind) if !kind.is_process() => format!("it is a {kind} image"),
            Some(_) => e.to_string(),
        };
        CaptureError::NotAProcess { reference: reference.to_string(), detail }
    })?;
    let criu_bin = Criu::find(criu.path)?;
    let weights = cooperate::recorded(&m.meta)?;
    let models = check_weights(store, &weights)?;
    let gpu_image = image.kind == ImageKind::GpuProcess;
    // The weights the image left out are loaded into this process's GPU memory meanwhile,
    // for the restored process to copy from (cooperate::while_prefetching); kept until it has.
    let prefetch = gpu_image && !weights.is_empty();
    let budget = opts.memory_budget;
    cooperate::ask_refill_on_restore(&weights, prefetch)?;
    let models = weights.iter().zip(models.into_iter().map(Ok));
    cooperate::while_prefetching(store, models, budget, prefetch, |offered| -> Result<RunReport> {
        let original_pid = m.meta.pid;
        let staged = Staged::new(keep_at, "restore")?;
        let dir = staged.path();
        let write_out =
            |e: CaptureError| CaptureError::WriteOut { reference: reference.to_string(), source: Box::new(e) };
        let restoring =
            |e: CaptureError| CaptureError::Restore { reference: reference.to_string(), source: Box::new(e) };
        let prefetch_s = || offered.at().map(|t| t.duration_since(started).as_secs_f64());
        let mut eager_reason = None;
        let lazy = gstore_lazy::mode::lazy_here(opts.eager).map_err(|why| eager_reason = why).is_ok();
        // The machine is checked (CUDA driver, CRIU) while the image is written out and, for a
        // lazy restore, while CRIU restores the tree with its tasks left stopped: the driver's
        // start costs a GPU machine ~0.2 s, so a CPU image does not start it. Nothing runs
        // before the check passes (a tree restored meanwhile is killed when it fails).
        let t = Instant::now();
        let setup_s = t.duration_since(started).as_secs_f64();
        std::thread::scope(|s| {
            let machine = s.spawn(|| {
                let cuda = gpu_image.then(CudaDriver::load);
                let machine = match &cuda {
                    Some(cuda) => MachineInfo::probe(Some(&criu_bin), cuda),
                    None => MachineInfo::probe_without_gpus(Some(&criu_bin)),
                };
                (cuda, check_compatible(&image, &machine, &opts.gpu_map))
            });
            let prepared = lazy.then(|| gstore_lazy::prepare(store, &id, &m, dir, opts.memory_budget, progress));
            let materialize_s = t.elapsed().as_secs_f64();
            let checked = Checked::new(machine);
            let mut ropts = RestoreOptions::new(&criu_bin);
            ropts.gpu_pids = image.gpu_pids.clone();
            ropts.gpu = gpu_image;
            ropts.original_pid = original_pid;
            ropts.pid_wait = opts.pid_wait;
            ropts.shell_job = criu.shell_job;
            ropts.extra_criu_args = checkpoint::tcp_options(m.meta.tcp_connections);
            ropts.extra_criu_args.extend(criu.extra.iter().cloned());
            let checked_opts = |base| {
                checked
                    .options(base)
                    .map_err(|source| CaptureError::Incompatible { reference: reference.to_string(), source })
            };
            let refilled = || (!weights.is_empty()).then(|| cooperate::wait_refilled(&weights)).transpose();
            let prepared = match prepared.map(|p| gstore_lazy::mode::lazy_or_eager(p, &mut eager_reason)) {
                Some(Err(e)) => {
                    staged.remove_if_made();
                    return Err(write_out(e.into()));
                }
                Some(Ok(None)) => {
                    let _ = std::fs::remove_dir_all(dir);
                    None
                }
                Some(Ok(Some(p))) => Some(p),
                None => None,
            };
            if let Some(prepared) = prepared {
                ropts.extra_criu_args.insert(0, "--lazy-pages".to_string());
                let r = retrying_pid_races(|| {
                    run_lazy(store, &id, dir, &prepared, || {
                        // A verdict in already (a CPU image's check asks nothing slow) refuses
                        // before CRIU; a later one kills the tree CRIU restored stopped.
                        if checked.ready() {
                            checked_opts(&ropts)?;
                        }
                        let stopped = checkpoint::restore_stopped(dir, &ropts)?;
                        Ok(stopped.resume(&checked_opts(&ropts)?)?)
                    })
                });
                staged.remove_if_made();
                let (restore, fill, profile) = r.map_err(|e| match e {
                    e @ CaptureError::Incompatible { .. } => e,
                    e => restoring(e),
                })?;
                let weights_refill_s = refilled().map_err(restoring)?;
                return Ok(RunReport {
                    pid: restore.pid,
                    mode: Mode::Lazy,
                    eager_reason: None,
                    setup_s,
                    materialize_s,
                    restore,
                    fill: Some(fill),
                    profile: Some(profile),
                    weights_refill_s,
                    weights_prefetch_s: prefetch_s(),
                    total_s: started.elapsed().as_secs_f64(),
                });
            }
            let ropts = match checked_opts(&ropts) {
                Ok(ropts) => ropts,
                Err(e) => {
                    staged.remove();
                    return Err(e);
                }
            };
            let t = Instant::now();
            let materialized = gstore_restore::restore_to_dir(store, &id, &m, dir, opts.memory_budget, progress);
            let materialize_s = t.elapsed().as_secs_f64();
            if let Err(e) = materialized {
                staged.remove_if_made();
                return Err(write_out(e.into()));
            }
            let restored = retrying_pid_races(|| Ok(checkpoint::restore(dir, &ropts)?));
            staged.remove_if_made();
            let restore = restored.map_err(restoring)?;
            let weights_refill_s = refilled().map_err(restoring)?;
            Ok(RunReport {
                pid: restore.pid,
                mode: Mode::Eager,
                eager_reason,
                setup_s,
                materialize_s,
                restore,
                fill: None,
                profile: None,
                weights_refill_s,
                weights_prefetch_s: prefetch_s(),
                total_s: started.elapsed().as_secs_f64(),
            })
        })
    })
}

/// Refuses, before anything runs, an image whose left-out weights cannot come back: the
/// model image each process refills from must be in the store, whole. Returns their
/// manifests, in `weights`' order.
fn check_weights(store: &IndexedStore, weights: &[cooperate::Registration]) -> Result<Vec<Manifest>> {
    let gone = |r: &cooperate::Registration, source| CaptureError::WeightsGone {
        pid: r.pid,
        image: format!("{} ({})", r.tag, r.image),
        source,
    };
    weights
        .iter()
        .map(|r| match cooperate::model_manifest(store, r) {
            Err(CaptureError::Store(e)) => Err(gone(r, e)),
            other => other,
        })
        .collect()
}

/// How often a restore is tried when CRIU loses a pid the image needs to another process.
const PID_RACE_ATTEMPTS: u32 = 3;

/// Runs `restore`, again (after it waited for the pids once more) when CRIU found a pid the
/// image needs taken by a process that got it after the wait saw it free: on a busy machine
/// pids are handed out quickly and wrap around. A failed CRIU restore leaves nothing running.
fn retrying_pid_races<T>(mut restore: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempt = 1;
    loop {
        match restore() {
            Err(e) if e.is_pid_taken() && attempt < PID_RACE_ATTEMPTS => attempt += 1,
            other => return other,
        }
    }
}

/// What [`check_compatible`] says of this machine, worked out on a thread of its own beside
/// a restore's first steps and waited for when the restore needs it.
struct Checked<'scope> {
    running: RefCell<Option<ScopedJoinHandle<'scope, MachineCheck>>>,
    verdict: OnceCell<Verdict>,
}

/// The driver a machine check loaded, and where the GPUs go or why the machine refuses.
type Verdict = (Option<CudaDriver>, std::result::Result<Vec<GpuPair>, String>);

/// The CUDA driver a machine check loaded (a GPU image's), and its verdict.
type MachineCheck = (Option<gstore_gpu_dump::Result<CudaDriver>>, gstore_gpu_dump::Result<Vec<GpuPair>>);

impl<'scope> Checked<'scope> {
    fn new(running: ScopedJoinHandle<'scope, MachineCheck>) -> Self {
        Checked { running: RefCell::new(Some(running)), verdict: OnceCell::new() }
    }

    /// Whether the check has finished.
    fn ready(&self) -> bool {
        self.running.borrow().as_ref().is_none_or(|r| r.is_finished())
    }

    /// `base` completed by the check once it passed: the driver it loaded and where the GPUs
    /// go; or why this machine cannot run the image.
    fn options<'a>(&'a self, base: &RestoreOptions<'a>) -> gstore_gpu_dump::Result<RestoreOptions<'a>> {
        let (cuda, pairs) = self.verdict.get_or_init(|| {
            let running = self.running.borrow_mut().take().expect("the check is joined once, here");
            let (cuda, pairs) = running.join().expect("the machine check does not panic");
            // check_compatible refuses with Incompatible only: its reason is kept.
            let reason = |e| match e {
                GpuDumpError::Incompatible { reason } => reason,
                e => e.to_string(),
            };
            (cuda.and_then(|c| c.ok()), pairs.map_err(reason))
        });
        let mut ropts = base.clone();
        ropts.cuda = cuda.as_ref();
        ropts.gpu_pairs = pairs.clone().map_err(|reason| GpuDumpError::Incompatible { reason })?;
        Ok(ropts)
    }
}

/// `criu restore --lazy-pages` (the CRIU options ask for it), started by `restore`, with gstore
/// serving the memory of image `id`. The GPU state (if any) is restored while the fill goes
/// on; the restore returns once every page is in place. A fill that fails kills the restored
/// tree, and its error is the one reported.
fn run_lazy(
    store: &IndexedStore,
    id: &ObjectId,
    dir: &Path,
    prepared: &gstore_lazy::Prepared,
    restore: impl FnOnce() -> Result<RestoreReport>,
) -> Result<(RestoreReport, gstore_lazy::FillReport, String)> {
    let pids: Vec<i32> = prepared.layout.processes.iter().map(|p| p.pid as i32).collect();
    gstore_lazy::during::serve_during(store, id, dir, prepared, &pids, |_| restore()).map_err(|e| match e {
        gstore_lazy::during::Failed::Restore(e) => e,
        gstore_lazy::during::Failed::Fill(e) => e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gstore_gpu_dump::{CriuCause, GpuDumpError};

    fn criu_failed(cause: CriuCause) -> CaptureError {
        CaptureError::Gpu(GpuDumpError::CriuFailed {
            action: "restore",
            status: "exit status: 1".into(),
            cause,
            details: String::new(),
        })
    }

    #[test]
    fn a_pid_lost_to_another_process_is_tried_again_a_few_times_only() {
        let mut tries = 0;
        let r = retrying_pid_races(|| {
            tries += 1;
            if tries < PID_RACE_ATTEMPTS {
                Err(criu_failed(CriuCause::PidTaken))
            } else {
                Ok(tries)
            }
        });
        assert_eq!(r.unwrap(), PID_RACE_ATTEMPTS);
        let mut tries = 0;
        let r: Result<()> = retrying_pid_races(|| {
            tries += 1;
            Err(criu_failed(CriuCause::PidTaken))
        });
        assert!(r.unwrap_err().is_pid_taken());
        assert_eq!(tries, PID_RACE_ATTEMPTS);
        let mut tries = 0;
        let r: Result<()> = retrying_pid_races(|| {
            tries += 1;
            Err(criu_failed(CriuCause::Unknown))
        });
        assert!(r.is_err());
        assert_eq!(tries, 1, "other CRIU failures are not tried again");
    }
}
