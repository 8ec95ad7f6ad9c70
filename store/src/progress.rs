//! A small progress interface so the library can report long work without knowing how it is
//! shown (the CLI draws indicatif bars; tests and `--json` use [`Silent`]).

/// What a phase counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes (shown with binary prefixes and a rate).
    Bytes,
    /// Objects: packs, manifests, images (shown as counts).
    Items,
}

/// Receives progress of one long operation.
pub trait Progress: Sync {
    /// A phase begins: `what` is shown to the user, `total` is in `unit`s (0: not known in
    /// advance, as for a streamed push).
    fn start(&self, what: &str, total: u64, unit: Unit);
    /// `n` more units are done.
    fn advance(&self, n: u64);
    /// The phase ended.
    fn finish(&self);
}

/// Shows nothing.
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _: &str, _: u64, _: Unit) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}
