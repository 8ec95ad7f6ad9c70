//! Checkpoint and restore of a process, GPU state included, with rollback: a failure after the
//! GPU lock always ends with the process resumed, or with an error that says it may be lost.
//!
//! Capture: lock the CUDA API → move GPU memory into host memory → `criu dump` (→ with
//! `--leave-running`, bring the GPU state back at once). Restore: wait for the image's pids to
//! be free → `criu restore --restore-detached` → restore + unlock the GPU state.
//! Nothing here knows about the store; [`CaptureReport::metadata`] is what goes into a manifest.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use gstore_format::meta::{ImageMeta, Kind, TcpConnections};
use serde::{Deserialize, Serialize};

use crate::criu::{self, Criu, DumpOptions};
use crate::cuda::ffi::GpuPair;
use crate::cuda::{self, CudaDriver, GpuInfo, ProcessState};
use crate::error::{GpuDumpError, Phase, Result};
use crate::procfs;

/// Default time a process gets to reach a lockable point: 10 s.
pub const DEFAULT_LOCK_TIMEOUT_MS: u32 = 10_000;
/// Default time a restore waits for the image's pids to be free: 10 s.
pub const DEFAULT_PID_WAIT: Duration = Duration::from_secs(10);

/// What kind of process an image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageKind {
    /// A process with CUDA state: restore needs a compatible GPU machine.
    GpuProcess,
    /// A CPU-only process: CRIU alone.
    CpuProcess,
}

impl ImageKind {
    /// "gpu-process" or "cpu-process".
    pub fn as_str(self) -> &'static str {
        match self {
            ImageKind::GpuProcess => "gpu-process",
            ImageKind::CpuProcess => "cpu-process",
        }
    }

    /// The process kind an image's kind is, if it is one.
    pub fn of(kind: &Kind) -> Option<Self> {
        match kind {
            Kind::GpuProcess => Some(ImageKind::GpuProcess),
            Kind::CpuProcess => Some(ImageKind::CpuProcess),
            _ => None,
        }
    }
}

impl From<ImageKind> for Kind {
    fn from(k: ImageKind) -> Kind {
        match k {
            ImageKind::GpuProcess => Kind::GpuProcess,
            ImageKind::CpuProcess => Kind::CpuProcess,
        }
    }
}

impl std::fmt::Display for ImageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to checkpoint.
#[derive(Debug, Clone)]
pub struct CheckpointOptions<'a> {
    /// Keep the process running after the dump; otherwise CRIU kills it once the image is written.
    pub leave_running: bool,
    /// The process belongs to a terminal session (CRIU `--shell-job`).
    pub shell_job: bool,
    /// How long the GPU lock waits for the process to reach a lockable point (0: no limit).
    pub lock_timeout_ms: u32,
    /// Further `criu dump` arguments, passed as they are.
    pub extra_criu_args: Vec<String>,
    /// Send the image to an image streamer listening in the directory (CRIU `--stream`).
    pub stream: bool,
    /// CRIU's action script (`--action-script`).
    pub action_script: Option<PathBuf>,
    /// Told the report so far and the time just before `criu dump` starts (everything but the
    /// dump's and resume's timings is known then).
    pub dump_starts: Option<Sender<(CaptureReport, Instant)>>,
    /// The CRIU to run.
    pub criu: &'a Criu,
    /// The CUDA driver, if one could be loaded; required for processes that use CUDA.
    pub cuda: Option<&'a CudaDriver>,
    /// More metadata for the image, from the caller ([`CaptureReport::extra`]).
    pub metadata: ImageMeta,
}

impl<'a> CheckpointOptions<'a> {
    /// Defaults: the process dies with the dump, no shell job, a 10 s lock timeout, no driver.
    pub fn new(criu: &'a Criu) -> Self {
        CheckpointOptions {
            leave_running: false,
            shell_job: false,
            lock_timeout_ms: DEFAULT_LOCK_TIMEOUT_MS,
            extra_criu_args: Vec::new(),
            stream: false,
            action_script: None,
            dump_starts: None,
            criu,
            cuda: None,
            metadata: ImageMeta::default(),
        }
    }
}

pub use gstore_format::meta::CaptureTimings;

/// What a checkpoint did and what the image needs to be restored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureReport {
    /// The checkpointed process (the root of the dumped tree).
    pub pid: u32,
    /// The processes whose GPU state was checkpointed: `pid` and those below it that held
    /// CUDA contexts (empty for CPU images).
    pub gpu_pids: Vec<u32>,
    /// GPU or CPU-only process.
    pub image_kind: ImageKind,
    /// Whether the process kept running.
    pub leave_running: bool,
    /// The CRIU version that wrote the image.
    pub criu_version: String,
    /// The established TCP connections the dump holds (`--tcp-established`), if any.
    #[serde(default)]
    pub tcp_connections: Option<TcpConnections>,
    /// The driver's CUDA version, "major.minor" (GPU images only).
    pub cuda_driver_version: Option<String>,
    /// The GPUs the capturing process could see (GPU images only). All of them, because
    /// which ones the checkpointed process used is not known once its handles are released.
    pub gpus: Vec<GpuInfo>,
    /// Phase timings.
    pub timings: CaptureTimings,
    /// Metadata the caller added ([`CheckpointOptions::metadata`]), recorded beside the rest.
    #[serde(default, skip_serializing_if = "ImageMeta::is_empty")]
    pub extra: ImageMeta,
}

impl CaptureReport {
    /// The metadata to record in the image manifest;
    /// [`crate::compat::ImageNeeds::from_metadata`] reads what a restore needs back.
    pub fn metadata(&self) -> ImageMeta {
        let mut meta = self.extra.clone();
        meta.kind = Some(self.image_kind.into());
        meta.pid = Some(self.pid);
        meta.leave_running = Some(self.leave_running);
        meta.criu_version = Some(self.criu_version.clone());
        meta.tcp_connections = self.tcp_connections;
        meta.cuda_driver_version.clone_from(&self.cuda_driver_version);
        if self.image_kind == ImageKind::GpuProcess {
            meta.gpus = Some(self.gpus.clone());
            meta.gpu_pids = Some(self.gpu_pids.clone());
        }
        meta.capture_timings = Some(self.timings.clone());
        meta
    }
}

/// CRIU's own `--ghost-limit`: deleted files up to this size go into the image unasked.
const CRIU_GHOST_LIMIT: u64 = 1 << 20;

/// The `--ghost-limit` a tree whose largest deleted file takes `largest` bytes needs: none
/// within CRIU's default, else twice that file, room for it to grow until the freeze. A
/// deleted file the process holds (NCCL's shared-memory segments, a removed log still
/// written) is part of its state: a restore without it fails.
fn ghost_limit_for(largest: u64) -> Option<u64> {
    (largest > CRIU_GHOST_LIMIT).then(|| largest.saturating_mul(2))
}

/// CRIU's option to dump and restore established TCP connections.
const TCP_ESTABLISHED: &str = "--tcp-established";

/// The established TCP connections a dump will hold: those of a tree whose connections are
/// all between its own processes (ranks joined over loopback), or any when the user's CRIU
/// options ask for them (`user_args`). A connection to the outside is the user's call: CRIU
/// refuses it otherwise, and the refusal says how to ask.
fn tcp_connections(links: procfs::TcpLinks, user_args: &[String]) -> Option<TcpConnections> {
    let inside = links.outside == 0;
    match (user_args.iter().any(|a| a == TCP_ESTABLISHED), links.connected > 0) {
        (true, _) => Some(if inside { TcpConnections::Inside } else { TcpConnections::Outside }),
        (false, true) if inside => Some(TcpConnections::Inside),
        _ => None,
    }
}

/// The CRIU options that dump or restore `connections`, before the user's own (which come
/// later on CRIU's command line and win). Connections between the tree's own processes need
/// no network lock: both ends are frozen together and come back together, and locking would
/// need iptables (or nftables) on the machine.
pub fn tcp_options(connections: Option<TcpConnections>) -> Vec<String> {
    match connections {
        None => Vec::new(),
        Some(TcpConnections::Inside) => vec![TCP_ESTABLISHED.into(), "--network-lock".into(), "skip".into()],
        Some(TcpConnections::Outside) => vec![TCP_ESTABLISHED.into()],
    }
}

/// Checkpoints process `pid` and the processes below it into the empty (or new) directory `dir`.
///
/// The GPU processes of the tree ([`gpu_processes`]) are all locked before any is checkpointed,
/// their GPU state moves into host memory (all at once), then `criu dump` runs; with
/// `leave_running` their GPU state is restored and unlocked right after the dump. A failure
/// after the first lock resumes every one of them and names the failed phase
/// ([`GpuDumpError::Resumed`]); if even that fails the error says the process may be lost
/// ([`GpuDumpError::Lost`]). A tree without CUDA goes through CRIU alone.
pub fn checkpoint(pid: u32, dir: &Path, opts: &CheckpointOptions<'_>) -> Result<CaptureReport> {
    if !procfs::is_alive(pid) {
        let detail = if procfs::exists(pid) { " (only a zombie that has exited is left)" } else { "" };
        return Err(GpuDumpError::NoSuchProcess { pid, detail });
    }
    if dir.join("inventory.img").exists() {
        return Err(GpuDumpError::Image {
            path: dir.to_path_buf(),
            detail: "the directory already holds a CRIU image (inventory.img); checkpoint into an empty one"
                .to_string(),
        });
    }
    let tree = procfs::descendants(&[pid]);
    let cuda_users: Vec<u32> = tree.iter().copied().filter(|&p| cuda::process_uses_cuda(p)).collect();
    let ghost_limit = ghost_limit_for(procfs::largest_deleted_file(&tree));
    let tcp_connections = tcp_connections(procfs::tcp_links(&tree), &opts.extra_criu_args);
    let mut extra_args = tcp_options(tcp_connections);
    extra_args.extend(opts.extra_criu_args.iter().cloned());
    let gpu = match cuda_users.first() {
        Some(&user) => Some(opts.cuda.ok_or_else(|| GpuDumpError::GpuProcessWithoutDriver {
            pid: user,
            detail: format!(
                "none was passed in (CudaDriver::load found no {}); install the NVIDIA driver (>= 570)",
                cuda::LIBCUDA_NAMES[0]
            ),
        })?),
        None => None,
    };
    let mut report = CaptureReport {
        pid,
        gpu_pids: Vec::new(),
        image_kind: ImageKind::CpuProcess,
        leave_running: opts.leave_running,
        criu_version: opts.criu.version(),
        tcp_connections,
        cuda_driver_version: None,
        gpus: Vec::new(),
        timings: CaptureTimings::default(),
        extra: opts.metadata.clone(),
    };
    let gpu = match gpu {
        Some(cuda) => {
            // Queried before the lock: cuInit can take seconds and must not extend the freeze.
            let (major, minor) = cuda.driver_version()?;
            report.gpu_pids = gpu_processes(cuda, pid, &cuda_users);
            if report.gpu_pids.is_empty() {
                None
            } else {
                report.cuda_driver_version = Some(format!("{major}.{minor}"));
                report.gpus = cuda.devices()?;
                report.image_kind = ImageKind::GpuProcess;
                Some(cuda)
            }
        }
        None => None,
    };
    let gpu_pids = &report.gpu_pids;
    if let Some(cuda) = gpu {
        let start = Instant::now();
        for &p in gpu_pids {
            cuda.lock(p, opts.lock_timeout_ms).map_err(|e| rollback(cuda, gpu_pids, Phase::GpuLock, e))?;
        }
        report.timings.lock_s = Some(seconds(start));
        let start = Instant::now();
        on_each(gpu_pids, |p| cuda.checkpoint(p)).map_err(|e| rollback(cuda, gpu_pids, Phase::GpuCheckpoint, e))?;
        report.timings.gpu_checkpoint_s = Some(seconds(start));
    }
    let dump_opts = DumpOptions {
        leave_running: opts.leave_running,
        shell_job: opts.shell_job,
        stream: opts.stream,
        action_script: opts.action_script.clone(),
        ghost_limit,
        extra_args,
    };
    let start = Instant::now();
    if let Some(tell) = &opts.dump_starts {
        // Nobody listening is no reason to stop.
        let _ = tell.send((report.clone(), start));
    }
    let dumped = opts.criu.dump(pid, dir, &dump_opts);
    report.timings.criu_dump_s = seconds(start);
    if let Err(e) = dumped {
        if !procfs::is_alive(pid) {
            return Err(GpuDumpError::DumpKilled { pid, source: Box::new(e) });
        }
        return Err(match gpu {
            Some(cuda) => rollback(cuda, gpu_pids, Phase::CriuDump, e),
            // CRIU thaws the tree itself when a dump fails.
            None => GpuDumpError::Resumed { phase: Phase::CriuDump, source: Box::new(e) },
        });
    }
    if let (true, Some(cuda)) = (opts.leave_running, gpu) {
        let start = Instant::now();
        resume_all(cuda, gpu_pids, &[]).map_err(|e| rollback(cuda, gpu_pids, Phase::GpuResume, e))?;
        report.timings.gpu_resume_s = Some(seconds(start));
    }
    Ok(report)
}

/// How to restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions<'a> {
    /// The CRIU to run.
    pub criu: &'a Criu,
    /// The CUDA driver; required when `gpu` is set.
    pub cuda: Option<&'a CudaDriver>,
    /// The image is a GPU image (its GPU state is restored and unlocked after CRIU).
    pub gpu: bool,
    /// Where its GPUs go ([`crate::check_compatible`] gives them); empty: where they were.
    pub gpu_pairs: Vec<GpuPair>,
    /// The processes whose GPU state is restored ([`crate::ImageMeta::gpu_pids`]); empty: the
    /// restored root alone (images captured before process trees were).
    pub gpu_pids: Vec<u32>,
    /// The pid the process had, if known; waited for like every pid in the image.
    pub original_pid: Option<u32>,
    /// How long to wait for the image's pids to be free (a killed original is reaped by PID 1
    /// about a second after the dump).
    pub pid_wait: Duration,
    /// The image was dumped with `--shell-job`.
    pub shell_job: bool,
    /// Further `criu restore` arguments, passed as they are.
    pub extra_criu_args: Vec<String>,
}

impl<'a> RestoreOptions<'a> {
    /// Defaults: CPU image, no driver, no known pid, a 10 s pid wait.
    pub fn new(criu: &'a Criu) -> Self {
        RestoreOptions {
            criu,
            cuda: None,
            gpu: false,
            gpu_pairs: Vec::new(),
            gpu_pids: Vec::new(),
            original_pid: None,
            pid_wait: DEFAULT_PID_WAIT,
            shell_job: false,
            extra_criu_args: Vec::new(),
        }
    }
}

/// Seconds spent in each restore phase; `None` for phases that did not run. With several GPU
/// processes (restored side by side), the GPU phases are the longest any of them took.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RestoreTimings {
    /// Waiting for the image's pids to be free.
    pub pid_wait_s: f64,
    /// `criu restore`.
    pub criu_restore_s: f64,
    /// `cuCheckpointProcessRestore` (host memory → GPU).
    pub gpu_restore_s: Option<f64>,
    /// `cuCheckpointProcessUnlock`.
    pub gpu_unlock_s: Option<f64>,
}

/// The outcome of a restore.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreReport {
    /// The restored process (its original pid).
    pub pid: u32,
    /// Phase timings.
    pub timings: RestoreTimings,
}

/// Restores the process image in `dir`, detached from this process. Run
/// [`crate::compat::check_compatible`] first to refuse unsuitable machines before this
/// touches anything.
pub fn restore(dir: &Path, opts: &RestoreOptions<'_>) -> Result<RestoreReport> {
    started_driver(opts)?;
    restore_stopped(dir, opts)?.resume(opts)
}

/// The CUDA driver a GPU image's restore uses, started (`cuInit`); `None` for a CPU image.
/// A GPU image without a driver is refused.
fn started_driver<'a>(opts: &RestoreOptions<'a>) -> Result<Option<&'a CudaDriver>> {
    match (opts.gpu, opts.cuda) {
        (true, None) => {
            Err(GpuDumpError::Incompatible { reason: "it is a GPU image but no CUDA driver was loaded".to_string() })
        }
        (true, Some(cuda)) => {
            cuda.init()?;
            Ok(Some(cuda))
        }
        (false, _) => Ok(None),
    }
}

/// How long a task restored with `--leave-stopped` may take to show as stopped.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Restores the process tree in `dir` with its tasks left stopped (`criu restore
/// --leave-stopped`): nothing of it has run when this returns, so work that must pass before
/// the tree runs (a check of the machine) can go on while CRIU restores it. Waits for the
/// image's pids to be free first, and returns once every process shows as stopped.
/// [`Stopped::resume`] lets it run; dropping it kills it.
pub fn restore_stopped(dir: &Path, opts: &RestoreOptions<'_>) -> Result<Stopped> {
    let criu::ImageTree { ids: mut pids, processes } = criu::image_tree(dir)?;
    pids.extend(opts.original_pid);
    let start = Instant::now();
    let deadline = start + opts.pid_wait;
    for pid in pids {
        criu::wait_pid_free(pid, deadline.saturating_duration_since(Instant::now()))
            .map_err(|_| GpuDumpError::PidInUse { pid, timeout: opts.pid_wait })?;
    }
    let timings = RestoreTimings { pid_wait_s: seconds(start), ..RestoreTimings::default() };
    let start = Instant::now();
    let mut extra_args = vec!["--leave-stopped".to_string()];
    extra_args.extend(opts.extra_criu_args.iter().cloned());
    let criu_opts = criu::RestoreOptions { shell_job: opts.shell_job, extra_args };
    let pid = opts.criu.restore(dir, &criu_opts)?;
    let mut stopped = Stopped { pid, processes, timings, running: false };
    // CRIU sends each task SIGSTOP and detaches: the stop lands as the task next returns to
    // user space, so a task shows as running for a moment but runs none of its code.
    for &p in &stopped.processes {
        procfs::wait_stopped(p, STOP_WAIT).map_err(|state| GpuDumpError::NotStopped {
            pid: p,
            state,
            timeout: STOP_WAIT,
        })?;
    }
    stopped.timings.criu_restore_s = seconds(start);
    Ok(stopped)
}

/// A process tree restored by [`restore_stopped`], its tasks stopped. Dropped before
/// [`Stopped::resume`] (a check that failed, an error on the way), it is killed: a restored
/// tree that never ran is never left behind.
#[derive(Debug)]
pub struct Stopped {
    pid: u32,
    processes: Vec<u32>,
    timings: RestoreTimings,
    running: bool,
}

impl Stopped {
    /// The restored root (its original pid).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the tree run (`SIGCONT` to each of its processes), then brings the GPU state of
    /// a GPU image back (`opts` says which processes and onto which GPUs) and unlocks it: the
    /// processes run CPU code meanwhile, and their CUDA calls wait for the unlock. A GPU image
    /// without a driver (or one that does not start) is refused, and the tree killed, before
    /// anything of it runs.
    pub fn resume(mut self, opts: &RestoreOptions<'_>) -> Result<RestoreReport> {
        let cuda = started_driver(opts)?;
        self.running = true;
        for &p in &self.processes {
            // SAFETY: kill(2) with a pid of the tree CRIU restored for us and a valid signal.
            unsafe { libc::kill(p as i32, libc::SIGCONT) };
        }
        let mut timings = std::mem::take(&mut self.timings);
        if let Some(cuda) = cuda {
            let gpu_pids = if opts.gpu_pids.is_empty() { vec![self.pid] } else { opts.gpu_pids.clone() };
            let (restore_s, unlock_s) = resume_all(cuda, &gpu_pids, &opts.gpu_pairs)?;
            timings.gpu_restore_s = restore_s;
            timings.gpu_unlock_s = unlock_s;
        }
        Ok(RestoreReport { pid: self.pid, timings })
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.running {
            for &p in &self.processes {
                // SAFETY: kill(2) with a pid of the tree CRIU restored for us, which never ran.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
        }
    }
}

/// The processes among `cuda_users` (those of the tree under `root` that map libcuda) whose
/// GPU state the driver manages: those it knows a CUDA restore thread of. A process that maps
/// libcuda without a context of its own (a parent that imported torch but left the GPUs to its
/// ranks, a data loader worker forked from a CUDA process) and a short-lived one that is gone
/// already are left to CRIU, as its CUDA plugin does. `root` is kept when the driver fails to
/// answer for another reason, so that the lock says why.
pub fn gpu_processes(cuda: &CudaDriver, root: u32, cuda_users: &[u32]) -> Vec<u32> {
    cuda_users
        .iter()
        .copied()
        .filter(|&p| match cuda.restore_thread_id(p) {
            Ok(_) => true,
            Err(e) => p == root && !e.is_no_context(),
        })
        .collect()
}

/// Runs `step` for every pid of `pids` at once (one thread each beyond the first); the first
/// error, in pid order, is the result.
pub fn on_each<T: Send>(pids: &[u32], step: impl Fn(u32) -> Result<T> + Sync) -> Result<Vec<T>> {
    match pids {
        [] => Ok(Vec::new()),
        [only] => Ok(vec![step(*only)?]),
        _ => std::thread::scope(|s| {
            let step = &step;
            let running: Vec<_> = pids.iter().map(|&p| s.spawn(move || step(p))).collect();
            running.into_iter().map(|t| t.join().expect("a GPU step does not panic")).collect()
        }),
    }
}

/// Brings the GPU state of every pid of `pids` back to running ([`resume`]), side by side;
/// returns the longest restore and unlock any of them took. A failure names its pid
/// ([`GpuDumpError::GpuRestore`]).
pub fn resume_all(cuda: &CudaDriver, pids: &[u32], pairs: &[GpuPair]) -> Result<(Option<f64>, Option<f64>)> {
    let times = on_each(pids, |p| {
        resume(cuda, p, pairs).map_err(|e| GpuDumpError::GpuRestore { pid: p, source: Box::new(e) })
    })?;
    let (restores, unlocks): (Vec<_>, Vec<_>) = times.into_iter().unzip();
    let longest = |seconds: Vec<Option<f64>>| seconds.into_iter().flatten().reduce(f64::max);
    Ok((longest(restores), longest(unlocks)))
}

/// Brings `pid`'s GPU state back to running from wherever it stands: checkpointed → restore
/// (onto the GPUs `pairs` name, if any) → unlock; locked → unlock; running → nothing. Returns
/// the seconds spent restoring and unlocking (`None` when that step was not needed).
fn resume(cuda: &CudaDriver, pid: u32, pairs: &[GpuPair]) -> Result<(Option<f64>, Option<f64>)> {
    let mut restore_s = None;
    let state = match cuda.state(pid) {
        // No context: the driver holds nothing of it to bring back.
        Err(e) if e.is_no_context() => return Ok((None, None)),
        state => state?,
    };
    match state {
        ProcessState::Running => return Ok((None, None)),
        ProcessState::Checkpointed => {
            let start = Instant::now();
            cuda.restore(pid, pairs)?;
            restore_s = Some(seconds(start));
        }
        ProcessState::Locked => {}
        state => return Err(GpuDumpError::GpuState { pid, state, action: "resume it" }),
    }
    let start = Instant::now();
    cuda.unlock(pid)?;
    Ok((restore_s, Some(seconds(start))))
}

/// Resumes every pid of `pids` after `phase` failed with `source`, and says how that went. All
/// are tried, whichever fails; the first failure is reported with the state of its pid.
fn rollback(cuda: &CudaDriver, pids: &[u32], phase: Phase, source: GpuDumpError) -> GpuDumpError {
    let outcomes: Vec<_> = pids.iter().map(|&p| (p, resume(cuda, p, &[]))).collect();
    match outcomes.into_iter().find_map(|(p, outcome)| outcome.err().map(|e| (p, e))) {
        None => GpuDumpError::Resumed { phase, source: Box::new(source) },
        Some((pid, rollback)) => GpuDumpError::Lost {
            phase,
            state: cuda.state(pid).map_or_else(|_| "unknown".to_string(), |s| s.to_string()),
            source: Box::new(source),
            rollback: Box::new(rollback),
        },
    }
}

fn seconds(start: Instant) -> f64 {
    start.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_inside_the_tree_are_dumped_unasked_and_outside_ones_only_when_asked() {
        let links = |connected, outside| procfs::TcpLinks { connected, outside };
        let asked = [TCP_ESTABLISHED.to_string()];
        assert_eq!(tcp_connections(links(0, 0), &[]), None);
        assert_eq!(tcp_connections(links(4, 0), &[]), Some(TcpConnections::Inside));
        assert_eq!(tcp_connections(links(4, 1), &[]), None, "CRIU refuses, and says how to ask");
        assert_eq!(tcp_connections(links(4, 1), &asked), Some(TcpConnections::Outside));
        assert_eq!(tcp_options(None), Vec::<String>::new());
        assert_eq!(tcp_options(Some(TcpConnections::Inside)), ["--tcp-established", "--network-lock", "skip"]);
        assert_eq!(tcp_options(Some(TcpConnections::Outside)), ["--tcp-established"]);
    }

    fn report(kind: ImageKind) -> CaptureReport {
        CaptureReport {
            pid: 42,
            gpu_pids: if kind == ImageKind::GpuProcess { vec![42, 57] } else { Vec::new() },
            image_kind: kind,
            leave_running: true,
            criu_version: "4.1.1".into(),
            tcp_connections: None,
            cuda_driver_version: (kind == ImageKind::GpuProcess).then(|| "13.0".to_string()),
            gpus: if kind == ImageKind::GpuProcess {
                vec![GpuInfo { index: 0, name: "NVIDIA H200".into(), total_mem_bytes: 150_000_000_000, uuid: None }]
            } else {
                Vec::new()
            },
            timings: CaptureTimings { criu_dump_s: 0.5, ..CaptureTimings::default() },
            extra: ImageMeta::default(),
        }
    }

    #[test]
    fn image_kind_names() {
        assert_eq!(ImageKind::GpuProcess.as_str(), "gpu-process");
        assert_eq!(ImageKind::of(&Kind::parse("cpu-process")), Some(ImageKind::CpuProcess));
        assert_eq!(ImageKind::of(&Kind::parse("files")), None);
        assert_eq!(serde_json::to_value(ImageKind::GpuProcess).expect("json"), "gpu-process");
        assert_eq!(Kind::from(ImageKind::GpuProcess).as_str(), "gpu-process");
    }

    #[test]
    fn metadata_of_a_gpu_capture() {
        // As written into the manifest.
        let meta = report(ImageKind::GpuProcess).metadata().to_map();
        assert_eq!(meta["kind"], "gpu-process");
        assert_eq!(meta["pid"], 42);
        assert_eq!(meta["leave_running"], true);
        assert_eq!(meta["criu_version"], "4.1.1");
        assert_eq!(meta["cuda_driver_version"], "13.0");
        assert_eq!(meta["gpus"][0]["name"], "NVIDIA H200");
        assert_eq!(meta["gpu_pids"], serde_json::json!([42, 57]));
        assert_eq!(meta["capture_timings"]["criu_dump_s"], 0.5);
        assert!(meta["capture_timings"]["lock_s"].is_null());
    }

    #[test]
    fn metadata_of_a_cpu_capture_has_no_gpu_fields() {
        let meta = report(ImageKind::CpuProcess).metadata().to_map();
        assert_eq!(meta["kind"], "cpu-process");
        assert!(!meta.contains_key("gpus") && !meta.contains_key("cuda_driver_version"));
        assert!(!meta.contains_key("gpu_pids"));
        let json = serde_json::to_string(&report(ImageKind::CpuProcess)).expect("serialize");
        let back: CaptureReport = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, report(ImageKind::CpuProcess));
    }

    #[test]
    fn gpu_restore_without_a_driver_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let criu = Criu::find(Some(crate::testutil::fake_criu_4_2())).expect("fake criu");
        let opts = RestoreOptions { gpu: true, ..RestoreOptions::new(&criu) };
        let err = restore(dir.path(), &opts).expect_err("no driver");
        assert!(err.to_string().contains("GPU image but no CUDA driver"), "{err}");
    }
}
