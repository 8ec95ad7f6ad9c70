//! Deduplication: content-defined chunking, similarity sketches of page-image chunks, and the
//! deltas a push stores against similar chunks.

pub mod chunker;
pub(crate) mod deltas;
pub mod similar;
