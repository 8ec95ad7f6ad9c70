//! The GPU side of checkpoint and restore, on a machine without a GPU: a fake libcuda
//! (tests/fake_libcuda.c, built here with the system C compiler) runs the driver's checkpoint
//! state machine and is preloaded into a real process, which the real CRIU then dumps and
//! restores. This checks the call order, the argument structs crossing the C ABI, and that
//! every failure after the lock leaves the process resumed (or says it may be lost).

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use common::{criu, Counter};
use gstore_gpu_dump::checkpoint::{self, CheckpointOptions, ImageKind, RestoreOptions};
use gstore_gpu_dump::compat::{check_compatible, ImageNeeds, MachineInfo};
use gstore_gpu_dump::cuda::{process_uses_cuda, CudaDriver, GpuInfo, ProcessState};
use gstore_gpu_dump::{procfs, Criu, GpuDumpError, GpuMap, Phase};

struct FakeCuda {
    /// The fake driver, named libcuda.so.1 so that a process preloading it looks like a CUDA user.
    lib: PathBuf,
    /// The same without the checkpoint API (a driver older than 570).
    old_lib: PathBuf,
    /// Two GPUs, CUDA 13.0: GPU pairs cross the ABI.
    two_lib: PathBuf,
    /// Two GPUs, CUDA 12.8: restore args are all reserved.
    two_128_lib: PathBuf,
    /// Per-pid state, call and failure files.
    state: PathBuf,
}

/// Builds the fake drivers once per source version, shared by test processes running at the
/// same time (nextest runs each test in its own process): each builds into a private folder and
/// renames it into place; a loser of that race uses the winner's build. Files are never
/// rewritten in place, as running (and dumped) test processes map them.
fn fake() -> &'static FakeCuda {
    static FAKE: OnceLock<FakeCuda> = OnceLock::new();
    FAKE.get_or_init(|| {
        let (build_dir, state) = common::build_fake_libcuda(
            "fake-cuda",
            &[
                ("new", None),
                ("old", Some("-DNO_CHECKPOINT")),
                ("two", Some("-DFAKE_GPUS=2")),
                ("two-128", Some("-DFAKE_GPUS=2 -DFAKE_VERSION=12080")),
            ],
        );
        let lib = |variant: &str| build_dir.join(variant).join("libcuda.so.1");
        FakeCuda { lib: lib("new"), old_lib: lib("old"), two_lib: lib("two"), two_128_lib: lib("two-128"), state }
    })
}

fn driver() -> CudaDriver {
    CudaDriver::load_from(&[fake().lib.to_str().expect("utf-8 path")]).expect("load the fake driver")
}

/// The checkpoint calls the fake driver saw for `pid`, in order.
fn calls(pid: u32) -> Vec<String> {
    std::fs::read_to_string(fake().state.join(format!("{pid}.calls")))
        .map(|text| text.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Makes the fake driver fail these calls for `pid`.
fn fail(pid: u32, calls: &[&str]) {
    std::fs::write(fake().state.join(format!("{pid}.fail")), calls.join("\n")).expect("write fail file");
}

/// A counter that looks like a CUDA process to gstore, with fresh fake-driver state (pids of
/// earlier runs may be reused).
fn gpu_counter() -> Counter {
    counter_with(&fake().lib)
}

/// A counter that preloads the fake driver at `lib`, with fresh fake-driver state.
fn counter_with(lib: &std::path::Path) -> Counter {
    let counter = Counter::start_with_preload(lib);
    for ext in ["state", "calls", "fail"] {
        let _ = std::fs::remove_file(fake().state.join(format!("{}.{ext}", counter.pid)));
    }
    assert!(process_uses_cuda(counter.pid), "the preloaded fake libcuda shows in /proc/PID/maps");
    counter
}

#[test]
fn device_queries_and_metadata_go_through_the_c_abi() {
    let loaded = CudaDriver::load_from(&[fake().lib.to_str().expect("utf-8 path")]);
    let cuda = loaded.as_ref().expect("fake driver");
    assert_eq!(cuda.driver_version().expect("version"), (13, 0));
    assert_eq!(cuda.devices().expect("devices"), vec![fake_gpu(0)]);
    assert_eq!(cuda.state(std::process::id()).expect("state"), ProcessState::Running);
    // Only a process holding a context has a restore thread (FAKE_CUDA_CONTEXT=1 in the fake).
    assert!(cuda.restore_thread_id(std::process::id()).is_err());
    let err = cuda.unlock(std::process::id()).expect_err("not locked");
    assert_eq!(
        err.to_string(),
        format!(
            "cuCheckpointProcessUnlock(pid {}): CUDA_ERROR_ILLEGAL_STATE (401): fake driver error; the process is \
             not in the state this step needs; if it was just starting CUDA, retry",
            std::process::id()
        )
    );
    let machine = MachineInfo::probe(Some(&criu()), &loaded);
    assert_eq!(machine.cuda, Ok(((13, 0), vec![fake_gpu(0)])));
}

/// GPU `index` of the fake driver as gstore reads it.
fn fake_gpu(index: u32) -> GpuInfo {
    GpuInfo {
        index,
        name: "Fake GPU".into(),
        total_mem_bytes: 1 << 30,
        uuid: Some(format!("GPU-fa4e0000-0000-0000-0000-0000000000{index:02x}")),
    }
}

#[test]
fn restores_onto_other_gpus_pass_uuid_pairs_through_the_c_abi() {
    let criu = criu();
    let load = |lib: &PathBuf| CudaDriver::load_from(&[lib.to_str().expect("utf-8 path")]);
    let cuda = load(&fake().two_lib).expect("two-GPU fake driver");
    assert_eq!(cuda.devices().expect("devices"), vec![fake_gpu(0), fake_gpu(1)]);
    let machine = MachineInfo::probe(Some(&criu), &Ok(load(&fake().two_lib).expect("driver")));
    let old_machine = MachineInfo::probe(Some(&criu), &Ok(load(&fake().two_128_lib).expect("driver")));
    let uuid1 = fake_gpu(1).uuid.expect("uuid");
    for (map, logged) in [("", "restore"), ("0=1", "restore 0>1"), (&format!("1=0,0={uuid1}")[..], "restore 1>0,0>1")] {
        let counter = counter_with(&fake().two_lib);
        let dir = counter.image_dir("img");
        let opts = CheckpointOptions { cuda: Some(&cuda), ..CheckpointOptions::new(&criu) };
        let report = checkpoint::checkpoint(counter.pid, &dir, &opts).expect("checkpoint");
        let meta = ImageNeeds::from_metadata(&report.metadata()).expect("metadata");
        assert_eq!(meta.gpus, vec![fake_gpu(0), fake_gpu(1)], "UUIDs are recorded");
        let map = if map.is_empty() { GpuMap::default() } else { GpuMap::parse(map).expect("map") };
        let pairs = check_compatible(&meta, &machine, &map).expect("fits");
        if !map.entries.is_empty() {
            // An image captured under CUDA 12.8, restored under 12.8 onto other GPUs.
            let old_image = ImageNeeds { cuda_driver_version: Some((12, 8)), ..meta.clone() };
            let err = check_compatible(&old_image, &old_machine, &map).expect_err("no pairs before CUDA 13.0");
            assert!(err.to_string().contains("needs a driver for CUDA 13.0 or later"), "{err}");
        }
        let at_dump = counter.value();
        let opts = RestoreOptions {
            cuda: Some(&cuda),
            gpu: true,
            gpu_pairs: pairs,
            original_pid: Some(counter.pid),
            ..RestoreOptions::new(&criu)
        };
        checkpoint::restore(&dir, &opts).expect("restore");
        assert_eq!(calls(counter.pid), ["lock 10000", "checkpoint", logged, "unlock"]);
        counter.wait_above(at_dump + 3, Duration::from_secs(5));
    }
}

#[test]
fn a_cuda_12_8_driver_takes_only_all_zero_restore_args() {
    let cuda = CudaDriver::load_from(&[fake().two_128_lib.to_str().expect("utf-8 path")]).expect("driver");
    let pid = std::process::id() + 1_000_000;
    std::fs::write(fake().state.join(format!("{pid}.state")), "2\n").expect("state");
    let pair = gstore_gpu_dump::cuda::ffi::GpuPair::default();
    let err = cuda.restore(pid, &[pair]).expect_err("pairs are reserved bytes before 13.0");
    assert!(err.to_string().contains("CUDA_ERROR_INVALID_VALUE"), "{err}");
    cuda.restore(pid, &[]).expect("all zero");
    let _ = std::fs::remove_file(fake().state.join(format!("{pid}.state")));
    let _ = std::fs::remove_file(fake().state.join(format!("{pid}.calls")));
}

#[test]
fn a_driver_without_the_checkpoint_api_is_too_old() {
    let err = CudaDriver::load_from(&[fake().old_lib.to_str().expect("utf-8 path")]).expect_err("no checkpoint API");
    assert!(matches!(err, GpuDumpError::DriverTooOld { symbol: "cuCheckpointProcessGetState", .. }), "{err:?}");
    assert!(err.to_string().starts_with("driver too old: needs >= 570"), "{err}");
}

#[test]
fn leave_running_checkpoint_locks_checkpoints_dumps_and_resumes() {
    let criu = criu();
    let cuda = driver();
    let counter = gpu_counter();
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions {
        leave_running: true,
        lock_timeout_ms: 1234,
        cuda: Some(&cuda),
        ..CheckpointOptions::new(&criu)
    };
    let report = checkpoint::checkpoint(counter.pid, &dir, &opts).expect("checkpoint");
    assert_eq!(calls(counter.pid), ["lock 1234", "checkpoint", "restore", "unlock"]);
    assert_eq!(cuda.state(counter.pid).expect("state"), ProcessState::Running);
    assert_eq!(report.image_kind, ImageKind::GpuProcess);
    assert_eq!(report.cuda_driver_version.as_deref(), Some("13.0"));
    assert_eq!(report.gpus.len(), 1);
    let t = &report.timings;
    assert!(t.lock_s.is_some() && t.gpu_checkpoint_s.is_some() && t.gpu_resume_s.is_some(), "{t:?}");
    assert!(procfs::is_alive(counter.pid));
    let now = counter.value();
    counter.wait_above(now + 3, Duration::from_secs(5));

    // What the manifest records lets this machine (same fake GPU) restore it.
    let meta = ImageNeeds::from_metadata(&report.metadata()).expect("metadata");
    let machine = MachineInfo::probe(Some(&criu), &Ok(driver()));
    check_compatible(&meta, &machine, &GpuMap::default()).expect("same machine");
    eprintln!("gpu capture: {}", serde_json::to_string(&report).expect("json"));
}

#[test]
fn criu_failure_after_the_gpu_checkpoint_restores_and_unlocks() {
    let criu = criu();
    let cuda = driver();
    let counter = gpu_counter();
    let opts = CheckpointOptions {
        cuda: Some(&cuda),
        extra_criu_args: vec!["--no-such-option".into()],
        ..CheckpointOptions::new(&criu)
    };
    let err = checkpoint::checkpoint(counter.pid, &counter.image_dir("img"), &opts).expect_err("CRIU rejects it");
    assert!(matches!(err, GpuDumpError::Resumed { phase: Phase::CriuDump, .. }), "{err:?}");
    assert!(err.to_string().starts_with("criu dump failed; the process was resumed and is still running"), "{err}");
    assert_eq!(calls(counter.pid), ["lock 10000", "checkpoint", "restore", "unlock"]);
    assert_eq!(cuda.state(counter.pid).expect("state"), ProcessState::Running);
    let now = counter.value();
    counter.wait_above(now + 3, Duration::from_secs(5));
}

#[test]
fn lock_timeout_leaves_everything_as_it_was() {
    let criu = criu();
    let cuda = driver();
    let counter = gpu_counter();
    fail(counter.pid, &["lock"]);
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions { cuda: Some(&cuda), ..CheckpointOptions::new(&criu) };
    let err = checkpoint::checkpoint(counter.pid, &dir, &opts).expect_err("lock times out");
    let msg = err.to_string();
    assert!(matches!(err, GpuDumpError::Resumed { phase: Phase::GpuLock, .. }), "{err:?}");
    assert!(
        msg.contains(&format!("GPU lock failed; the process was resumed and is still running: cuCheckpointProcessLock(pid {}): CUDA_ERROR_NOT_READY (600)", counter.pid)),
        "{msg}"
    );
    assert!(msg.contains("raise the lock timeout"), "{msg}");
    assert!(calls(counter.pid).is_empty());
    assert!(!dir.exists(), "CRIU never ran");
    let now = counter.value();
    counter.wait_above(now + 3, Duration::from_secs(5));
}

#[test]
fn a_failed_rollback_says_the_process_may_be_lost() {
    let criu = criu();
    let cuda = driver();
    let counter = gpu_counter();
    fail(counter.pid, &["restore"]);
    let opts = CheckpointOptions {
        cuda: Some(&cuda),
        extra_criu_args: vec!["--no-such-option".into()],
        ..CheckpointOptions::new(&criu)
    };
    let err =
        checkpoint::checkpoint(counter.pid, &counter.image_dir("img"), &opts).expect_err("dump and rollback fail");
    let msg = err.to_string();
    eprintln!("lost: {msg}");
    assert!(matches!(err, GpuDumpError::Lost { phase: Phase::CriuDump, .. }), "{err:?}");
    assert!(msg.starts_with("criu dump failed and the process could not be resumed, so it may be lost"), "{msg}");
    assert!(msg.contains("GPU state checkpointed") && msg.contains("cuCheckpointProcessRestore"), "{msg}");
    assert_eq!(calls(counter.pid), ["lock 10000", "checkpoint"]);
}

#[test]
fn gpu_image_restores_its_gpu_state_after_criu() {
    let criu = criu();
    let cuda = driver();
    let counter = gpu_counter();
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions { cuda: Some(&cuda), ..CheckpointOptions::new(&criu) };
    let report = checkpoint::checkpoint(counter.pid, &dir, &opts).expect("checkpoint");
    assert!(report.timings.gpu_resume_s.is_none());
    assert_eq!(calls(counter.pid), ["lock 10000", "checkpoint"]);
    assert_eq!(cuda.state(counter.pid).expect("state"), ProcessState::Checkpointed);
    let at_dump = counter.value();

    let opts =
        RestoreOptions { cuda: Some(&cuda), gpu: true, original_pid: Some(counter.pid), ..RestoreOptions::new(&criu) };
    let restored = checkpoint::restore(&dir, &opts).expect("restore");
    assert_eq!(restored.pid, counter.pid);
    assert_eq!(calls(counter.pid), ["lock 10000", "checkpoint", "restore", "unlock"]);
    assert_eq!(cuda.state(counter.pid).expect("state"), ProcessState::Running);
    assert!(restored.timings.gpu_restore_s.is_some() && restored.timings.gpu_unlock_s.is_some());
    assert!(process_uses_cuda(restored.pid), "the restored process maps libcuda again");
    counter.wait_above(at_dump + 3, Duration::from_secs(5));
    eprintln!("gpu restore: {}", serde_json::to_string(&restored).expect("json"));
}

#[test]
fn a_failed_gpu_restore_names_the_restored_pid() {
    let criu = criu();
    let cuda = driver();
    let counter = gpu_counter();
    let dir = counter.image_dir("img");
    let opts = CheckpointOptions { cuda: Some(&cuda), ..CheckpointOptions::new(&criu) };
    checkpoint::checkpoint(counter.pid, &dir, &opts).expect("checkpoint");
    fail(counter.pid, &["restore"]);
    let opts =
        RestoreOptions { cuda: Some(&cuda), gpu: true, original_pid: Some(counter.pid), ..RestoreOptions::new(&criu) };
    let err = checkpoint::restore(&dir, &opts).expect_err("GPU restore fails");
    assert!(matches!(err, GpuDumpError::GpuRestore { pid, .. } if pid == counter.pid), "{err:?}");
    assert!(err.to_string().contains("its GPU state could not be restored"), "{err}");
}

#[test]
fn a_cuda_process_without_a_driver_is_refused_untouched() {
    let criu = criu();
    let counter = gpu_counter();
    let dir = counter.image_dir("img");
    let err = checkpoint::checkpoint(counter.pid, &dir, &CheckpointOptions::new(&criu)).expect_err("no driver");
    assert!(matches!(err, GpuDumpError::GpuProcessWithoutDriver { .. }), "{err:?}");
    assert!(
        err.to_string().contains("uses CUDA (libcuda is mapped into it) but no CUDA driver could be loaded"),
        "{err}"
    );
    assert!(!dir.exists());
    assert!(calls(counter.pid).is_empty());
    let now = counter.value();
    counter.wait_above(now + 3, Duration::from_secs(5));
}

/// A tree of fake GPU processes (the counter and its worker hold contexts, its loader maps
/// libcuda without one), with fresh fake-driver state for each.
fn gpu_tree() -> (Counter, u32, u32) {
    let tree = Counter::start_tree_with_preload(&fake().lib);
    let (worker, loader) = (tree.pid_of("worker"), tree.pid_of("loader"));
    for pid in [tree.pid, worker, loader] {
        for ext in ["state", "calls", "fail"] {
            let _ = std::fs::remove_file(fake().state.join(format!("{pid}.{ext}")));
        }
    }
    (tree, worker, loader)
}

/// How to restore `tree`'s image with the GPU state of `gpu_pids`.
fn tree_restore<'a>(criu: &'a Criu, cuda: &'a CudaDriver, tree: &Counter, gpu_pids: &[u32]) -> RestoreOptions<'a> {
    RestoreOptions {
        cuda: Some(cuda),
        gpu: true,
        gpu_pids: gpu_pids.to_vec(),
        original_pid: Some(tree.pid),
        ..RestoreOptions::new(criu)
    }
}

#[test]
fn every_gpu_process_of_a_tree_is_locked_checkpointed_and_restored() {
    let criu = criu();
    let cuda = driver();
    let (tree, worker, loader) = gpu_tree();
    let dir = tree.image_dir("img");
    let opts = CheckpointOptions { leave_running: true, cuda: Some(&cuda), ..CheckpointOptions::new(&criu) };
    let report = checkpoint::checkpoint(tree.pid, &dir, &opts).expect("checkpoint --leave-running");
    assert_eq!(report.gpu_pids, [tree.pid, worker], "the loader has no context");
    for pid in [tree.pid, worker] {
        assert_eq!(calls(pid), ["lock 10000", "checkpoint", "restore", "unlock"], "pid {pid}");
    }
    assert!(calls(loader).is_empty());
    let seen = tree.wait_above_in("count-worker", 0, Duration::from_secs(5));
    tree.wait_above_in("count-worker", seen + 3, Duration::from_secs(5));

    // A full checkpoint, then a restore of the GPU state of both, as the metadata says.
    let dir = tree.image_dir("img2");
    let opts = CheckpointOptions { cuda: Some(&cuda), ..CheckpointOptions::new(&criu) };
    let report = checkpoint::checkpoint(tree.pid, &dir, &opts).expect("checkpoint");
    let meta = ImageNeeds::from_metadata(&report.metadata()).expect("metadata");
    assert_eq!(meta.gpu_pids, [tree.pid, worker]);
    for pid in [tree.pid, worker] {
        assert_eq!(cuda.state(pid).expect("state"), ProcessState::Checkpointed, "pid {pid}");
    }
    let at_dump = tree.value_in("count-worker");
    let opts = tree_restore(&criu, &cuda, &tree, &meta.gpu_pids);
    let restored = checkpoint::restore(&dir, &opts).expect("restore");
    assert_eq!(restored.pid, tree.pid);
    for pid in [tree.pid, worker] {
        let want = ["lock 10000", "checkpoint", "restore", "unlock", "lock 10000", "checkpoint", "restore", "unlock"];
        assert_eq!(calls(pid), want, "pid {pid}");
        assert_eq!(cuda.state(pid).expect("state"), ProcessState::Running, "pid {pid}");
    }
    assert!(calls(loader).is_empty());
    assert!(procfs::is_alive(worker) && procfs::is_alive(loader), "the restored tree has all three");
    tree.wait_above_in("count-worker", at_dump + 3, Duration::from_secs(5));
}

#[test]
fn a_worker_failing_its_gpu_checkpoint_resumes_the_whole_tree() {
    let criu = criu();
    let cuda = driver();
    let (tree, worker, _) = gpu_tree();
    fail(worker, &["checkpoint"]);
    let dir = tree.image_dir("img");
    let opts = CheckpointOptions { cuda: Some(&cuda), ..CheckpointOptions::new(&criu) };
    let err = checkpoint::checkpoint(tree.pid, &dir, &opts).expect_err("the worker's checkpoint fails");
    assert!(matches!(err, GpuDumpError::Resumed { phase: Phase::GpuCheckpoint, .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("cuCheckpointProcessCheckpoint(pid {worker})")), "{err}");
    assert_eq!(calls(tree.pid), ["lock 10000", "checkpoint", "restore", "unlock"]);
    assert_eq!(calls(worker), ["lock 10000", "unlock"]);
    for pid in [tree.pid, worker] {
        assert_eq!(cuda.state(pid).expect("state"), ProcessState::Running, "pid {pid}");
    }
    assert!(!dir.exists(), "CRIU never ran");
    let seen = tree.wait_above_in("count-worker", 0, Duration::from_secs(5));
    tree.wait_above_in("count-worker", seen + 3, Duration::from_secs(5));
}

#[test]
fn a_tree_whose_worker_fails_its_gpu_restore_names_the_worker() {
    let criu = criu();
    let cuda = driver();
    let (tree, worker, _) = gpu_tree();
    let dir = tree.image_dir("img");
    let opts = CheckpointOptions { cuda: Some(&cuda), ..CheckpointOptions::new(&criu) };
    let report = checkpoint::checkpoint(tree.pid, &dir, &opts).expect("checkpoint");
    fail(worker, &["restore"]);
    let opts = tree_restore(&criu, &cuda, &tree, &report.gpu_pids);
    let err = checkpoint::restore(&dir, &opts).expect_err("the worker's GPU restore fails");
    assert!(matches!(err, GpuDumpError::GpuRestore { pid, .. } if pid == worker), "{err:?}");
    assert_eq!(cuda.state(tree.pid).expect("state"), ProcessState::Running, "the root came back");
}

#[test]
fn a_forked_copy_that_has_not_exec_d_holds_no_context() {
    // A process marked as holding a context forks a child that never execs (as a shell does
    // for a moment before every command): the real driver gives such a child no context, and
    // so must the fake, or a checkpoint that catches the moment counts it as a GPU process.
    let ready = tempfile::NamedTempFile::new().expect("temp file");
    let mut parent = std::process::Command::new("python3")
        .env("LD_PRELOAD", &fake().lib)
        .env("FAKE_CUDA_CONTEXT", "1")
        .arg("-c")
        .arg("import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\nopen(sys.argv[1], 'w').write(str(pid))\ntime.sleep(60)")
        .arg(ready.path())
        .spawn()
        .expect("python3 runs");
    let child: u32 =
        common::wait_for(Duration::from_secs(5), || std::fs::read_to_string(ready.path()).ok()?.trim().parse().ok())
            .expect("the child's pid");
    let cuda = driver();
    let parent_pid = parent.id();
    let answers = (cuda.restore_thread_id(parent_pid).is_ok(), cuda.restore_thread_id(child).is_ok());
    let _ = std::process::Command::new("kill").arg("-9").arg(child.to_string()).status();
    let _ = parent.kill();
    let _ = parent.wait();
    assert_eq!(answers, (true, false), "the parent holds a context, its forked copy does not");
}
