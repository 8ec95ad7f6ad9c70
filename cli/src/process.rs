//! Process checkpoints: `gstore checkpoint --pid`, `gstore restore --run`.

use crate::args::CriuArgs;
use crate::output::Output;
use crate::stores::{open_indexed, open_to_read};
use anyhow::Result;
use gstore_capture as capture;
use gstore_progress::Bars;
use gstore_store::{StoreLocation, TagRef};
use indicatif::HumanBytes;

/// `gstore checkpoint`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn checkpoint(
    location: &StoreLocation,
    pid: u32,
    tag: &str,
    leave_running: bool,
    lock_timeout: u32,
    criu: &CriuArgs,
    staging: Option<std::path::PathBuf>,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let tag = TagRef::parse_new(tag)?;
    // The store lock is taken before the process is frozen, so it never waits frozen.
    let store = open_indexed(location)?;
    let r = capture::checkpoint(&store, pid, &tag, leave_running, lock_timeout, criu_choice(criu), staging, bars)?;
    out.emit(&r, || {
            let t = &r.capture.timings;
            let opt = |v: Option<f64>| v.map(|s| format!("{s:.2} s")).unwrap_or_else(|| "-".into());
            let gpu_pids = &r.capture.gpu_pids;
            let others = if gpu_pids.len() > 1 {
                let pids: Vec<String> = gpu_pids.iter().map(u32::to_string).collect();
                format!(", GPU state of processes {}", pids.join(", "))
            } else {
                String::new()
            };
            let weights = r.weights.as_ref().map_or_else(String::new, |w| {
                let back = w.refill_s.map(|s| format!(", refilled in {s:.2} s")).unwrap_or_default();
                format!("\nweights: {} left out of the image (from {} process(es)), released in {:.2} s{back}", HumanBytes(w.bytes), w.processes, w.release_s)
            });
            format!(
                "checkpointed pid {pid} ({}{others}) as {} ({}, {} new)\nphases: GPU lock {}, GPU checkpoint {}, criu dump {:.2} s, GPU resume {}, store {:.2} s, total {:.2} s{}{weights}\nmanifest {}",
                r.capture.image_kind,
                r.push.tag,
                HumanBytes(r.push.logical_bytes),
                HumanBytes(r.push.new_stored_bytes),
                opt(t.lock_s),
                opt(t.gpu_checkpoint_s),
                t.criu_dump_s,
                opt(t.gpu_resume_s),
                r.push.seconds,
                r.total_s,
                r.paused_s.map(|p| format!(" (process paused {p:.2} s)")).unwrap_or_default(),
                r.push.manifest
            )
        })
}

/// `gstore restore --run`.
pub(crate) fn restore_run(
    location: &StoreLocation,
    image: &str,
    criu: &CriuArgs,
    to: Option<std::path::PathBuf>,
    opts: capture::RunOptions,
    out: &Output,
    bars: &Bars,
) -> Result<()> {
    let store = open_to_read(location)?;
    let r = capture::run(&store, image, criu_choice(criu), to, opts, bars)?;
    out.emit(&r, || {
            let t = &r.restore.timings;
            let mut text = format!("restored {image} as pid {} ({} memory)\nphases: setup {:.2} s, write image {:.2} s, wait for pid {:.2} s, criu restore {:.2} s", r.pid, r.mode, r.setup_s, r.materialize_s, t.pid_wait_s, t.criu_restore_s);
            if let (Some(a), Some(b)) = (t.gpu_restore_s, t.gpu_unlock_s) {
                text.push_str(&format!(", GPU restore {a:.2} s, unlock {b:.2} s"));
            }
            text.push_str(&format!(", total {:.2} s", r.total_s));
            if let Some(f) = &r.fill {
                text.push_str(&format!(
                    "\nmemory: served from the store while the process ran, complete {:.2} s after criu restore ({} faults served)",
                    f.fill_s, f.faults
                ));
            }
            if let Some(p) = &r.profile {
                text.push_str(&format!("; {p}"));
            }
            if let Some(s) = r.weights_refill_s {
                text.push_str(&format!("\nweights: refilled from the store by the process, done {s:.2} s after its GPU state was back"));
            }
            if let Some(why) = &r.eager_reason {
                text.push_str(&format!("\nrestored eagerly: {why}"));
            }
            text
        })
}

/// How CRIU is called, from the command line's CRIU options.
pub(crate) fn criu_choice(a: &CriuArgs) -> capture::CriuChoice<'_> {
    capture::CriuChoice { path: a.criu.as_deref(), extra: a.criu_opts.clone(), shell_job: a.shell_job }
}
