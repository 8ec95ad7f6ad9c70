//! Process checkpoints as library calls, so that the `gstore` binary only parses and prints:
//!
//! - [`checkpoint`]: CRIU (and the CUDA checkpoint API for GPU processes) into a staging
//!   directory, pushed into the store; when the push fails after CRIU ended the process, the
//!   process is brought back from the staged image.
//! - [`run`]: a process image restored from the store and started, its memory served lazily
//!   from the store while it runs where the machine allows (else written out first).

mod checkpoint;
mod error;
mod run;
mod staging;

pub use checkpoint::{checkpoint, CheckpointReport, CriuChoice};
pub use error::{CaptureError, Result};
pub use run::{run, RunOptions, RunReport};
