//! How commands print: a human summary, or JSON on stdout with `--json`; and the small
//! formatters every command's summary uses.

use anyhow::Result;
use gstore_store::commands::push;
use indicatif::HumanBytes;
use serde::Serialize;
use std::io::Write;

/// `n` and the word for it: "1 pack", "2 packs".
pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A rate in the binary units sizes are shown in: "812.40 MiB/s".
pub(crate) fn rate(bytes: u64, seconds: f64) -> String {
    format!("{}/s", HumanBytes((bytes as f64 / seconds.max(1e-9)) as u64))
}

/// Where results go: human text or JSON on stdout.
pub(crate) struct Output {
    /// Print JSON instead of the human summary.
    pub(crate) json: bool,
}

/// Stdout was closed by its reader (`gstore ls | head -1`): not a failure, nothing to report.
#[derive(Debug, thiserror::Error)]
#[error("stdout closed by its reader")]
pub struct StdoutClosed;

/// Set once a command has printed its result on stdout (a failing `verify --json` has printed
/// its report; its error then goes to stderr only, so stdout holds one JSON value).
static EMITTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the command printed its result on stdout.
pub fn emitted() -> bool {
    EMITTED.load(std::sync::atomic::Ordering::Relaxed)
}

impl Output {
    pub(crate) fn emit<T: Serialize>(&self, value: &T, text: impl FnOnce() -> String) -> Result<()> {
        let out = if self.json { serde_json::to_string_pretty(value)? } else { text() };
        Self::write(out)
    }

    /// Writes `value` as one line of JSON, for a reader waiting on a long-running command's
    /// stdout (`serve --json`'s ready line).
    pub(crate) fn emit_line<T: Serialize>(&self, value: &T) -> Result<()> {
        Self::write(serde_json::to_string(value)?)
    }

    fn write(out: String) -> Result<()> {
        EMITTED.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, "{out}").and_then(|()| stdout.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
            other => Ok(other?),
        }
    }
}

/// A push's summary: "pushed WHAT as TAG (entries, logical, new in packs, rate)" and its manifest.
pub(crate) fn push_summary(verb: &str, what: &str, r: &push::PushReport) -> String {
    format!(
        "{verb} {what} as {} ({}, {} logical, {} new in {}, {})\nmanifest {}",
        r.tag,
        plural(r.entries as u64, "entry", "entries"),
        HumanBytes(r.logical_bytes),
        HumanBytes(r.new_stored_bytes),
        plural(r.packs, "pack", "packs"),
        rate(r.logical_bytes, r.seconds),
        r.manifest
    )
}
