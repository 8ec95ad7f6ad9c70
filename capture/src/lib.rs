//! Process checkpoints as library calls, so that the `gstore` binary only parses and prints:
//!
//! - [`checkpoint`]: CRIU (and the CUDA checkpoint API for GPU processes) streaming the image
//!   straight into the store; the process ends (without `--leave-running`) only once its image
//!   is stored, and runs on if storing fails. Through a staging directory on request.
//! - [`run`]: a process image restored from the store and started, its memory served lazily
//!   from the store while it runs where the machine allows (else written out first).
//! - [`cooperate`]: processes that keep their weights out of their images, asked to release
//!   them before a checkpoint and to refill them from the store after it.

mod checkpoint;
pub mod cooperate;
mod error;
mod run;
mod staging;
mod streamer;

pub use checkpoint::{checkpoint, CheckpointReport, CriuChoice};
pub use error::{CaptureError, Result};
pub use run::{run, RunOptions, RunReport};
