//! gstore's restore engine: plans which pack ranges an image needs, fetches them in parallel,
//! verifies every chunk against its BLAKE3 id, decodes it and writes it to a sink.

pub mod dir;
pub mod plan;

pub use dir::{restore_to_dir, RestoreReport};
