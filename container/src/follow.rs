//! A checkpoint directory pushed while the runtime writes it. runc drives CRIU through its
//! RPC mode, which has no image streaming (CRIU's `cr-service.c` opens the image directory
//! without a streamer), so CRIU writes its images into a staging directory. Its page images,
//! nearly all of the bytes, are followed as they grow and pushed while the dump runs; the rest
//! (small files CRIU may rewrite) is pushed once the runtime has returned.
//!
//! CRIU writes each page image once, front to back (`page-xfer.c` splices each page pipe onto
//! the end of the file), so bytes once read never change; a page image found shorter than
//! what was read of it fails the push. The staged directory stays whole until the caller
//! removes it, so a push that fails can still restore the container from it.

use crate::error::Result;
use gstore_gpu_dump::procfs;
use gstore_store::commands::push::stream::{self, StreamSink};
use gstore_store::commands::push::{self, PushReport};
use gstore_store::dedup::similar::is_page_image_path;
use gstore_store::format::meta::ImageMeta;
use gstore_store::progress::Progress;
use gstore_store::{IndexedStore, StoreError, TagRef};
use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Where a checkpoint of about `bytes` is staged: `$GSTORE_STAGING_DIR` when set; else in
/// memory (`/dev/shm`) when the dump would outrun the disk and memory has room for it
/// ([`in_memory`]); else the system's temporary directory.
pub(crate) fn staging_root(bytes: u64) -> PathBuf {
    if let Some(dir) = gstore_store::environment::staging_dir() {
        return dir;
    }
    let shm = Path::new(SHM);
    let meminfo = procfs::meminfo();
    let ratio = std::fs::read_to_string("/proc/sys/vm/dirty_background_ratio").ok().and_then(|r| r.trim().parse().ok());
    if in_memory(bytes, &meminfo, ratio.unwrap_or(10), free_bytes(shm)) {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The name a staging directory of this process starts with: `gstore-runc-PID-`.
pub(crate) fn staging_prefix() -> String {
    format!("{STAGING}{}-", std::process::id())
}

/// Where a checkpoint is staged in memory.
const SHM: &str = "/dev/shm";
/// Staging directories start with this, then their maker's pid.
const STAGING: &str = "gstore-runc-";

/// Removes, wherever [`staging_root`] may stage, what a gstore killed mid-checkpoint left
/// ([`remove_stale`]).
pub(crate) fn remove_stale_staging() {
    match gstore_store::environment::staging_dir() {
        Some(dir) => remove_stale(&dir),
        None => {
            remove_stale(Path::new(SHM));
            remove_stale(&std::env::temp_dir());
        }
    }
}

/// Removes the staging directories in `root` that a gstore killed mid-checkpoint left behind
/// (their maker's pid, in their names, runs no more): in `/dev/shm` each holds memory. A
/// directory whose maker may still run is left alone.
fn remove_stale(root: &Path) {
    let Ok(listing) = std::fs::read_dir(root) else { return };
    for e in listing.flatten() {
        let name = e.file_name();
        let maker = name.to_str().and_then(|n| n.strip_prefix(STAGING)?.split('-').next()?.parse::<u32>().ok());
        let Some(pid) = maker else { continue };
        if !procfs::exists(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A staging directory kept for its user (the restore from it failed), renamed so that
/// [`remove_stale`] leaves it once this gstore is gone; where it is now.
pub(crate) fn kept(dir: PathBuf) -> PathBuf {
    let name = dir.file_name().and_then(|n| n.to_str()).map(|n| n.replacen(STAGING, "gstore-kept-runc-", 1));
    match name {
        Some(name) if std::fs::rename(&dir, dir.with_file_name(&name)).is_ok() => dir.with_file_name(name),
        _ => dir,
    }
}

/// Whether a checkpoint of `bytes` is staged in memory, given `/proc/meminfo`'s text, the
/// kernel's background write-back threshold (`vm.dirty_background_ratio`, percent of memory)
/// and the bytes free in `/dev/shm`: when it is larger than the threshold (on disk, CRIU would
/// wait for write-back, and the push beside it writes the store to the same disk) and memory
/// holds it with an eighth of the machine's memory to spare.
fn in_memory(bytes: u64, meminfo: &str, dirty_background_ratio: u64, shm_free: u64) -> bool {
    let field = |name| procfs::meminfo_bytes(meminfo, name);
    let (Some(total), Some(available)) = (field("MemTotal"), field("MemAvailable")) else { return false };
    bytes > total / 100 * dirty_background_ratio && bytes + total / 8 <= available && bytes <= shm_free
}

/// Bytes free to an unprivileged writer in the file system at `dir` (0 if unknown).
fn free_bytes(dir: &Path) -> u64 {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else { return 0 };
    // SAFETY: `statvfs` writes into the zeroed struct it is given; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    st.f_bavail as u64 * st.f_frsize as u64
}

/// Bytes at most between the followers and the push.
const BUFFER: u64 = 256 << 20;
/// How often the directory is looked at for new page images, and a caught-up follower for
/// more bytes.
const POLL: Duration = Duration::from_millis(2);

/// Runs `write` (the runtime writing its checkpoint into `root`) while the page images it
/// writes into `root`'s directory `dir` are pushed as image `tag`; once it returns, the rest of `root`
/// is pushed and the image gets `meta` of what `write` returned. An error is `write`'s own:
/// nothing is tagged. Otherwise what `write` returned and how the push went, which may have
/// failed (the staged directory is whole either way).
pub(crate) fn push_while_written<T: Send>(
    store: &IndexedStore,
    root: &Path,
    dir: &str,
    tag: &TagRef,
    progress: &dyn Progress,
    write: impl FnOnce() -> Result<T> + Send,
    meta: impl FnOnce(&T) -> ImageMeta,
) -> Result<(T, std::result::Result<PushReport, StoreError>)> {
    let (sink, source) = stream::channel(store, BUFFER);
    std::thread::scope(|s| {
        let pushing = s.spawn(|| push::push_stream(store, source, tag, progress));
        let written = feed(sink, root, dir, write, meta);
        let pushed = pushing.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        written.map(|(t, fed)| (t, stream::outcome(pushed, fed).map(|(report, ())| report)))
    })
}

/// Feeds `sink` while `write` runs: followers for the page images as they appear, then the
/// rest of `root`. `write`'s error ends it (the sink dropped); otherwise what it returned and
/// whether feeding worked.
fn feed<T: Send>(
    sink: StreamSink,
    root: &Path,
    dir: &str,
    write: impl FnOnce() -> Result<T> + Send,
    meta: impl FnOnce(&T) -> ImageMeta,
) -> Result<(T, std::result::Result<(), StoreError>)> {
    let done = AtomicBool::new(false);
    let followed = Mutex::new(HashSet::new());
    let (written, fed) = std::thread::scope(|s| {
        let writing = s.spawn(|| {
            let r = write();
            done.store(true, Ordering::Release);
            r
        });
        let mut followers = Vec::new();
        loop {
            // Read before the look: a page image created before the writer ended is seen by
            // the last look, and one missed is pushed with the rest.
            let ended = done.load(Ordering::Acquire);
            for (rel, path) in new_page_images(root, dir, &followed) {
                let (sink, done) = (&sink, &done);
                followers.push(s.spawn(move || follow(sink, &rel, &path, done)));
            }
            if ended {
                break;
            }
            std::thread::sleep(POLL);
        }
        let written = writing.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        let fed = followers
            .into_iter()
            .map(|f| f.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<std::result::Result<Vec<()>, StoreError>>();
        (written, fed)
    });
    let t = written?;
    let followed = followed.into_inner().expect("followed lock");
    let fed = fed.and_then(|_| sink.tree(root, &followed)).and_then(|()| sink.finish(meta(&t)));
    Ok((t, fed))
}

/// Page images in `root`'s directory `dir` not yet in `followed` (added to it): their paths in
/// the image and on disk. A directory not there yet is looked at again next time.
fn new_page_images(root: &Path, dir: &str, followed: &Mutex<HashSet<String>>) -> Vec<(String, PathBuf)> {
    let Ok(listing) = std::fs::read_dir(root.join(dir)) else { return Vec::new() };
    let mut followed = followed.lock().expect("followed lock");
    listing
        .flatten()
        .filter_map(|e| {
            let rel = format!("{dir}/{}", e.file_name().to_str()?);
            (is_page_image_path(&rel) && followed.insert(rel.clone())).then(|| (rel, e.path()))
        })
        .collect()
}

/// Pushes the page image at `path` (`rel` in the image) as it grows, until the writer is
/// done and its end is read.
fn follow(sink: &StreamSink, rel: &str, path: &Path, done: &AtomicBool) -> std::result::Result<(), StoreError> {
    let file = File::open(path).map_err(|e| StoreError::io("reading", path, e))?;
    let mode = file.metadata().map_err(|e| StoreError::io("reading", path, e))?.permissions().mode() & 0o7777;
    let mut growing = Growing { file, done, ended: false };
    let read = sink.file(rel, mode)?.read_from(&mut growing)?;
    let len = growing.file.metadata().map_err(|e| StoreError::io("reading", path, e))?.len();
    if len != read {
        return Err(StoreError::Conflict(format!(
            "{} changed while it was pushed ({read} bytes read, {len} there now): CRIU writes page images once, \
             front to back",
            path.display()
        )));
    }
    Ok(())
}

/// A file read while it is written: at its current end it waits for more, and it ends once
/// the writer is done and what it wrote is read.
struct Growing<'a> {
    file: File,
    done: &'a AtomicBool,
    /// The writer was done at the last look: the next empty read is the end.
    ended: bool,
}

impl Read for Growing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.file.read(buf)?;
            if n > 0 || buf.is_empty() || self.ended {
                return Ok(n);
            }
            if self.done.load(Ordering::Acquire) {
                self.ended = true;
            } else {
                std::thread::sleep(POLL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ContainerError;
    use gstore_store::progress::Unit;
    use gstore_store::{Store, StoreConfig, StoreLocation};
    use std::io::Write;
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    /// Counts the bytes the push has stored.
    #[derive(Default)]
    struct Stored(AtomicU64);

    impl Progress for Stored {
        fn start(&self, _: &str, _: u64, _: Unit) {}
        fn advance(&self, n: u64) {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
        fn finish(&self) {}
    }

    impl Stored {
        /// Waits until the push has stored `n` bytes; an error after a minute.
        fn wait_for(&self, n: u64) -> Result<()> {
            let start = Instant::now();
            while self.0.load(Ordering::Relaxed) < n {
                if start.elapsed() > Duration::from_secs(60) {
                    return Err(ContainerError::NoRuntime(format!(
                        "the push stored {self:?} of {n} bytes in a minute"
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        }
    }

    impl std::fmt::Debug for Stored {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}", self.0.load(Ordering::Relaxed))
        }
    }

    fn store(dir: &Path) -> IndexedStore {
        let loc = StoreLocation::Local(dir.join("store"));
        Store::init(&loc, &StoreConfig::default()).unwrap();
        Store::open_indexed(&loc, &|_| {}).unwrap()
    }

    /// Pages as a process's memory holds them: small floats, a page of zeros now and then.
    fn pages(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = if x.is_multiple_of(61) { 0.0 } else { (x as f32 / u32::MAX as f32 - 0.5) * 0.04 };
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.truncate(n);
        out
    }

    fn append(path: &Path, bytes: &[u8]) -> Result<()> {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        f.write_all(bytes).map_err(|e| ContainerError::io("writing", path, e))
    }

    #[test]
    fn page_images_are_pushed_while_they_are_written_and_the_rest_after() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let root = tmp.path().join("image");
        std::fs::create_dir_all(root.join("checkpoint")).unwrap();
        std::fs::write(root.join("config.json"), b"{}").unwrap();
        let (first, second) = (pages(48 << 20, 1), pages(5 << 20, 2));
        let stored = Stored::default();
        let tag = TagRef::parse("ctr:1").unwrap();
        let pages_at = root.join("checkpoint/pages-1.img");
        let write = || {
            append(&pages_at, &first)?;
            // Nothing more is written until the push has stored a segment of what is there.
            stored.wait_for(16 << 20)?;
            append(&pages_at, &second)?;
            std::fs::write(root.join("checkpoint/pagemap-1.img"), b"pagemap").unwrap();
            Ok(7u32)
        };
        let meta = |t: &u32| ImageMeta { pid: Some(*t), ..ImageMeta::default() };
        let (t, pushed) = push_while_written(&store, &root, "checkpoint", &tag, &stored, write, meta).unwrap();
        assert_eq!(t, 7);
        pushed.unwrap();

        let id = store.resolve("ctr:1").unwrap();
        let m = store.get_manifest(&id).unwrap();
        assert_eq!(m.meta.pid, Some(7));
        let paths: Vec<_> = m.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["checkpoint", "checkpoint/pagemap-1.img", "checkpoint/pages-1.img", "config.json"]);
        let out = tmp.path().join("out");
        gstore_restore::restore_to_dir(&store, &id, &m, &out, gstore_restore::Budget::DEFAULT, &stored).unwrap();
        let back = std::fs::read(out.join("checkpoint/pages-1.img")).unwrap();
        assert!(
            back.len() == first.len() + second.len()
                && back[..first.len()] == first[..]
                && back[first.len()..] == second[..]
        );
        assert_eq!(std::fs::read(out.join("checkpoint/pagemap-1.img")).unwrap(), b"pagemap");
    }

    #[test]
    fn a_checkpoint_is_staged_in_memory_only_when_the_disk_would_hold_it_back_and_memory_has_room() {
        let meminfo = "MemTotal:       131072000 kB\nMemFree:  1000 kB\nMemAvailable:    104857600 kB\n";
        let (gib, shm) = (1u64 << 30, 64u64 << 30);
        assert!(!in_memory(4 * gib, meminfo, 10, shm), "below the write-back threshold (12.5 GiB): the disk keeps up");
        assert!(in_memory(26 * gib, meminfo, 10, shm));
        assert!(!in_memory(26 * gib, meminfo, 10, 20 * gib), "/dev/shm too small");
        assert!(!in_memory(90 * gib, meminfo, 10, 128 * gib), "less than an eighth of memory would be left");
        assert!(!in_memory(26 * gib, "", 10, shm), "memory unknown");
    }

    #[test]
    fn staging_left_by_a_dead_gstore_is_removed_and_a_live_or_kept_one_is_not() {
        let root = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let dir = |name: String| {
            let d = root.path().join(name);
            std::fs::create_dir_all(d.join("image")).unwrap();
            d
        };
        let stale = dir(format!("{STAGING}{dead}-a"));
        let live = dir(format!("{}b", staging_prefix()));
        let other = dir("gstore-runc-x".into());
        let kept = kept(dir(format!("{STAGING}{dead}-c")));
        assert!(kept.file_name().unwrap().to_str().unwrap().starts_with("gstore-kept-runc-"), "{}", kept.display());
        remove_stale(root.path());
        assert!(!stale.exists(), "its maker is gone");
        assert!(live.exists() && other.exists() && kept.join("image").exists());
    }

    #[test]
    fn a_writer_that_fails_tags_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let root = tmp.path().join("image");
        std::fs::create_dir_all(root.join("checkpoint")).unwrap();
        let tag = TagRef::parse("ctr:1").unwrap();
        let pages_at = root.join("checkpoint/pages-1.img");
        let write = || -> Result<()> {
            append(&pages_at, &pages(20 << 20, 3))?;
            Err(ContainerError::NoRuntime("CRIU failed".into()))
        };
        let e = push_while_written(&store, &root, "checkpoint", &tag, &gstore_store::progress::Silent, write, |_| {
            ImageMeta::default()
        })
        .err()
        .unwrap();
        assert!(e.to_string().contains("CRIU failed"), "{e}");
        assert!(store.resolve("ctr:1").is_err(), "nothing is tagged");
    }

    #[test]
    fn a_page_image_cut_after_it_was_read_fails_the_push() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let root = tmp.path().join("image");
        std::fs::create_dir_all(root.join("checkpoint")).unwrap();
        let stored = Stored::default();
        let tag = TagRef::parse("ctr:1").unwrap();
        let pages_at = root.join("checkpoint/pages-1.img");
        let write = || {
            append(&pages_at, &pages(40 << 20, 4))?;
            stored.wait_for(16 << 20)?;
            std::fs::OpenOptions::new().write(true).open(&pages_at).unwrap().set_len(1 << 20).unwrap();
            Ok(())
        };
        let (_, pushed) =
            push_while_written(&store, &root, "checkpoint", &tag, &stored, write, |_| ImageMeta::default()).unwrap();
        let e = pushed.unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)) && e.to_string().contains("changed while it was pushed"), "{e}");
        assert!(store.resolve("ctr:1").is_err(), "nothing is tagged");
    }
}
