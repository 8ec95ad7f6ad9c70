//! Processes that keep their weights out of their images (Python `gstore.serving`): asked to
//! release them before a checkpoint and to refill them from the store after it, or after a
//! restore. The protocol (docs/ARCHITECTURE.md, "Weights out of the image"):
//!
//! - the process registers in `$GSTORE_COOP_DIR/PID/` (default `/dev/shm/gstore-coop`):
//!   `weights.json`, a [`Registration`];
//! - the controller writes `ctl` (`{"action": "release" | "refill", "controller": PID}`),
//!   and for a release sends the registered signal;
//! - the process answers in `state`: `released`, `refilled`, or `failed KIND: WHY` (KIND
//!   `release`, `corrupt`, `not-found` or `failed`); a refill that fails ends the process.
//!
//! A process whose controller is gone refills by itself, so no crash of `gstore` leaves a
//! process without its weights.

use crate::error::{CaptureError, Result};
use gstore_gpu_dump::{procfs, CudaDriver};
use gstore_restore::{Budget, DeviceImage};
use gstore_store::format::manifest::Manifest;
use gstore_store::format::meta::ImageMeta;
use gstore_store::progress::Silent;
use gstore_store::IndexedStore;
use gstore_store::{ObjectId, ObjectKind, StoreError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// How long a process gets to release its weights (wait for its GPUs, free the memory).
const RELEASE_WAIT: Duration = Duration::from_secs(120);
/// How long a refill may take before the controller gives up on the process (the weights
/// may come from a bucket over a slow link).
const REFILL_WAIT: Duration = Duration::from_secs(1800);
/// How often the controller looks at `state`.
const POLL: Duration = Duration::from_millis(1);

/// The directory processes register in: `GSTORE_COOP_DIR`, else `/dev/shm/gstore-coop`.
pub fn coop_dir() -> PathBuf {
    std::env::var_os("GSTORE_COOP_DIR").map_or_else(|| PathBuf::from("/dev/shm/gstore-coop"), PathBuf::from)
}

/// What a process registered: whose weights, from which image, and how to ask it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    /// The process.
    pub pid: u32,
    /// The signal that asks it to release.
    pub signal: i32,
    /// The store its weights come from, as it names it (`None`: the default store).
    pub store: Option<String>,
    /// The model image's manifest id (hex).
    pub image: String,
    /// The model image as named when registered.
    pub tag: String,
    /// Tensors left out.
    pub tensors: u64,
    /// Bytes of GPU memory left out.
    pub bytes: u64,
    /// Where its weights live: "cuda:N", or "cpu" (`None` in records before there was a
    /// choice: "cuda:0").
    #[serde(default)]
    pub device: Option<String>,
    /// Its command line as `/proc/PID/cmdline` has it (arguments joined by spaces): a
    /// registration left by a process that is gone does not speak for a later one that got
    /// its pid (a restored process has its old one).
    #[serde(default)]
    pub cmdline: Option<String>,
}

impl Registration {
    /// The model image's manifest id.
    pub fn image_id(&self) -> Result<ObjectId> {
        ObjectId::from_hex(&self.image).map_err(|_| CaptureError::Cooperation {
            pid: self.pid,
            step: "read",
            detail: format!("bad image id {:?}", self.image),
        })
    }

    /// The GPU its weights live on, if they live on one.
    pub fn gpu(&self) -> Option<u32> {
        match self.device.as_deref().unwrap_or("cuda:0") {
            "cuda" => Some(0),
            d => d.strip_prefix("cuda:")?.parse().ok(),
        }
    }

    fn dir(&self) -> PathBuf {
        coop_dir().join(self.pid.to_string())
    }

    fn put(&self, name: &str, text: &str) -> Result<()> {
        let dir = self.dir();
        let io = |e: std::io::Error| CaptureError::Cooperation {
            pid: self.pid,
            step: "ask",
            detail: format!("writing {}: {e}", dir.join(name).display()),
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let tmp = dir.join(format!(".{name}.controller"));
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, dir.join(name)).map_err(io)
    }

    fn state(&self) -> Option<String> {
        std::fs::read_to_string(self.dir().join("state")).ok()
    }

    /// Writes `ctl` asking for `action`, the old answer removed first; `prefetch`: the
    /// weights will be offered in this process's GPU memory ([`prefetch_all`]).
    fn ask(&self, action: &str, prefetch: bool) -> Result<()> {
        let _ = std::fs::remove_file(self.dir().join("state"));
        let ctl = serde_json::json!({"action": action, "controller": std::process::id(), "prefetch": prefetch});
        self.put("ctl", &ctl.to_string())
    }

    /// Waits until `state` says `done`, the process fails or ends, or `limit` passes.
    fn wait(&self, step: &'static str, done: &str, limit: Duration) -> Result<f64> {
        self.answer(step, done, limit).and_then(|(state, seconds)| match state {
            Answer::Done => Ok(seconds),
            Answer::Changed(why) => Err(CaptureError::Cooperation { pid: self.pid, step, detail: why }),
        })
    }

    /// Waits until `state` says `done` or `changed: WHY`, the process fails or ends, or
    /// `limit` passes; returns which, and the seconds it took.
    fn answer(&self, step: &'static str, done: &str, limit: Duration) -> Result<(Answer, f64)> {
        let start = Instant::now();
        loop {
            match self.state() {
                Some(s) if s == done => return Ok((Answer::Done, start.elapsed().as_secs_f64())),
                Some(s) if s.starts_with("changed") => {
                    let why = s.trim_start_matches("changed").trim_start_matches(':').trim().to_string();
                    return Ok((Answer::Changed(why), start.elapsed().as_secs_f64()));
                }
                Some(s) if s.starts_with("failed") => return Err(self.failed(step, &s)),
                _ => {}
            }
            let why = if !procfs::is_alive(self.pid) {
                "the process ended"
            } else if start.elapsed() > limit {
                "it did not answer in time"
            } else {
                std::thread::sleep(POLL);
                continue;
            };
            let detail = format!("{why} ({}s)", limit.as_secs());
            return Err(CaptureError::Cooperation { pid: self.pid, step, detail });
        }
    }

    /// The error for a `failed KIND: WHY` answer: the store's kind when the store said.
    fn failed(&self, step: &'static str, state: &str) -> CaptureError {
        let rest = state.trim_start_matches("failed").trim_start();
        let (kind, why) = rest.split_once(": ").unwrap_or(("failed", rest));
        let key = format!("{} ({})", self.tag, self.image);
        let source = match kind {
            "corrupt" => StoreError::corrupt(ObjectKind::Chunk, key, why.to_string()),
            "not-found" => StoreError::NotFound { what: ObjectKind::Manifest, key: format!("{key}: {why}") },
            _ => return CaptureError::Cooperation { pid: self.pid, step, detail: why.to_string() },
        };
        CaptureError::Refill { pid: self.pid, source }
    }
}

/// The registered processes of the tree under `root`: those whose registration is theirs (the
/// same pid and command line, and a handler for its signal: never one a gone process left in
/// its pid's name, and never a process the signal would end).
pub fn find(root: u32) -> Vec<Registration> {
    procfs::descendants(&[root])
        .into_iter()
        .filter_map(|pid| {
            let text = std::fs::read_to_string(coop_dir().join(pid.to_string()).join("weights.json")).ok()?;
            serde_json::from_str::<Registration>(&text)
                .ok()
                .filter(|r| r.pid == pid && r.cmdline.as_ref().is_none_or(|c| procfs::cmdline(pid).as_ref() == Some(c)))
                // A process that does not catch the signal never registered (it would end).
                .filter(|r| procfs::catches(pid, r.signal))
        })
        .collect()
}

/// What a process answered.
enum Answer {
    /// What was asked is done.
    Done,
    /// Its weights changed since it registered (why): it keeps them, and its registration
    /// ended.
    Changed(String),
}

/// A registered process whose weights changed since it registered, found so by a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedWeights {
    /// The process.
    pub pid: u32,
    /// What changed, as the process said (a tensor written in place, replaced, or whose bytes
    /// differ).
    pub why: String,
}

/// What a release came to.
pub struct Released {
    /// The processes that freed their weights: the image leaves those out.
    pub regs: Vec<Registration>,
    /// The processes whose weights had changed since they registered: they kept them, so the
    /// image stores them as any process's memory.
    pub changed: Vec<ChangedWeights>,
    /// Seconds until every process had answered.
    pub seconds: f64,
}

/// Asks every process of `regs` to release its weights and waits for all. A process whose
/// weights changed since it registered keeps them ([`Released::changed`]). A failure asks
/// those that released to refill (nothing is checkpointed then), and says which process
/// failed and why.
pub fn release(regs: Vec<Registration>) -> Result<Released> {
    let start = Instant::now();
    if regs.is_empty() {
        return Ok(Released { regs, changed: Vec::new(), seconds: 0.0 });
    }
    let mut asked = Vec::new();
    let released = regs.iter().try_for_each(|r| {
        // What an earlier prefetch offered is gone with the memory it named.
        let _ = std::fs::remove_file(r.dir().join(PREFETCHED));
        r.ask("release", false)?;
        asked.push(r);
        // SAFETY: kill(2) with a pid and a signal number, no memory involved.
        if unsafe { libc::kill(r.pid as libc::pid_t, r.signal) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(CaptureError::Cooperation { pid: r.pid, step: "release", detail: format!("signal: {e}") });
        }
        Ok(())
    });
    let answers = released
        .and_then(|()| regs.iter().map(|r| r.answer("release", "released", RELEASE_WAIT)).collect::<Result<Vec<_>>>());
    match answers {
        Ok(answers) => {
            let mut out = Released { regs: Vec::new(), changed: Vec::new(), seconds: start.elapsed().as_secs_f64() };
            for (r, (answer, _)) in regs.into_iter().zip(answers) {
                match answer {
                    Answer::Done => out.regs.push(r),
                    Answer::Changed(why) => out.changed.push(ChangedWeights { pid: r.pid, why }),
                }
            }
            Ok(out)
        }
        Err(e) => {
            // Those that did release (or do so late) take their weights back.
            for r in asked {
                let _ = r.ask("refill", false);
            }
            Err(e)
        }
    }
}

/// Asks every live process of `regs` to refill its weights and waits for all; returns the
/// seconds that took. With `prefetch`, those on a GPU copy them from the memory
/// [`prefetch_all`] publishes (running since the release). The first failure is the result
/// (each process that fails ends).
pub fn refill(regs: &[Registration], prefetch: bool) -> Result<f64> {
    let start = Instant::now();
    let live: Vec<&Registration> = regs.iter().filter(|r| procfs::is_alive(r.pid)).collect();
    for r in &live {
        r.ask("refill", prefetch && r.gpu().is_some())?;
    }
    for r in &live {
        r.wait("refill", "refilled", REFILL_WAIT)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// The metadata a checkpoint of `regs` records: [`ImageMeta::released_weights`], and the
/// model images under [`ImageMeta::uses`] so that gc keeps them while the image lives.
pub fn metadata(regs: &[Registration]) -> ImageMeta {
    if regs.is_empty() {
        return ImageMeta::default();
    }
    let mut uses: Vec<String> = regs.iter().map(|r| r.image.clone()).collect();
    uses.sort_unstable();
    uses.dedup();
    ImageMeta { released_weights: Some(serde_json::json!(regs)), uses: Some(uses), ..ImageMeta::default() }
}

/// The registrations an image's metadata records (empty when it left no weights out).
pub fn recorded(meta: &ImageMeta) -> Result<Vec<Registration>> {
    match &meta.released_weights {
        None => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| CaptureError::Cooperation {
            pid: 0,
            step: "read",
            detail: format!("the image's released_weights cannot be read: {e}"),
        }),
    }
}

/// Before a restore: each process of `regs` will find a refill asked for as soon as it runs
/// (its registration written again, for a machine that never saw it); with `prefetch`, from
/// the GPU memory of this process once [`prefetch_all`] (started after this) has published
/// it.
pub fn ask_refill_on_restore(regs: &[Registration], prefetch: bool) -> Result<()> {
    for r in regs {
        let _ = std::fs::remove_file(r.dir().join(PREFETCHED));
        r.put("weights.json", &serde_json::to_string(r).expect("a registration serializes"))?;
        r.ask("refill", prefetch && r.gpu().is_some())?;
    }
    Ok(())
}

/// The file a prefetch is published in, beside `ctl`.
const PREFETCHED: &str = "prefetched.json";

/// The manifest of `r`'s model image, checked against its id.
pub fn model_manifest(store: &IndexedStore, r: &Registration) -> Result<Manifest> {
    Ok(store.get_manifest(&r.image_id()?)?)
}

/// Loads each GPU process's model image of `models` (a registration with the manifest of its
/// model image, [`model_manifest`]; computed as they are taken, on the caller's thread) into
/// this process's memory on its GPU (every chunk checked there, as `gstore load` does) and
/// publishes it in
/// `prefetched.json`: `{"device": N, "files": [{"path": P, "len": BYTES, "handle": HEX}]}`
/// (one 128-hex-digit `cuIpcMemHandle` per file, as the image orders them), or `{"error":
/// WHY}`, on which the process loads from the store itself. The memory is held until
/// `released` says the processes are done with it (the sender dropped). `offered` is set once
/// every model image is published, if there was one and none failed.
fn prefetch_all<'a>(
    store: &IndexedStore,
    models: impl IntoIterator<Item = (&'a Registration, Result<Manifest>)>,
    budget: Budget,
    released: Receiver<()>,
    offered: &Offered,
) {
    let mut held = Vec::new();
    let mut failed = false;
    let mut offers = 0;
    for (r, manifest) in models {
        let Some(device) = r.gpu() else { continue };
        let loaded = manifest.and_then(|m| prefetch(store, &m, device, budget));
        let published = match &loaded {
            Ok(image) => offer(image, device),
            Err(e) => Err(e.to_string()),
        };
        let text = published.unwrap_or_else(|why| serde_json::json!({ "error": why }).to_string());
        // A process that finds nothing published waits for its controller to end, then loads
        // from the store itself: nothing is lost if this fails.
        let _ = r.put(PREFETCHED, &text);
        failed |= loaded.is_err();
        offers += 1;
        held.extend(loaded.ok());
    }
    if offers > 0 && !failed {
        let _ = offered.0.set(Instant::now());
    }
    let _ = released.recv();
}

/// When a prefetch had every model image it loads in GPU memory and offered to the processes
/// ([`while_prefetching`]); unset while it loads, and for good when one failed (those processes
/// then load from the store themselves) or nothing was prefetched.
#[derive(Default)]
pub struct Offered(std::sync::OnceLock<Instant>);

impl Offered {
    /// When every model image was offered, if it was.
    pub fn at(&self) -> Option<Instant> {
        self.0.get().copied()
    }
}

/// Runs `body` with [`prefetch_all`] loading `models` beside it when `enabled`; the memory it
/// loaded is let go once `body` returns (by then the processes have copied from it, or will
/// load from the store). `body` is given when the prefetch offered the weights ([`Offered`]).
pub fn while_prefetching<'a, T>(
    store: &IndexedStore,
    models: impl IntoIterator<Item = (&'a Registration, Result<Manifest>)> + Send,
    budget: Budget,
    enabled: bool,
    body: impl FnOnce(&Offered) -> T,
) -> T {
    let offered = Offered::default();
    std::thread::scope(|s| {
        let (release, released) = std::sync::mpsc::channel::<()>();
        if enabled {
            s.spawn(|| prefetch_all(store, models, budget, released, &offered));
        }
        let out = body(&offered);
        drop(release);
        out
    })
}

/// Lowers the CPU priority of the calling thread, and of the threads it starts from then on,
/// to nice 10: where the cores run short, a prefetch's load takes the CPU time the restore
/// beside it leaves, and the lazy fill that the driver's restore waits for goes first. (On the
/// H200 machine, an idle one otherwise, nice 0, 10 or 19 changed nothing measurable; the
/// prefetch's thread count did: [`beside_a_restore`], docs/BENCHMARKS.md.)
fn lower_priority() {
    // SAFETY: setpriority on the calling thread (`who` 0 is the caller; Linux keeps the nice
    // value per thread); a failure leaves the priority as it was.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
}

/// The image of manifest `m` in this process's memory on GPU `device`: the plan and the
/// staging are under way while CUDA starts (at the priority it had: the restore's machine
/// check waits for the same start), the load at a lower one ([`lower_priority`]) and on
/// fewer threads ([`beside_a_restore`]).
fn prefetch(store: &IndexedStore, m: &Manifest, device: u32, budget: Budget) -> Result<DeviceImage> {
    std::thread::scope(|s| {
        let started = s.spawn(|| CudaDriver::load()?.context(device));
        lower_priority();
        let open = || started.join().expect("CUDA start does not panic").map_err(gstore_store::StoreError::device);
        let pool = beside_a_restore()?;
        Ok(pool.install(|| gstore_restore::restore_to_device_with(store, m, open, budget, &Silent))?)
    })
}

/// The thread pool of a prefetch: two thirds of the machine's threads (rounded up), so that
/// its load reads with fewer workers than a load alone would (8 instead of 12 on the H200
/// machine's 16 threads). It shares the host's cores and memory with the lazy fill, CRIU and
/// the driver's restore of the GPU state, which the process waits for as well. Restores of an
/// 8B server alternating with the previous build in one run: its GPU state back in 0.44-0.61 s
/// against 0.51-0.54, the weights refilled 0.71-0.91 s after the command's start against
/// 0.82-0.84 (docs/BENCHMARKS.md, issue #63).
fn beside_a_restore() -> Result<rayon::ThreadPool> {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    rayon::ThreadPoolBuilder::new()
        .num_threads((threads * 2).div_ceil(3))
        .build()
        .map_err(|e| StoreError::Internal(format!("starting the prefetch's threads: {e}")).into())
}

/// The `prefetched.json` text for `image`.
fn offer(image: &DeviceImage, device: u32) -> std::result::Result<String, String> {
    let files = image
        .entries
        .iter()
        .map(|e| {
            let handle =
                if e.buffer.is_empty() { [0; 64] } else { e.buffer.ipc_handle().map_err(|e| e.to_string())?.0 };
            Ok(serde_json::json!({"path": e.path, "len": e.buffer.len(), "handle": hex::encode(handle)}))
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    Ok(serde_json::json!({"device": device, "files": files}).to_string())
}

/// After a restore: waits for every process of `regs` to refill; returns the seconds.
pub fn wait_refilled(regs: &[Registration]) -> Result<f64> {
    let start = Instant::now();
    for r in regs {
        r.wait("refill", "refilled", REFILL_WAIT)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(pid: u32) -> Registration {
        Registration {
            pid,
            signal: libc::SIGUSR2,
            store: Some("/data/store".into()),
            image: "ab".repeat(32),
            tag: "qwen:v1".into(),
            tensors: 3,
            bytes: 1 << 20,
            device: Some("cuda:1".into()),
            cmdline: None,
        }
    }

    #[test]
    fn a_prefetch_of_weights_in_host_memory_offers_nothing() {
        use gstore_store::{Store, StoreConfig, StoreLocation};
        let dir = tempfile::tempdir().expect("tempdir");
        let loc = StoreLocation::Local(dir.path().join("store"));
        Store::init(&loc, &StoreConfig::default()).expect("init");
        let store = Store::open_indexed(&loc, &|_| {}).expect("open");
        let host = Registration { device: Some("cpu".into()), ..reg(1) };
        let offered = Offered::default();
        let (release, released) = std::sync::mpsc::channel::<()>();
        drop(release);
        // Its manifest is never looked at: weights in host memory are not prefetched.
        let unread: Result<Manifest> = Err(gstore_store::StoreError::Internal("not read".into()).into());
        prefetch_all(&store, [(&host, unread)], Budget::DEFAULT, released, &offered);
        assert!(offered.at().is_none(), "nothing was prefetched, so nothing is offered");
    }

    #[test]
    fn a_process_whose_weights_changed_keeps_them_and_is_not_left_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::env::set_var("GSTORE_COOP_DIR", dir.path());
        let me = std::process::id();
        // SAFETY: installs a handler that does nothing, in this test's own process.
        unsafe { libc::signal(libc::SIGUSR2, ignore as *const () as libc::sighandler_t) };
        let at = dir.path().join(me.to_string());
        let out = std::thread::scope(|s| {
            // The process's side: it finds its weights changed when asked to release them.
            s.spawn(|| {
                while !at.join("ctl").exists() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::fs::write(at.join("state"), "changed: 0.weight was written in place").unwrap();
            });
            release(vec![reg(me)]).expect("a change is an answer, not a failure")
        });
        assert!(out.regs.is_empty(), "nothing is left out of the image");
        assert_eq!(out.changed, vec![ChangedWeights { pid: me, why: "0.weight was written in place".into() }]);
        assert!(metadata(&out.regs).released_weights.is_none());
        std::env::remove_var("GSTORE_COOP_DIR");
    }

    #[test]
    fn metadata_records_the_registrations_and_the_images_gc_must_keep() {
        let meta = metadata(&[reg(7), reg(9)]);
        assert_eq!(recorded(&meta).expect("read back"), vec![reg(7), reg(9)]);
        assert_eq!(meta.to_map()["uses"], serde_json::json!(["ab".repeat(32)]));
        assert!(metadata(&[]).is_empty());
        assert!(recorded(&metadata(&[])).expect("none").is_empty());
    }

    extern "C" fn ignore(_: libc::c_int) {}

    #[test]
    fn only_a_registration_the_process_stands_behind_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::env::set_var("GSTORE_COOP_DIR", dir.path());
        let me = std::process::id();
        let write = |r: &Registration| {
            std::fs::create_dir_all(dir.path().join(me.to_string())).unwrap();
            std::fs::write(dir.path().join(me.to_string()).join("weights.json"), serde_json::to_vec(r).unwrap())
                .unwrap();
        };
        let mine = Registration { cmdline: procfs::cmdline(me), ..reg(me) };
        write(&mine);
        assert!(find(me).is_empty(), "this process does not catch SIGUSR2: the signal would end it");
        // SAFETY: installs a handler that does nothing, in this test's own process.
        unsafe { libc::signal(libc::SIGUSR2, ignore as *const () as libc::sighandler_t) };
        assert_eq!(find(me), vec![mine.clone()], "its own registration");
        write(&Registration { cmdline: Some("python3 another.py".into()), ..mine });
        assert!(find(me).is_empty(), "one left by an earlier process with this pid");
        std::env::remove_var("GSTORE_COOP_DIR");
    }

    #[test]
    fn the_device_a_registration_names() {
        assert_eq!(reg(7).gpu(), Some(1));
        assert_eq!(Registration { device: None, ..reg(7) }.gpu(), Some(0), "records before the field: cuda:0");
        assert_eq!(Registration { device: Some("cuda".into()), ..reg(7) }.gpu(), Some(0));
        assert_eq!(Registration { device: Some("cpu".into()), ..reg(7) }.gpu(), None);
    }

    #[test]
    fn a_failed_answer_keeps_the_stores_kind() {
        let r = reg(7);
        let e = r.failed("refill", "failed corrupt: CorruptError: chunk 12 does not match its id");
        assert!(matches!(e, CaptureError::Refill { source: StoreError::Corrupt { .. }, .. }), "{e}");
        assert!(e.to_string().contains("chunk 12"), "{e}");
        let e = r.failed("refill", "failed not-found: NotFoundError: no tensor named ['x']");
        assert!(matches!(e, CaptureError::Refill { source: StoreError::NotFound { .. }, .. }), "{e}");
        let e = r.failed("release", "failed release: RuntimeError: CUDA error");
        assert!(matches!(e, CaptureError::Cooperation { step: "release", .. }), "{e}");
    }
}
