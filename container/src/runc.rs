//! Containers run by runc itself (no podman on the machine, or `--runtime runc`), GPU state
//! included: gstore locks the CUDA processes of the container and moves their GPU memory into
//! host memory through the driver's checkpoint API before `runc checkpoint` (as it does for bare
//! processes), so no `cuda-checkpoint` binary and no CRIU CUDA plugin is needed; after the dump
//! (with `--leave-running`) and after `runc restore` it brings their GPU state back.
//!
//! runc writes CRIU's images into a directory (CRIU's RPC mode has no streaming), so the image
//! is staged there: `checkpoint/` (runc's `--image-path`) and the bundle's `config.json`. The
//! page images are pushed while CRIU writes them ([`crate::follow`]), the rest once runc returns,
//! as one image whose page images get page-level deltas against earlier checkpoints. A push
//! that fails after runc stopped the container restores it from the staged images.

use crate::checkpoint::kernel;
use crate::error::{ContainerError, Result};
use crate::follow;
use crate::podman::{failed, on_path, path_with_criu_first, succeeds};
use gstore_gpu_dump::checkpoint::{gpu_processes, on_each, resume_all, CaptureTimings};
use gstore_gpu_dump::cuda::{self, ffi::GpuPair};
use gstore_gpu_dump::procfs;
use gstore_gpu_dump::{
    check_compatible, Criu, CudaDriver, GpuDumpError, GpuMap, ImageNeeds, MachineInfo, ProcessState,
};
use gstore_lazy::mode::Mode;
use gstore_store::commands::push::PushReport;
use gstore_store::format::manifest::Manifest;
use gstore_store::format::meta::{ContainerMeta, ImageMeta, Kind, RuncMeta, Runtime};
use gstore_store::progress::Progress;
use gstore_store::{IndexedStore, ObjectId, TagRef};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Where the image keeps CRIU's images.
const IMAGES: &str = "checkpoint";
/// Where the image keeps the bundle's configuration.
const CONFIG: &str = "config.json";

/// runc on this machine, with the CRIU it runs.
pub struct Runc {
    bin: PathBuf,
    /// `PATH` for runc: CRIU's directory first.
    path_env: OsString,
    criu: Criu,
}

/// A container as `runc state` describes it.
#[derive(Clone, Debug, Deserialize)]
pub struct State {
    /// Its id.
    pub id: String,
    /// Its init process (host pid).
    pub pid: u32,
    /// "running", "paused", "stopped", "created".
    pub status: String,
    /// Its bundle directory.
    pub bundle: PathBuf,
    /// Its root filesystem.
    pub rootfs: PathBuf,
}

impl Runc {
    /// Whether `runc` is on `PATH`.
    pub fn installed() -> bool {
        on_path("runc").is_some()
    }

    /// Whether runc knows a container `id` (`runc state` answers for it), without CRIU.
    pub fn knows(id: &str) -> bool {
        succeeds("runc", &["state", id])
    }

    /// runc from `PATH`, with the CRIU gstore uses (`criu`, else the one it finds): passed with
    /// `--criu` and first on runc's `PATH`.
    pub fn find(criu: Option<&Path>) -> Result<Runc> {
        let bin = on_path("runc").ok_or_else(|| {
            ContainerError::NoRuntime(
                "runc is not installed (Debian: apt-get install runc; or put its static binary on PATH); gstore \
                 checkpoints containers without podman through it"
                    .into(),
            )
        })?;
        let criu = Criu::find(criu).map_err(|e| ContainerError::NoRuntime(format!("runc needs CRIU >= 4: {e}")))?;
        Ok(Runc { bin, path_env: path_with_criu_first(&criu), criu })
    }

    /// The CRIU runc uses.
    pub fn criu(&self) -> &Criu {
        &self.criu
    }

    /// `runc --criu CRIU ARGS` with CRIU's directory first on its `PATH`.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--criu").arg(self.criu.path()).args(args).env("PATH", &self.path_env).stdin(Stdio::null());
        c
    }

    /// Runs `runc ARGS`; its standard output, or the failure with the end of its stderr.
    fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.command(args).output().map_err(|e| ContainerError::io("running", &self.bin, e))?;
        if !out.status.success() {
            return Err(failed(format!("runc {}", args.join(" ")), &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// runc's version ("runc version 1.1.5" → "1.1.5").
    pub fn version(&self) -> String {
        let v = self.run(&["--version"]).unwrap_or_default();
        v.lines().next().and_then(|l| l.split_whitespace().last()).unwrap_or_default().to_string()
    }

    /// The container `id` ([`ContainerError::NoSuchContainer`] when runc knows none).
    pub fn state(&self, id: &str) -> Result<State> {
        let text = self.run(&["state", id]).map_err(|e| match e {
            ContainerError::Runtime { stderr, .. } if stderr.contains("does not exist") => {
                ContainerError::NoSuchContainer(id.to_string())
            }
            e => e,
        })?;
        serde_json::from_str(&text).map_err(|e| ContainerError::Runtime {
            command: format!("runc state {id}"),
            status: "unreadable output".into(),
            stderr: e.to_string(),
        })
    }

    /// The host pids of the container's processes (`runc ps --format json`).
    pub fn pids(&self, id: &str) -> Result<Vec<u32>> {
        let text = self.run(&["ps", "--format", "json", id])?;
        serde_json::from_str(&text).map_err(|e| ContainerError::Runtime {
            command: format!("runc ps --format json {id}"),
            status: "unreadable output".into(),
            stderr: e.to_string(),
        })
    }

    /// `runc checkpoint`: CRIU's images into `images`, its log into `work`. Without
    /// `leave_running` runc ends and deletes the container once the dump is complete.
    fn checkpoint(&self, id: &str, images: &Path, work: &Path, leave_running: bool) -> Result<()> {
        let (images, work) = (images.display().to_string(), work.display().to_string());
        let mut args = vec!["checkpoint", "--image-path", &images, "--work-path", &work];
        if leave_running {
            args.push("--leave-running");
        }
        args.push(id);
        self.run(&args).map(drop).map_err(|e| with_criu_log(e, &Path::new(&work).join("dump.log")))
    }

    /// `runc restore --detach` of container `id` from `images` with the bundle `bundle`; with
    /// `lazy`, CRIU's `--lazy-pages` (its lazy-pages daemon listens in `work`). runc runs in a
    /// process group of its own (CRIU with it), told to `started` once it runs. runc's standard
    /// error goes to a file in `work`, never a pipe: a restored process whose standard streams
    /// were pipes inherits runc's.
    fn restore(
        &self,
        id: &str,
        (images, work, bundle): (&Path, &Path, &Path),
        lazy: bool,
        started: &dyn Fn(u32) -> Result<()>,
    ) -> Result<()> {
        std::fs::create_dir_all(work).map_err(|e| ContainerError::io("creating", work, e))?;
        let err_path = work.join("runc-restore.stderr");
        let err = std::fs::File::create(&err_path).map_err(|e| ContainerError::io("creating", &err_path, e))?;
        let (images_s, work_s, bundle_s) =
            (images.display().to_string(), work.display().to_string(), bundle.display().to_string());
        let mut args =
            vec!["restore", "--image-path", &images_s, "--work-path", &work_s, "--bundle", &bundle_s, "--detach"];
        if lazy {
            args.push("--lazy-pages");
        }
        args.push(id);
        let mut child = self
            .command(&args)
            .stdout(Stdio::null())
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| ContainerError::io("running", &self.bin, e))?;
        let status = started(child.id())
            .and_then(|()| child.wait().map_err(|e| ContainerError::io("waiting for", &self.bin, e)));
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        if status.success() {
            return Ok(());
        }
        let stderr = std::fs::read(&err_path).unwrap_or_default();
        let out = std::process::Output { status, stdout: Vec::new(), stderr };
        Err(with_criu_log(failed(format!("runc {}", args.join(" ")), &out), &work.join("restore.log")))
    }
}

/// CRIU log lines a container's checkpoint or restore can fail with, and what to do.
const CRIU_HINTS: [(&str, &str); 2] = [
    (
        "Can't lookup mount",
        "a file the container's processes hold open lies outside the container's mounts: start it with its \
         standard streams on /dev/null, or pipes",
    ),
    (
        "Can't create a temporary directory: Read-only file system",
        "the container's root file system is read-only and has no /tmp: CRIU >= 4.2 restores the root \
         read-only and moves it through its /tmp; add an empty /tmp to the image",
    ),
];

/// `e` (a failed runc command) with the errors of CRIU's log `log` added, which runc only names.
fn with_criu_log(e: ContainerError, log: &Path) -> ContainerError {
    let Ok(text) = std::fs::read_to_string(log) else { return e };
    let errors: Vec<&str> =
        text.lines().filter(|l| l.contains("Error") && !l.contains("RLIMIT_NOFILE")).map(str::trim).collect();
    let mut lines = errors[errors.len().saturating_sub(6)..].join("\n");
    for (needle, hint) in CRIU_HINTS {
        if lines.contains(needle) {
            lines.push_str(&format!("\n({hint})"));
        }
    }
    match e {
        ContainerError::Runtime { command, status, stderr } if !lines.is_empty() => {
            ContainerError::Runtime { command, status, stderr: format!("{stderr}\nCRIU's log:\n{lines}") }
        }
        e => e,
    }
}

/// A failed GPU step of container `id`, after which `after` says what became of it.
fn gpu_failed(id: &str, step: &str, e: GpuDumpError, after: String) -> ContainerError {
    ContainerError::Runtime { command: format!("{step} of container {id}"), status: after, stderr: e.to_string() }
}

/// What became of the container after a failed step, once its GPU processes were resumed.
fn resumed(cuda: &CudaDriver, pids: &[u32]) -> String {
    match resume_all(cuda, pids, &[]) {
        Ok(_) => "the container runs on, its GPU state resumed".into(),
        Err(e) => format!("resuming its GPU state failed too ({e}); its processes may be lost"),
    }
}

/// What a runc checkpoint reports.
#[derive(Serialize)]
pub struct RuncCheckpointReport {
    /// The container's id.
    pub container: String,
    /// Its init process (host pid).
    pub pid: u32,
    /// Its bundle.
    pub bundle: PathBuf,
    /// The processes whose GPU state was checkpointed (host pids; empty: a CPU container).
    pub gpu_pids: Vec<u32>,
    /// Whether it runs on.
    pub left_running: bool,
    /// Phase timings (`criu_dump_s`: `runc checkpoint`).
    pub timings: CaptureTimings,
    /// Seconds from the GPU lock (or the dump) until the container ran again (left running).
    pub paused_s: Option<f64>,
    /// The push of the image into the store (its page images while runc wrote them).
    pub push: PushReport,
    /// Seconds in all.
    pub total_s: f64,
}

/// Checkpoints the running container `id` through runc into the store as `tag`: its GPU
/// processes locked and checkpointed through the driver (all before any is moved), `runc
/// checkpoint` into a staging directory whose page images are pushed as they are written,
/// their GPU state resumed (with `leave_running`) as soon as the dump ends, the rest of the
/// staged image pushed once runc returns. Without `leave_running` runc stops the container; if the push
/// fails, it is restored from the staged image and runs again (the error says so). A store
/// that refuses the tag (a server token that may not write it) fails the call before the
/// container is touched.
pub fn checkpoint(
    store: &IndexedStore,
    runc: &Runc,
    id: &str,
    tag: &TagRef,
    leave_running: bool,
    lock_timeout_ms: u32,
    progress: &dyn Progress,
) -> Result<RuncCheckpointReport> {
    let started = Instant::now();
    tag.check_new()?;
    store.backend().check_tag_write(&tag.name)?;
    let st = runc.state(id)?;
    if st.status != "running" {
        return Err(ContainerError::Runtime {
            command: format!("runc checkpoint {id}"),
            status: format!("not started: the container is {}", st.status),
            stderr: "only a running container can be checkpointed".into(),
        });
    }
    let mut meta = ImageMeta::default();
    let mut timings = CaptureTimings::default();
    let (cuda, gpu_pids) = gpu_state(runc, id, &st, &mut meta)?;
    let gpu = cuda.as_ref().filter(|_| !gpu_pids.is_empty());
    // Before the freeze: removing what a killed gstore left may take a while.
    follow::remove_stale_staging();

    let frozen = Instant::now();
    if let Some(cuda) = gpu {
        let t = Instant::now();
        for &p in &gpu_pids {
            cuda.lock(p, lock_timeout_ms).map_err(|e| gpu_failed(id, "the GPU lock", e, resumed(cuda, &gpu_pids)))?;
        }
        timings.lock_s = Some(t.elapsed().as_secs_f64());
        let t = Instant::now();
        on_each(&gpu_pids, |p| cuda.checkpoint(p))
            .map_err(|e| gpu_failed(id, "the GPU checkpoint", e, resumed(cuda, &gpu_pids)))?;
        timings.gpu_checkpoint_s = Some(t.elapsed().as_secs_f64());
    }
    // Staged where the dump is fastest, sized by what it holds now that its GPU memory is in
    // host memory.
    let resident = |pids: Vec<u32>| pids.into_iter().filter_map(procfs::resident_bytes).sum();
    let staged = runc.pids(id).map(resident).and_then(|bytes| stage(&st, bytes));
    let (staging, image, images) = match staged {
        Ok(s) => s,
        Err(e) => {
            let after = gpu.map_or_else(|| "the container runs on".to_string(), |cuda| resumed(cuda, &gpu_pids));
            return Err(ContainerError::Runtime {
                command: format!("gstore checkpoint --container {id}"),
                status: format!("not started ({after})"),
                stderr: format!("staging the checkpoint failed: {e}"),
            });
        }
    };
    // The dump, and with `leave_running` the GPU state's return: the pause ends here, while
    // the push may go on.
    let work = staging.path().join("work");
    let dump = || -> Result<Dumped> {
        let mut timings = timings.clone();
        let t = Instant::now();
        runc.checkpoint(id, &images, &work, leave_running).map_err(|e| dump_failed(runc, id, gpu, &gpu_pids, e))?;
        timings.criu_dump_s = t.elapsed().as_secs_f64();
        if let (true, Some(cuda)) = (leave_running, gpu) {
            let t = Instant::now();
            resume_all(cuda, &gpu_pids, &[]).map_err(|e| {
                gpu_failed(id, "the GPU resume after the dump", e, "its GPU processes may be lost".into())
            })?;
            timings.gpu_resume_s = Some(t.elapsed().as_secs_f64());
        }
        Ok(Dumped { timings, paused_s: leave_running.then(|| frozen.elapsed().as_secs_f64()) })
    };
    let (dumped, pushed) = follow::push_while_written(store, &image, IMAGES, tag, progress, dump, |d| {
        describe(&mut meta, runc, id, &st, leave_running, &d.timings);
        meta
    })?;
    match pushed {
        Ok(push) => {
            // Where the image's lazy memory is stored, recorded for a restore on this machine.
            gstore_lazy::prepare::locate_ahead(store, &push.manifest);
            Ok(RuncCheckpointReport {
                container: id.into(),
                pid: st.pid,
                bundle: st.bundle,
                gpu_pids,
                left_running: leave_running,
                timings: dumped.timings,
                paused_s: dumped.paused_s,
                push,
                total_s: started.elapsed().as_secs_f64(),
            })
        }
        Err(source) => {
            let after = if leave_running {
                " (the container kept running)".to_string()
            } else {
                restore_staged(runc, id, &st, gpu, staging)
            };
            Err(ContainerError::PushFailed {
                container: id.into(),
                after,
                source: Box::new(ContainerError::Store(source)),
            })
        }
    }
}

/// A staging directory for a checkpoint of about `bytes` ([`follow::staging_root`]), with
/// the image directory in it (the bundle's configuration copied in) and CRIU's images
/// directory below that.
fn stage(st: &State, bytes: u64) -> Result<(tempfile::TempDir, PathBuf, PathBuf)> {
    let root = follow::staging_root(bytes);
    let staging = tempfile::Builder::new()
        .prefix(&follow::staging_prefix())
        .tempdir_in(&root)
        .map_err(|e| ContainerError::io("creating", &root, e))?;
    let image = staging.path().join("image");
    let images = image.join(IMAGES);
    std::fs::create_dir_all(&images).map_err(|e| ContainerError::io("creating", &images, e))?;
    let config = st.bundle.join(CONFIG);
    std::fs::copy(&config, image.join(CONFIG)).map_err(|e| ContainerError::io("copying", &config, e))?;
    Ok((staging, image, images))
}

/// What the dump did: its phases' times, and with `leave_running` the pause.
struct Dumped {
    timings: CaptureTimings,
    paused_s: Option<f64>,
}

/// The CUDA driver and the container's GPU processes (its processes that use CUDA and have a
/// context), and their metadata in `meta`; none when no process uses CUDA. The driver is
/// asked before any lock: cuInit can take seconds and must not extend the freeze.
fn gpu_state(runc: &Runc, id: &str, st: &State, meta: &mut ImageMeta) -> Result<(Option<CudaDriver>, Vec<u32>)> {
    let users: Vec<u32> = runc.pids(id)?.into_iter().filter(|&p| cuda::process_uses_cuda(p)).collect();
    let Some(&first) = users.first() else { return Ok((None, Vec::new())) };
    let cuda = CudaDriver::load().map_err(|e| {
        let after = format!("not started: process {first} uses CUDA (the container runs on)");
        gpu_failed(id, "the GPU checkpoint", e, after)
    })?;
    let not_started = |e| gpu_failed(id, "the GPU query", e, "not started (the container runs on)".into());
    let (major, minor) = cuda.driver_version().map_err(not_started)?;
    let gpus = cuda.devices().map_err(not_started)?;
    let gpu_pids = gpu_processes(&cuda, st.pid, &users);
    if !gpu_pids.is_empty() {
        meta.cuda_driver_version = Some(format!("{major}.{minor}"));
        meta.gpus = Some(gpus);
        meta.gpu_pids = Some(gpu_pids.clone());
    }
    Ok((Some(cuda), gpu_pids))
}

/// The error of a failed `runc checkpoint`, saying whether the container runs on (with its
/// GPU processes resumed) or is gone.
fn dump_failed(runc: &Runc, id: &str, gpu: Option<&CudaDriver>, gpu_pids: &[u32], e: ContainerError) -> ContainerError {
    let running = runc.state(id).is_ok_and(|s| s.status == "running");
    let after = match (running, gpu) {
        (true, Some(cuda)) => format!(" ({})", resumed(cuda, gpu_pids)),
        (true, None) => " (the container runs on)".into(),
        (false, _) => " (the container is no longer running)".into(),
    };
    match e {
        ContainerError::Runtime { command, status, stderr } => {
            ContainerError::Runtime { command, status: format!("{status}{after}"), stderr }
        }
        e => e,
    }
}

/// The metadata of a runc checkpoint image of container `id`.
fn describe(meta: &mut ImageMeta, runc: &Runc, id: &str, st: &State, leave_running: bool, timings: &CaptureTimings) {
    meta.kind = Some(Kind::ContainerCheckpoint);
    meta.runtime = Some(Runtime { engine: "runc".into(), version: runc.version() });
    meta.container =
        Some(ContainerMeta { name: id.into(), id: id.into(), runtime: "runc".into(), ..Default::default() });
    meta.runc = Some(RuncMeta { bundle: st.bundle.clone(), rootfs: st.rootfs.clone() });
    meta.criu_version = Some(runc.criu().version());
    meta.kernel = Some(kernel());
    meta.leave_running = Some(leave_running);
    meta.capture_timings = Some(timings.clone());
}

/// After a failed push of a dump that ended container `id`: restores it from the image staged
/// in `staging` (and its GPU processes), and says how that went; the staged image is kept
/// when the restore fails too.
fn restore_staged(runc: &Runc, id: &str, st: &State, gpu: Option<&CudaDriver>, staging: tempfile::TempDir) -> String {
    let images = staging.path().join("image").join(IMAGES);
    let work = staging.path().join("work-restore");
    let back = runc.restore(id, (&images, &work, &st.bundle), false, &|_| Ok(())).and_then(|()| match gpu {
        Some(cuda) => resume_restored(runc, cuda, id, &[]).map(drop),
        None => Ok(()),
    });
    match back {
        Ok(()) => "; the container was restored from the staged image and runs again".into(),
        Err(e) => {
            let kept = follow::kept(staging.keep());
            format!(
                "; restoring the container from the staged image failed too ({e}); the image is kept at {}",
                kept.join("image").display()
            )
        }
    }
}

/// Restores and unlocks the GPU state of the restored container `id`'s processes (those the
/// driver holds checkpointed or locked) onto `pairs`; their pids and the longest restore and
/// unlock.
fn resume_restored(
    runc: &Runc,
    cuda: &CudaDriver,
    id: &str,
    pairs: &[GpuPair],
) -> Result<(Vec<u32>, Option<f64>, Option<f64>)> {
    let pids: Vec<u32> = runc
        .pids(id)?
        .into_iter()
        .filter(|&p| matches!(cuda.state(p), Ok(ProcessState::Checkpointed | ProcessState::Locked)))
        .collect();
    let (restore_s, unlock_s) = resume_all(cuda, &pids, pairs).map_err(|e| {
        gpu_failed(
            id,
            "the GPU restore",
            e,
            format!("the container was restored but not its GPU state: `runc kill {id} KILL` ends it"),
        )
    })?;
    Ok((pids, restore_s, unlock_s))
}

/// Whether image `m` was checkpointed through runc.
pub fn is_runc_image(m: &Manifest) -> bool {
    m.meta.runtime.as_ref().is_some_and(|r| r.engine == "runc")
}

/// A runc image checked for its restore here.
pub struct Checked {
    /// The container id it is restored under.
    pub id: String,
    /// Its bundle.
    pub bundle: PathBuf,
    /// For a GPU image: the driver, and where its GPUs go.
    pub gpu: Option<(CudaDriver, Vec<GpuPair>)>,
}

/// Checks that image `m` (named `image`) is a runc container checkpoint this machine can
/// restore as `name` (else its checkpointed id): its bundle and root filesystem present, the id
/// free, and for a GPU image a driver and GPUs that can take it.
pub fn check(runc: &Runc, image: &str, m: &Manifest, name: Option<&str>) -> Result<Checked> {
    let incompatible = |why: String| ContainerError::Incompatible { image: image.to_string(), why };
    let kind = m.kind().map_or("files", |k| k.as_str());
    if m.kind() != Some(&Kind::ContainerCheckpoint) || !is_runc_image(m) {
        return Err(ContainerError::NotACheckpoint(format!(
            "{image} is not a container checkpoint made through runc (its kind is {kind}); `gstore restore {image} \
             --to DIR` writes its files"
        )));
    }
    let c = m.meta.container.clone().unwrap_or_default();
    let r = m.meta.runc.as_ref().ok_or_else(|| incompatible("its metadata names no bundle".into()))?;
    if !r.bundle.is_dir() {
        return Err(incompatible(format!(
            "its bundle {} is not here: runc restores the container from the bundle (and root filesystem) it ran \
             from",
            r.bundle.display()
        )));
    }
    if !r.rootfs.is_dir() {
        return Err(incompatible(format!("its root filesystem {} is not here", r.rootfs.display())));
    }
    let id = name.unwrap_or(&c.id).to_string();
    if id.is_empty() {
        return Err(incompatible("its metadata names no container id: restore it with --name ID".into()));
    }
    if runc.state(&id).is_ok() {
        return Err(ContainerError::NameTaken {
            image: image.to_string(),
            taken: format!("runc has a container {id}: restore under another id with --name, or `runc delete -f {id}`"),
        });
    }
    let gpu = if m.meta.gpu_pids.is_some() || m.meta.other.contains_key("gpu_pids") {
        let as_process = ImageMeta { kind: Some(Kind::GpuProcess), ..m.meta.clone() };
        let wants = ImageNeeds::from_metadata(&as_process).map_err(|e| incompatible(e.to_string()))?;
        let cuda = CudaDriver::load();
        let machine = MachineInfo::probe(Some(runc.criu()), &cuda);
        let pairs = check_compatible(&wants, &machine, &GpuMap::default()).map_err(|e| incompatible(e.to_string()))?;
        Some((cuda.map_err(|e| incompatible(e.to_string()))?, pairs))
    } else {
        None
    };
    Ok(Checked { id, bundle: r.bundle.clone(), gpu })
}

/// What a runc restore reports.
#[derive(Serialize)]
pub struct RuncRestoreReport {
    /// The image restored.
    pub image: String,
    /// The restored container's id.
    pub container: String,
    /// Its init process (host pid).
    pub pid: u32,
    /// How memory came back: lazy (served from the store while the container runs) or eager
    /// (CRIU's images written out whole first).
    pub mode: Mode,
    /// Why the eager path was taken although it was not asked for.
    pub eager_reason: Option<String>,
    /// The processes whose GPU state was restored (host pids).
    pub gpu_pids: Vec<u32>,
    /// Bytes of image written out for CRIU (lazy: only what CRIU reads itself).
    pub image_bytes: u64,
    /// Seconds writing the image from the store.
    pub write_s: f64,
    /// Seconds of `runc restore`.
    pub runtime_s: f64,
    /// Seconds of the GPU restore (the longest of its processes).
    pub gpu_restore_s: Option<f64>,
    /// Seconds of the GPU unlock.
    pub gpu_unlock_s: Option<f64>,
    /// The lazy fill (lazy mode only).
    pub fill: Option<gstore_lazy::FillReport>,
    /// What became of the restore profile (lazy mode only): followed, recorded, or why not.
    pub profile: Option<String>,
    /// Seconds in all.
    pub total_s: f64,
}

/// What the runtime part of a runc restore did: runc's seconds and the GPU restore.
struct Resumed {
    runtime_s: f64,
    gpu_pids: Vec<u32>,
    gpu_restore_s: Option<f64>,
    gpu_unlock_s: Option<f64>,
}

/// How a runc container comes back.
#[derive(Clone, Copy, Default)]
pub struct RestoreAs<'a> {
    /// Its id (else the one it was checkpointed under).
    pub name: Option<&'a str>,
    /// Write CRIU's images out whole before runc runs (no lazy pages).
    pub eager: bool,
}

/// Restores the runc container checkpoint `m` (image `image`, manifest `mid`) as `how.name`
/// (else its checkpointed id), after [`check`]: its images written to a temporary directory (in
/// `$TMPDIR`, removed after), `runc restore --detach` from the bundle it ran from (whose
/// `config.json` is written from the image where it is missing), then the GPU state of its
/// processes restored and unlocked. Unless `how.eager` (or this machine's userfaultfd cannot),
/// the memory CRIU would read from the page images is served from the store while the
/// container runs (gstore is CRIU's lazy-pages daemon): only the rest is written out, and the
/// restore returns once every page is in place.
pub fn restore(
    store: &IndexedStore,
    runc: &Runc,
    image: &str,
    mid: &ObjectId,
    m: &Manifest,
    how: RestoreAs<'_>,
    progress: &dyn Progress,
) -> Result<RuncRestoreReport> {
    let started = Instant::now();
    let c = check(runc, image, m, how.name)?;
    if let Some((cuda, _)) = &c.gpu {
        // cuInit takes seconds on big machines: before the restore, not after it.
        cuda.init().map_err(|e| gpu_failed(&c.id, "the GPU restore", e, "not started".into()))?;
    }
    let tmp = tempfile::Builder::new()
        .prefix("gstore-runc-restore-")
        .tempdir()
        .map_err(|e| ContainerError::io("creating", std::env::temp_dir(), e))?;
    let (dest, work) = (tmp.path().join("image"), tmp.path().join("work"));
    std::fs::create_dir_all(&work).map_err(|e| ContainerError::io("creating", &work, e))?;
    let images = dest.join(IMAGES);
    let (image_bytes, prepared, eager_reason) = write_image(store, mid, m, &dest, how.eager, &c.id, progress)?;
    let config = c.bundle.join(CONFIG);
    if !config.exists() {
        std::fs::copy(dest.join(CONFIG), &config).map_err(|e| ContainerError::io("writing", &config, e))?;
    }
    let write_s = started.elapsed().as_secs_f64();
    // runc, then the GPU state of the container's processes (while the fill goes on).
    let resume = |started: &dyn Fn(u32) -> Result<()>| -> Result<Resumed> {
        let t = Instant::now();
        runc.restore(&c.id, (&images, &work, &c.bundle), prepared.is_some(), started)?;
        let runtime_s = t.elapsed().as_secs_f64();
        let (gpu_pids, gpu_restore_s, gpu_unlock_s) = match &c.gpu {
            Some((cuda, pairs)) => resume_restored(runc, cuda, &c.id, pairs)?,
            None => (Vec::new(), None, None),
        };
        Ok(Resumed { runtime_s, gpu_pids, gpu_restore_s, gpu_unlock_s })
    };
    let (resumed, fill, profile) = match &prepared {
        // A container's tasks come back under pids of its own namespace: the guard learns
        // their host pids as they announce themselves, and runc's group (its CRIU waits for
        // ever if the tasks die before it has finished) from here.
        Some(p) => match gstore_lazy::during::serve_during(store, mid, &work, p, &[], |guard| {
            resume(&|pid| {
                guard
                    .add_runtime_group(pid as i32)
                    .map_err(|source| ContainerError::Fill { container: c.id.clone(), source })
            })
        }) {
            Ok((r, fill, note)) => (r, Some(fill), Some(note)),
            Err(gstore_lazy::during::Failed::Restore(e)) => return Err(e),
            Err(gstore_lazy::during::Failed::Fill(source)) => {
                let _ = runc.run(&["delete", "--force", &c.id]);
                return Err(ContainerError::Fill { container: c.id, source });
            }
        },
        None => (resume(&|_| Ok(()))?, None, None),
    };
    let pid = runc.state(&c.id).map(|s| s.pid).unwrap_or_default();
    Ok(RuncRestoreReport {
        image: image.to_string(),
        container: c.id,
        pid,
        mode: if prepared.is_some() { Mode::Lazy } else { Mode::Eager },
        eager_reason,
        gpu_pids: resumed.gpu_pids,
        image_bytes,
        write_s,
        runtime_s: resumed.runtime_s,
        gpu_restore_s: resumed.gpu_restore_s,
        gpu_unlock_s: resumed.gpu_unlock_s,
        fill,
        profile,
        total_s: started.elapsed().as_secs_f64(),
    })
}

/// Writes image `mid` (manifest `m`) out to `dest` for runc: with lazy memory (everything but
/// the pages CRIU's lazy-pages daemon serves, which `prepared` then fills) unless `eager` or
/// this machine cannot (the reason why is returned). Returns the bytes the image holds.
fn write_image(
    store: &IndexedStore,
    mid: &ObjectId,
    m: &Manifest,
    dest: &Path,
    eager: bool,
    container: &str,
    progress: &dyn Progress,
) -> Result<(u64, Option<gstore_lazy::Prepared>, Option<String>)> {
    let images = dest.join(IMAGES);
    let mut eager_reason = None;
    let lazy = gstore_lazy::mode::lazy_here(eager).map_err(|why| eager_reason = why).is_ok();
    let prepared = if lazy {
        // Everything but CRIU's images in full; of those, what CRIU reads itself.
        let rest = m.subset(|e| e.path != IMAGES && !e.path.starts_with(&format!("{IMAGES}/")));
        let written =
            gstore_restore::restore_to_dir(store, mid, &rest, dest, gstore_restore::Budget::DEFAULT, progress)?;
        let p = gstore_lazy::prepare(store, mid, &m.within(IMAGES), &images, gstore_restore::Budget::DEFAULT, progress);
        match gstore_lazy::mode::lazy_or_eager(p, &mut eager_reason) {
            Ok(Some(p)) => Some((written.logical_bytes + p.written_bytes, p)),
            Ok(None) => {
                std::fs::remove_dir_all(dest).map_err(|e| ContainerError::io("removing", dest, e))?;
                None
            }
            Err(source) => return Err(ContainerError::Fill { container: container.to_string(), source }),
        }
    } else {
        None
    };
    Ok(match prepared {
        Some((bytes, p)) => (bytes, Some(p), None),
        None => {
            let written =
                gstore_restore::restore_to_dir(store, mid, m, dest, gstore_restore::Budget::DEFAULT, progress)?;
            (written.logical_bytes, None, eager_reason)
        }
    })
}
