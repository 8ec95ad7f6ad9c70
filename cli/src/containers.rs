//! The container commands: `checkpoint --container`, `restore --container`, `restore
//! --archive`, the push of a checkpoint archive, and `watch` (the node agent).

use crate::args::RuntimeArg;
use crate::output::{plural, push_summary, Output};
use crate::stores::{open_image, open_indexed};
use anyhow::{Context, Result};
use gstore_container::{archive, checkpoint, podman::Podman, restore, runc, watch, ContainerError, Runtime};
use gstore_progress::Bars;
use gstore_store::format::meta::ImageMeta;
use gstore_store::{StoreLocation, TagRef};
use indicatif::HumanBytes;
use std::collections::BTreeMap;
use std::path::Path;

/// `gstore push ARCHIVE` / `gstore push -`: the archive's entries, read as they come.
pub fn push_archive(
    location: &StoreLocation,
    path: &Path,
    tag: &TagRef,
    meta: ImageMeta,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let store = open_indexed(location)?;
    let (r, info) = if path.as_os_str() == "-" {
        archive::push_archive(&store, std::io::stdin().lock(), "the archive on standard input", tag, meta, bars)
    } else {
        let file = std::fs::File::open(path).with_context(|| format!("cannot push {}", path.display()))?;
        let what = path.display().to_string();
        archive::push_archive(&store, std::io::BufReader::with_capacity(1 << 20, file), &what, tag, meta, bars)
    }
    .with_context(|| {
        format!(
            "push of {} failed",
            if path.as_os_str() == "-" { "standard input".into() } else { path.display().to_string() }
        )
    })?;
    #[derive(serde::Serialize)]
    struct Report<'a> {
        #[serde(flatten)]
        push: &'a gstore_store::commands::push::PushReport,
        archive: &'a archive::ArchiveInfo,
    }
    out.emit(&Report { push: &r, archive: &info }, || {
        let kind = if info.checkpoint { "container checkpoint archive" } else { "archive" };
        let source = if path.as_os_str() == "-" { "from standard input".into() } else { path.display().to_string() };
        push_summary("pushed", &format!("{kind} {source}"), &r)
    })
}

/// How a container command reaches its runtime.
pub struct How<'a> {
    /// `--runtime`, if given.
    pub runtime: Option<RuntimeArg>,
    /// `--lock-timeout` (ms) of the GPU lock (runc).
    pub lock_timeout: u32,
    /// `--criu`, if given.
    pub criu: Option<&'a Path>,
}

fn runtime(arg: Option<RuntimeArg>) -> Option<Runtime> {
    arg.map(|r| match r {
        RuntimeArg::Podman => Runtime::Podman,
        RuntimeArg::Runc => Runtime::Runc,
    })
}

/// Seconds for a summary, or "-" for a phase that did not run.
fn secs(v: Option<f64>) -> String {
    v.map(|s| format!("{s:.2} s")).unwrap_or_else(|| "-".into())
}

/// `gstore checkpoint --container NAME [--runtime podman|runc]`.
pub fn checkpoint(
    location: &StoreLocation,
    name: &str,
    tag: &str,
    leave_running: bool,
    how: How,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let tag = TagRef::parse_new(tag)?;
    if Runtime::for_checkpoint(runtime(how.runtime), name) == Runtime::Runc {
        let runc = runc::Runc::find(how.criu)?;
        // The store lock is taken before the container is frozen, so it never waits frozen.
        let store = open_indexed(location)?;
        let r = runc::checkpoint(&store, &runc, name, &tag, leave_running, how.lock_timeout, bars)?;
        return out.emit(&r, || {
            let t = &r.timings;
            let gpu = if r.gpu_pids.is_empty() {
                String::new()
            } else {
                let pids: Vec<String> = r.gpu_pids.iter().map(u32::to_string).collect();
                format!(", GPU state of processes {}", pids.join(", "))
            };
            format!(
                "checkpointed container {} through runc{gpu} as {} ({}, {} logical, {} new); the container {}\nphases: GPU lock {}, GPU checkpoint {}, runc checkpoint {:.2} s, GPU resume {}, store {:.2} s, total {:.2} s\nmanifest {}",
                r.container,
                r.push.tag,
                plural(r.push.entries as u64, "entry", "entries"),
                HumanBytes(r.push.logical_bytes),
                HumanBytes(r.push.new_stored_bytes),
                if r.left_running { "runs on" } else { "is stopped (runc deleted it)" },
                secs(t.lock_s),
                secs(t.gpu_checkpoint_s),
                t.criu_dump_s,
                secs(t.gpu_resume_s),
                r.push.seconds,
                r.total_s,
                r.push.manifest
            )
        });
    }
    let podman = Podman::find(how.criu)?;
    // The store lock is taken before the container is frozen, so it never waits frozen.
    let store = open_indexed(location)?;
    let r = checkpoint::checkpoint(&store, &podman, name, &tag, leave_running, bars)?;
    out.emit(&r, || {
        format!(
            "checkpointed container {} ({}) as {} ({}, {} logical, {} new), {} in all; the container {}\nmanifest {}",
            r.container,
            r.image,
            r.push.tag,
            plural(r.push.entries as u64, "entry", "entries"),
            HumanBytes(r.push.logical_bytes),
            HumanBytes(r.push.new_stored_bytes),
            format_args!("{:.2} s", r.total_s),
            if r.left_running { "runs on" } else { "is stopped (podman keeps it, exited)" },
            r.push.manifest
        )
    })
}

/// `gstore restore IMAGE --container [--name NAME] [--runtime podman|runc]`: through the
/// runtime the image was checkpointed through.
pub fn restore(
    location: &StoreLocation,
    image: &str,
    name: Option<&str>,
    how: How,
    eager: bool,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let (store, id, m) = open_image(location, image)?;
    let made_by = Runtime::of_image(&m);
    if let Some(wanted) = runtime(how.runtime).filter(|&w| w != made_by) {
        return Err(ContainerError::Incompatible {
            image: image.to_string(),
            why: format!(
                "it was checkpointed through {}, and is restored through it (not {}): leave out --runtime",
                made_by.name(),
                wanted.name()
            ),
        }
        .into());
    }
    if made_by == Runtime::Runc {
        let runc = runc::Runc::find(how.criu)?;
        let r = runc::restore(&store, &runc, image, &id, &m, runc::RestoreAs { name, eager }, bars)?;
        return out.emit(&r, || {
            let gpu = if r.gpu_pids.is_empty() {
                String::new()
            } else {
                format!(", GPU restore {}, GPU unlock {}", secs(r.gpu_restore_s), secs(r.gpu_unlock_s))
            };
            let fill = match &r.fill {
                Some(f) => format!(
                    ", memory filled from the store {:.2} s after ({} lazy, {} faults; {})",
                    f.fill_s,
                    HumanBytes(f.lazy_bytes),
                    f.faults,
                    r.profile.as_deref().unwrap_or_default()
                ),
                None => String::new(),
            };
            let why = r.eager_reason.as_deref().map(|w| format!(" (eager: {w})")).unwrap_or_default();
            format!(
                "restored {image} as runc container {} (pid {}), {}{why}; phases: images {} in {:.2} s, runc restore {:.2} s{gpu}{fill}, total {:.2} s",
                r.container,
                r.pid,
                r.mode,
                HumanBytes(r.image_bytes),
                r.write_s,
                r.runtime_s,
                r.total_s
            )
        });
    }
    let podman = Podman::find(how.criu)?;
    let r = restore::restore(&store, &podman, image, &m, name, bars)?;
    out.emit(&r, || {
        format!(
            "restored {image} as container {} ({}); phases: archive {} in {:.2} s, podman restore {:.2} s, total {:.2} s",
            r.container,
            &r.id[..r.id.len().min(12)],
            HumanBytes(r.archive_bytes),
            r.archive_s,
            r.runtime_s,
            r.total_s
        )
    })
}

/// `gstore restore IMAGE --archive FILE|-`.
pub fn write_archive(location: &StoreLocation, image: &str, file: &Path, out: &Output, bars: &Bars) -> Result<()> {
    let (store, _, m) = open_image(location, image)?;
    let to_stdout = file.as_os_str() == "-";
    let r = if to_stdout {
        let stdout = std::io::stdout().lock();
        archive::write_archive(&store, &m, std::io::BufWriter::with_capacity(1 << 20, stdout), "standard output", bars)?
    } else {
        // Written beside its destination and renamed into place: a failed write leaves no
        // archive that looks whole.
        let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tmp = tempfile::Builder::new()
            .prefix(".gstore-archive-")
            .tempfile_in(dir)
            .with_context(|| format!("cannot write {}", file.display()))?;
        let r = archive::write_archive(
            &store,
            &m,
            std::io::BufWriter::with_capacity(1 << 20, tmp.as_file()),
            &file.display().to_string(),
            bars,
        )?;
        tmp.as_file().sync_all().with_context(|| format!("cannot write {}", file.display()))?;
        tmp.persist(file).with_context(|| format!("cannot write {}", file.display()))?;
        r
    };
    let text = || {
        format!(
            "wrote {image} to {} ({}, {} of tar)",
            file.display(),
            plural(r.entries as u64, "entry", "entries"),
            HumanBytes(r.tar_bytes)
        )
    };
    if to_stdout {
        // Standard output holds the archive: the summary goes to standard error.
        eprintln!("gstore: {}", text());
        Ok(())
    } else {
        out.emit(&r, text)
    }
}

/// What `gstore watch` has done since it started, for its metrics.
#[derive(Default)]
struct Watched {
    stored: u64,
    already: u64,
    failed: u64,
    bytes: u64,
    stored_bytes: u64,
    last_stored_s: u64,
}

impl Watched {
    fn count(&mut self, t: &watch::Taken) {
        match t.outcome {
            "stored" => {
                self.stored += 1;
                self.bytes += t.bytes;
                self.stored_bytes += t.stored_bytes;
                self.last_stored_s =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
            }
            "already stored" => self.already += 1,
            _ => self.failed += 1,
        }
    }

    /// The Prometheus text of the counters.
    fn metrics(&self) -> String {
        format!(
            "# HELP gstore_watch_archives_total Checkpoint archives taken in, by outcome.\n\
             # TYPE gstore_watch_archives_total counter\n\
             gstore_watch_archives_total{{outcome=\"stored\"}} {}\n\
             gstore_watch_archives_total{{outcome=\"already_stored\"}} {}\n\
             gstore_watch_archives_total{{outcome=\"failed\"}} {}\n\
             # HELP gstore_watch_archive_bytes_total Bytes of the archives stored.\n\
             # TYPE gstore_watch_archive_bytes_total counter\n\
             gstore_watch_archive_bytes_total {}\n\
             # HELP gstore_watch_stored_bytes_total Bytes the store gained for them.\n\
             # TYPE gstore_watch_stored_bytes_total counter\n\
             gstore_watch_stored_bytes_total {}\n\
             # HELP gstore_watch_last_stored_timestamp_seconds When an archive was last stored.\n\
             # TYPE gstore_watch_last_stored_timestamp_seconds gauge\n\
             gstore_watch_last_stored_timestamp_seconds {}\n",
            self.stored, self.already, self.failed, self.bytes, self.stored_bytes, self.last_stored_s
        )
    }
}

/// `gstore watch DIR`: every archive that lands in the directory, stored once
/// ([`watch::take_in`]); one line each. An archive that failed is tried again once it changes.
pub fn watch(
    location: &StoreLocation,
    opts: &watch::Options,
    once: bool,
    interval: std::time::Duration,
    metrics: Option<&Path>,
    out: &Output,
) -> Result<()> {
    let mut failed: BTreeMap<std::path::PathBuf, (u64, u128)> = BTreeMap::new();
    let mut watched = Watched::default();
    loop {
        let found = watch::scan(opts).with_context(|| format!("cannot read {}", opts.dir.display()))?;
        let mut failed_now = false;
        for f in found {
            if failed.get(&f.path) == Some(&(f.size, f.modified_ns)) {
                continue;
            }
            // Opened for each archive: other gstore commands on the node run in between.
            let taken = watch::take_in(&open_indexed(location)?, &f, opts);
            watched.count(&taken);
            if taken.outcome == "failed" {
                failed_now = true;
                failed.insert(f.path.clone(), (f.size, f.modified_ns));
            } else {
                failed.remove(&f.path);
            }
            if let Some(path) = metrics {
                watch::write_whole(path, &watched.metrics())
                    .with_context(|| format!("cannot write the metrics to {}", path.display()))?;
            }
            if out.json {
                out.emit_line(&taken)?;
            } else {
                out.emit(&taken, || watch_text(&taken))?;
            }
        }
        if once {
            if failed_now {
                return Err(anyhow::anyhow!("some archives could not be stored (above)"));
            }
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

fn watch_text(t: &watch::Taken) -> String {
    let removed = if t.removed { ", removed" } else { "" };
    match (t.outcome, &t.error) {
        ("failed", Some(e)) => format!("{}: not stored: {e}", t.archive),
        (outcome, Some(e)) => format!("{}: {outcome} as {}, but {e}", t.archive, t.tag),
        (outcome, None) => format!(
            "{}: {outcome} as {} ({}, {} new, {:.1} s{removed})",
            t.archive,
            t.tag,
            HumanBytes(t.bytes),
            HumanBytes(t.stored_bytes),
            t.seconds
        ),
    }
}
