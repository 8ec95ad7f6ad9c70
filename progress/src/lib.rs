//! Terminal progress bars (indicatif) for the library's progress reports, shared by the CLI
//! and the Python package; hidden when stderr is not a terminal, or when the caller asks for
//! quiet (`--json`, `--quiet`, `progress=False`).

use gstore_store::progress::{Progress, Unit};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;

/// A progress bar that is replaced at each phase.
pub struct Bars {
    enabled: bool,
    bar: Mutex<ProgressBar>,
}

impl Bars {
    /// Bars drawn on stderr when `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Bars {
        Bars { enabled: wanted && std::io::stderr().is_terminal(), bar: Mutex::new(ProgressBar::hidden()) }
    }
}

impl Progress for Bars {
    fn start(&self, what: &str, total: u64, unit: Unit) {
        if !self.enabled {
            return;
        }
        // A total of 0 is not known in advance (a streamed push): a count and a rate, no bar.
        let known = total > 0;
        let bar = ProgressBar::with_draw_target(known.then_some(total), ProgressDrawTarget::stderr());
        let template = match (unit, known) {
            (Unit::Bytes, true) => "{msg:>10} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            (Unit::Bytes, false) => "{msg:>10} {spinner} {bytes} {bytes_per_sec}",
            (Unit::Items, true) => "{msg:>10} [{bar:40}] {pos}/{len} eta {eta}",
            (Unit::Items, false) => "{msg:>10} {spinner} {pos}",
        };
        bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
        bar.set_message(what.to_string());
        *self.bar.lock().unwrap() = bar;
    }

    fn advance(&self, n: u64) {
        self.bar.lock().unwrap().inc(n);
    }

    fn finish(&self) {
        self.bar.lock().unwrap().finish_and_clear();
    }
}
