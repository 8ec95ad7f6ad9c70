//! The directory sink: restores an image's entries under a destination directory.
//!
//! Everything is written into a hidden staging directory beside the destination
//! (`.NAME.gstore-partial`, private to the restoring user), which is renamed into place only
//! once every chunk has been fetched, verified and written, so a destination that exists is
//! complete. Files are created at their final size (zero chunks stay sparse holes), closed, and
//! filled with positional writes, reopened as their chunks arrive: at most a few hundred are
//! open at once (an eighth of the soft `RLIMIT_NOFILE`, at most 512), whatever the image's
//! number of files. A restore that fails on damage, a full disk or any other lasting
//! error removes the staging directory; one that is interrupted (killed, or the backend
//! unreachable) leaves it, and running the same restore again resumes: chunks whose bytes are
//! already in place (checked by hash) are not fetched.
//!
//! Nothing is ever written through a symlink: manifests with entries below a symlink are
//! refused when decoded, every parent directory is checked to be a real directory, files are
//! opened with `O_NOFOLLOW`, symlinks are created last, and a staging directory is resumed
//! only when it holds nothing but what this restore itself would have made there.

use crate::budget::Budget;
use crate::engine::{self, Piece, Sink};
use crate::handles::{self, Handles};
use crate::plan::{self, PlannedChunk, Target};
use crate::seed::Seed;
use gstore_store::format::manifest::{EntryKind, Manifest};
use gstore_store::progress::Progress;
use gstore_store::{ChunkIds, IndexedStore, ObjectId, Result, StoreError};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Marker file inside a staging directory naming the manifest being restored.
const MARKER: &str = ".gstore-restore";

/// What a directory restore did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    /// The destination.
    pub destination: String,
    /// Entries restored.
    pub entries: usize,
    /// Plain bytes of the image.
    pub logical_bytes: u64,
    /// Bytes read from packs.
    pub fetched_bytes: u64,
    /// Range reads issued.
    pub reads: usize,
    /// Chunks found already in place in an interrupted restore's staging directory.
    pub resumed_chunks: usize,
    /// Chunks copied from a seed instead of fetched.
    pub seeded_chunks: usize,
    /// Plain bytes of the chunks copied from a seed (each counted once, however often the
    /// image holds it).
    pub seeded_bytes: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Writes pieces into the files of one image, holding a bounded number of them open.
struct DirSink {
    /// The staging root and the directories below it already checked or made.
    dirs: Dirs,
    files: Handles,
    m: Manifest,
}

impl Sink for DirSink {
    fn write_batch(&self, pieces: &[Piece<'_>]) -> Result<()> {
        pieces.iter().try_for_each(|p| self.write_at((p.entry, p.offset), p.data))
    }
}

impl DirSink {
    /// Creates (or, when resuming, reopens) every entry under `root`, each file at its final
    /// size and closed again: files are opened for writing only as their chunks arrive.
    fn open(root: &Path, m: &Manifest, resume: bool) -> Result<DirSink> {
        let mut dirs = Dirs::new(root);
        for e in &m.entries {
            match e.kind {
                EntryKind::Dir => dirs.make(&e.path)?,
                EntryKind::File => create_file(&dirs.parent_of(&e.path)?, e.size, resume)?,
                EntryKind::Symlink => {}
            }
        }
        Ok(DirSink { dirs, files: Handles::new(handles::open_limit()), m: m.clone() })
    }

    /// The path of entry `entry` in the staging directory.
    fn path(&self, entry: usize) -> PathBuf {
        self.dirs.root.join(&self.m.entries[entry].path)
    }

    /// File entry `entry`, opened (never created: [`DirSink::open`] made it) for reading and
    /// writing unless it is still open.
    fn file(&self, entry: usize) -> Result<Arc<File>> {
        let path = self.path(entry);
        self.files
            .get(entry, || OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(&path))
            .map_err(|e| StoreError::io("opening", &path, e))
    }

    /// Writes `data` at target `t`.
    fn write_at(&self, (entry, offset): Target, data: &[u8]) -> Result<()> {
        self.file(entry)?.write_all_at(data, offset).map_err(|e| StoreError::io("writing", self.path(entry), e))
    }

    /// True when every target of `c` already holds its bytes (chunks named by `ids`).
    fn has(&self, c: &PlannedChunk, ids: &ChunkIds) -> bool {
        let mut buf = vec![0u8; c.loc.plain_len as usize];
        c.targets.iter().all(|&(entry, off)| {
            self.file(entry).is_ok_and(|f| f.read_exact_at(&mut buf, off).is_ok() && ids.id(&buf) == c.id)
        })
    }

    /// Symlinks last, so no file is ever written through one; modes last, so read-only
    /// files and directories could still be filled.
    fn finish(self) -> Result<()> {
        let DirSink { mut dirs, files, m } = self;
        drop(files);
        for e in m.entries.iter().filter(|e| e.kind == EntryKind::Symlink) {
            let path = dirs.parent_of(&e.path)?;
            if fs::symlink_metadata(&path).is_ok() {
                fs::remove_file(&path).map_err(|err| StoreError::io("replacing", &path, err))?;
            }
            std::os::unix::fs::symlink(e.target.as_deref().unwrap_or_default(), &path)
                .map_err(|err| StoreError::io("creating symlink", &path, err))?;
        }
        for e in m.entries.iter().rev().filter(|e| e.kind != EntryKind::Symlink) {
            let path = dirs.root.join(&e.path);
            fs::set_permissions(&path, fs::Permissions::from_mode(e.mode))
                .map_err(|err| StoreError::io("setting mode of", &path, err))?;
        }
        Ok(())
    }
}

/// Creates the file at `path` (new, or when `resume`ing perhaps there already, never through
/// a symlink) at its final `size`, and closes it.
fn create_file(path: &Path, size: u64, resume: bool) -> Result<()> {
    let mut o = OpenOptions::new();
    o.write(true).custom_flags(libc::O_NOFOLLOW);
    if resume {
        o.create(true);
    } else {
        o.create_new(true);
    }
    let f = o.open(path).map_err(|err| StoreError::io("creating", path, err))?;
    f.set_len(size).map_err(|err| StoreError::io("sizing", path, err))
}

/// Directories below a restore root, each checked (or made) once: a path component that
/// exists as anything but a real directory is refused, never followed.
struct Dirs {
    root: PathBuf,
    checked: HashSet<String>,
}

impl Dirs {
    fn new(root: &Path) -> Dirs {
        Dirs { root: root.to_path_buf(), checked: HashSet::new() }
    }

    /// Makes sure `rel` and each of its parents is a real directory, creating what is missing.
    fn make(&mut self, rel: &str) -> Result<()> {
        let ends = rel.match_indices('/').map(|(i, _)| i).chain([rel.len()]);
        for end in ends {
            let prefix = &rel[..end];
            if self.checked.contains(prefix) {
                continue;
            }
            let path = self.root.join(prefix);
            match fs::symlink_metadata(&path) {
                Ok(md) if md.file_type().is_dir() => {}
                Ok(_) => {
                    return Err(StoreError::Path {
                        path,
                        why: "not a directory; a restore never writes through it".into(),
                    })
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    fs::create_dir(&path).map_err(|err| StoreError::io("creating", &path, err))?
                }
                Err(e) => return Err(StoreError::io("checking", &path, e)),
            }
            self.checked.insert(prefix.to_string());
        }
        Ok(())
    }

    /// The path of entry `rel`, once its parent directories are checked (or made).
    fn parent_of(&mut self, rel: &str) -> Result<PathBuf> {
        if let Some((parent, _)) = rel.rsplit_once('/') {
            self.make(parent)?;
        }
        Ok(self.root.join(rel))
    }
}

/// Restores image `id` (manifest `m`) into `dest`, which must not exist or be an empty
/// directory, holding at most about `memory_budget` bytes in flight.
pub fn restore_to_dir(
    store: &IndexedStore,
    id: &ObjectId,
    m: &Manifest,
    dest: &Path,
    budget: Budget,
    progress: &dyn Progress,
) -> Result<RestoreReport> {
    restore_to_dir_seeded(store, id, m, dest, budget, None, progress)
}

/// [`restore_to_dir`], copying the chunks `seed` holds from there instead of fetching them.
pub fn restore_to_dir_seeded(
    store: &IndexedStore,
    id: &ObjectId,
    m: &Manifest,
    dest: &Path,
    budget: Budget,
    seed: Option<&Seed>,
    progress: &dyn Progress,
) -> Result<RestoreReport> {
    let started = std::time::Instant::now();
    check_destination(dest)?;
    let mut plan = plan::plan(store, m, budget.max_read())?;
    let staging = staging_path(dest)?;
    let resume = resumable(&staging, id, m);
    if !resume {
        start_staging(&staging, id)?;
    }
    let result = (|| {
        let sink = DirSink::open(&staging, m, resume)?;
        let ids = store.chunk_ids();
        let before = plan.chunk_count();
        if resume {
            plan.retain_missing(|c| sink.has(c, &ids));
        }
        let resumed = before - plan.chunk_count();
        let mut seeded = (0, 0);
        if let Some(seed) = seed {
            let (chunks, bytes) = (plan.chunk_count(), plan.plain_bytes());
            plan.retain_missing(|c| seed.copy(c, &ids, |t, data| sink.write_at(t, data)));
            seeded = (chunks - plan.chunk_count(), bytes - plan.plain_bytes());
        }
        engine::run_seeded(store, &plan, &sink, seed, progress)?;
        sink.finish()?;
        fs::remove_file(staging.join(MARKER)).map_err(|e| StoreError::io("removing", staging.join(MARKER), e))?;
        let mode = 0o777 & !umask();
        fs::set_permissions(&staging, fs::Permissions::from_mode(mode))
            .map_err(|e| StoreError::io("setting mode of", &staging, e))?;
        publish(&staging, dest)?;
        Ok((resumed, seeded))
    })();
    let (resumed_chunks, (seeded_chunks, seeded_bytes)) = match result {
        Ok(n) => n,
        Err(e) if keep_for_resume(&e) => return Err(with_resume_note(e, &staging)),
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    Ok(RestoreReport {
        destination: dest.display().to_string(),
        entries: m.entries.len(),
        logical_bytes: m.logical_size(),
        fetched_bytes: plan.fetch_bytes(),
        reads: plan.reads.len(),
        resumed_chunks,
        seeded_chunks,
        seeded_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Only failures that may pass (the backend unreachable, an interrupted transfer, a timeout,
/// memory short for a moment) keep the partial restore for a retry. Damage will not heal, a
/// full disk needs the space back, and other file-system errors (a name too long, an entry
/// that exists, a permission refused) would fail the same way again.
fn keep_for_resume(e: &StoreError) -> bool {
    match e {
        StoreError::Backend { .. } | StoreError::Unavailable { .. } => true,
        StoreError::Io { source, .. } => {
            matches!(source.kind(), ErrorKind::Interrupted | ErrorKind::TimedOut | ErrorKind::OutOfMemory)
        }
        _ => false,
    }
}

/// `e`, of the same kind, saying where the partial restore was kept.
fn with_resume_note(e: StoreError, staging: &Path) -> StoreError {
    let note = format!(" (the partial restore is kept in {}: run the same restore again to resume)", staging.display());
    match e {
        StoreError::Backend { action, key, message } => StoreError::Backend { action, key, message: message + &note },
        StoreError::Unavailable { action, key, message, reached } => {
            StoreError::Unavailable { action, key, message: message + &note, reached }
        }
        StoreError::Io { action, path, source } => {
            StoreError::Io { action, path, source: std::io::Error::new(source.kind(), format!("{source}{note}")) }
        }
        other => other,
    }
}

/// Whether `staging` holds an interrupted restore of `id` that is safe to resume: a private
/// directory of this user holding only the marker and entries of `m` with their kinds, owned
/// by this user, writable, files with one link and no set-id bits the image does not give
/// them. Anything else (planted by another user, left by something other than gstore) is not
/// resumed.
fn resumable(staging: &Path, id: &ObjectId, m: &Manifest) -> bool {
    let uid = unsafe { libc::geteuid() };
    let ours = |md: &fs::Metadata| md.uid() == uid;
    let Ok(md) = fs::symlink_metadata(staging) else { return false };
    if !md.file_type().is_dir() || !ours(&md) || md.mode() & 0o777 != 0o700 {
        return false;
    }
    let marker = staging.join(MARKER);
    match fs::symlink_metadata(&marker) {
        Ok(md) if md.file_type().is_file() && ours(&md) && md.nlink() == 1 => {}
        _ => return false,
    }
    if !fs::read_to_string(&marker).is_ok_and(|text| text.trim() == id.to_hex()) {
        return false;
    }
    let expected: HashMap<&str, (EntryKind, u32)> =
        m.entries.iter().map(|e| (e.path.as_str(), (e.kind, e.mode))).collect();
    let mut todo = vec![(staging.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { return false };
        for item in rd {
            let Ok(item) = item else { return false };
            let Some(name) = item.file_name().to_str().map(str::to_string) else { return false };
            let rel = format!("{prefix}{name}");
            if rel == MARKER {
                continue;
            }
            let Ok(md) = item.metadata() else { return false };
            let Some(&(kind, mode)) = expected.get(rel.as_str()) else { return false };
            let ft = md.file_type();
            let fits = ours(&md)
                && match kind {
                    EntryKind::Dir => ft.is_dir() && md.mode() & 0o700 == 0o700,
                    EntryKind::File => {
                        ft.is_file() && md.nlink() == 1 && md.mode() & 0o200 != 0 && md.mode() & !mode & 0o7000 == 0
                    }
                    EntryKind::Symlink => ft.is_symlink(),
                };
            if !fits {
                return false;
            }
            if kind == EntryKind::Dir {
                todo.push((item.path(), format!("{rel}/")));
            }
        }
    }
    true
}

/// Replaces whatever is at `staging` (a stale or untrusted staging directory) with a new,
/// private one holding the marker for `id`.
fn start_staging(staging: &Path, id: &ObjectId) -> Result<()> {
    match fs::symlink_metadata(staging) {
        Ok(md) if md.file_type().is_dir() => fs::remove_dir_all(staging),
        Ok(_) => fs::remove_file(staging),
        Err(_) => Ok(()),
    }
    .map_err(|e| StoreError::io("removing stale staging directory", staging, e))?;
    fs::DirBuilder::new().mode(0o700).create(staging).map_err(|e| StoreError::io("creating", staging, e))?;
    let marker = staging.join(MARKER);
    fs::write(&marker, id.to_hex()).map_err(|e| StoreError::io("writing", marker, e))
}

/// The process's file-mode creation mask (from /proc; 022 when it cannot be read).
fn umask() -> u32 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Umask:").map(|v| v.trim().to_string())))
        .and_then(|v| u32::from_str_radix(&v, 8).ok())
        .unwrap_or(0o022)
}

fn check_destination(dest: &Path) -> Result<()> {
    match fs::symlink_metadata(dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("checking destination", dest, e)),
        Ok(md) if !md.is_dir() => Err(StoreError::Path {
            path: dest.to_path_buf(),
            why: "the destination exists and is not a directory".into(),
        }),
        Ok(_) => {
            let mut rd = fs::read_dir(dest).map_err(|e| StoreError::io("reading destination", dest, e))?;
            if rd.next().is_some() {
                Err(StoreError::Path {
                    path: dest.to_path_buf(),
                    why: "the destination is not empty; restore into a new or empty directory".into(),
                })
            } else {
                Ok(())
            }
        }
    }
}

fn staging_path(dest: &Path) -> Result<PathBuf> {
    let name = dest.file_name().ok_or_else(|| StoreError::Path {
        path: dest.to_path_buf(),
        why: "the destination names no directory of its own (like . or ..): a restore builds the image \
                  beside its destination and renames it into place, so give a new directory's name, e.g. --to \
                  ./restored"
            .into(),
    })?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(|e| StoreError::io("creating", &parent, e))?;
    Ok(parent.join(format!(".{}.gstore-partial", name.to_string_lossy())))
}

fn publish(staging: &Path, dest: &Path) -> Result<()> {
    if dest.exists() {
        fs::remove_dir(dest).map_err(|e| StoreError::io("replacing empty destination", dest, e))?;
    }
    fs::rename(staging, dest).map_err(|e| StoreError::io("moving restored image into place at", dest, e))
}
