//! Deduplication: content-defined chunking and similarity sketches (`gstore-format`), and the
//! deltas a push stores against similar chunks.

pub use gstore_format::{chunker, similar};
pub(crate) mod deltas;
