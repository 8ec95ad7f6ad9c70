//! Helpers shared by the integration tests: the real CRIU and a counting test process.
#![allow(dead_code)] // each test binary uses a different subset

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gstore_gpu_dump::Criu;

/// Where scripts/criu.sh installs CRIU.
pub const CRIU: &str = "/opt/criu/sbin/criu";

/// The real CRIU; fails the test (rather than skipping it) when it is not installed.
pub fn criu() -> Criu {
    assert!(Path::new(CRIU).exists(), "CRIU 4.x is not installed at {CRIU}: run scripts/criu.sh (as root) first");
    Criu::find(Some(Path::new(CRIU))).expect("a usable CRIU at /opt/criu/sbin/criu")
}

/// A detached shell that counts up every ~50 ms into a file (replaced by rename, so no file
/// it keeps open grows) and echoes each value to its stdout (/dev/null unless `start_appending`).
/// Killed, with its process group, when dropped.
pub struct Counter {
    pub pid: u32,
    file: PathBuf,
    dir: tempfile::TempDir,
}

impl Counter {
    pub fn start() -> Counter {
        Self::spawn(None, None, false)
    }

    /// A counter with `lib` preloaded (LD_PRELOAD) into it.
    pub fn start_with_preload(lib: &Path) -> Counter {
        Self::spawn(None, Some(lib), false)
    }

    /// A process tree for the fake driver (tests/fake_libcuda.c), all with `lib` preloaded: the
    /// counter and a worker it started (counting into `count-worker`, pid in `pid-worker`)
    /// hold fake CUDA contexts; a loader it started (pid in `pid-loader`) maps libcuda without
    /// a context, like a data loader forked from a CUDA process. The commands they run
    /// (sleep, mv) have no context either.
    pub fn start_tree_with_preload(lib: &Path) -> Counter {
        Self::spawn(None, Some(lib), true)
    }

    /// A counter whose stdout goes to `out.log` in its directory: a file it keeps open that
    /// grows all the time. Opened with `>` (not `>>`): CRIU 4.1.1 skips its size check for
    /// O_APPEND files.
    pub fn start_appending() -> Counter {
        Self::spawn(Some("out.log"), None, false)
    }

    fn spawn(stdout: Option<&str>, preload: Option<&Path>, tree: bool) -> Counter {
        let dir = tempfile::tempdir().expect("tempdir");
        let stdout = stdout.map_or_else(|| "/dev/null".to_string(), |name| dir.path().join(name).display().to_string());
        let file = dir.path().join("count");
        let pidfile = dir.path().join("pid");
        // Commands run with FAKE_CUDA_CONTEXT=0: they never hold a (fake) CUDA context.
        // The count is written over the file in place (`1<>`: no truncation), always 21 bytes:
        // a dump that catches the shell with the file open finds it at restore as it was, and
        // a reader never sees it empty. (A temporary file renamed over it was gone by the
        // restore of a --leave-running dump that caught it open: CRIU refused to restore.)
        let count = |pidfile: &Path, file: &Path, echo: &str| {
            format!(
                "echo $$ > {pidfile}; i=0; while :; do i=$((i+1)); {echo}printf \"%020d\\n\" $i 1<> {file}; FAKE_CUDA_CONTEXT=0 sleep 0.05; done",
                pidfile = pidfile.display(),
                file = file.display(),
            )
        };
        let mut script = count(&pidfile, &file, "echo $i; ");
        if tree {
            let worker = count(&dir.path().join("pid-worker"), &dir.path().join("count-worker"), "");
            let loader = format!("echo $$ > {}; while :; do sleep 0.05; done", dir.path().join("pid-loader").display());
            script = format!("sh -c '{worker}' & FAKE_CUDA_CONTEXT=0 sh -c '{loader}' & {script}");
        }
        // The outer shell exits at once, so the counter is re-parented to PID 1 like a daemon.
        let mut sh = Command::new("sh");
        if let Some(lib) = preload {
            sh.env("LD_PRELOAD", lib);
        }
        if tree {
            sh.env("FAKE_CUDA_CONTEXT", "1");
        }
        let status = sh
            .arg("-c")
            .arg(r#"setsid sh -c "$0" </dev/null >"$1" 2>&1 &"#)
            .arg(&script)
            .arg(&stdout)
            .status()
            .expect("run sh");
        assert!(status.success());
        let pid = wait_for(Duration::from_secs(5), || {
            std::fs::read_to_string(&pidfile).ok().and_then(|text| text.trim().parse::<u32>().ok())
        })
        .expect("the counter wrote its pid");
        let counter = Counter { pid, file, dir };
        counter.wait_above(2, Duration::from_secs(5));
        if tree {
            counter.wait_above_in("count-worker", 2, Duration::from_secs(5));
            counter.pid_of("loader");
        }
        counter
    }

    /// The pid a process of the tree wrote into `pid-<name>`, waited for.
    pub fn pid_of(&self, name: &str) -> u32 {
        let file = self.dir.path().join(format!("pid-{name}"));
        wait_for(Duration::from_secs(5), || std::fs::read_to_string(&file).ok()?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no pid in {}", file.display()))
    }

    /// The count in `file` (in the counter's directory).
    pub fn value_in(&self, file: &str) -> u64 {
        let path = self.dir.path().join(file);
        std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count in {file}"))
    }

    /// Waits until the count in `file` (in the counter's directory) exceeds `floor`.
    pub fn wait_above_in(&self, file: &str, floor: u64, timeout: Duration) -> u64 {
        let path = self.dir.path().join(file);
        wait_for(timeout, || std::fs::read_to_string(&path).ok()?.trim().parse().ok().filter(|v: &u64| *v > floor))
            .unwrap_or_else(|| panic!("{file} stuck (waited for > {floor})"))
    }

    pub fn image_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The current count (the file exists once the counter has counted once).
    pub fn value(&self) -> u64 {
        self.try_value().unwrap_or_else(|| panic!("no count in {}", self.file.display()))
    }

    pub fn try_value(&self) -> Option<u64> {
        std::fs::read_to_string(&self.file).ok()?.trim().parse().ok()
    }

    /// Waits until the counter exceeds `floor`; returns the value seen.
    pub fn wait_above(&self, floor: u64, timeout: Duration) -> u64 {
        wait_for(timeout, || self.try_value().filter(|v| *v > floor))
            .unwrap_or_else(|| panic!("counter stuck at {:?} (waited for > {floor})", self.try_value()))
    }

    pub fn kill(&self) {
        // Only a process that is still our counter: after a dump its pid may be free (or, in
        // theory, reused by someone else).
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&*self.file.to_string_lossy()) {
            // SAFETY: plain kill(2); the counter leads its own session and process group.
            unsafe {
                libc::kill(-(self.pid as i32), libc::SIGKILL);
                libc::kill(self.pid as i32, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_comm = stat.rsplit_once(')').expect("comm").1;
    after_comm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("ppid")
}

/// Builds tests/fake_libcuda.c once per source version into `CARGO_TARGET_TMPDIR/<dir>`, one
/// `<variant>/libcuda.so.1` per (variant, extra cc flags, split at spaces), and returns (build dir, state dir).
/// Test processes running at the same time (nextest runs each test in its own process) share
/// it: each builds into a private folder and renames it into place; a loser of that race uses
/// the winner's build. Files are never rewritten in place, as running (and dumped) test
/// processes map them.
pub fn build_fake_libcuda(dir: &str, variants: &[(&str, Option<&str>)]) -> (PathBuf, PathBuf) {
    let source_path = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (set by cargo test and nextest)"),
    )
    .join("tests/fake_libcuda.c");
    let source = std::fs::read(&source_path).expect("read fake_libcuda.c");
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir);
    let state = root.join("state");
    std::fs::create_dir_all(&state).expect("mkdir state");
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut hasher);
    let build_dir = root.join(format!("{:016x}", hasher.finish()));
    if !build_dir.exists() {
        let private = root.join(format!("building-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&private);
        for (name, extra) in variants {
            let out = private.join(name).join("libcuda.so.1");
            std::fs::create_dir_all(out.parent().expect("dir")).expect("mkdir");
            let status = Command::new("cc")
                .args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror"])
                .arg(format!("-DSTATE_DIR=\"{}\"", state.display()))
                .args(extra.iter().flat_map(|e| e.split_whitespace()))
                .arg("-o")
                .arg(&out)
                .arg(&source_path)
                .status()
                .expect("run cc (a C compiler is needed for this test)");
            assert!(status.success(), "building {} failed", out.display());
        }
        if std::fs::rename(&private, &build_dir).is_err() {
            assert!(build_dir.exists(), "could not move the fake driver into {}", build_dir.display());
            let _ = std::fs::remove_dir_all(&private);
        }
    }
    (build_dir, state)
}
