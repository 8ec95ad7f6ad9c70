//! gstore's capture layer: checkpoint and restore of live processes, GPU state included.
//!
//! - [`cuda`]: the CUDA driver (libcuda) loaded at run time, with its process checkpoint API
//!   (driver >= 570); no CUDA toolkit is needed to build, and a machine without a driver gets a
//!   clear error instead.
//! - [`criu`]: finds CRIU >= 4.0 and runs `criu dump` / `criu restore`.
//! - [`checkpoint`]: the orchestration (GPU lock → GPU checkpoint → CRIU dump, and back) with
//!   rollback, plus the metadata to record with an image.
//! - [`images`]: reads the CRIU image files a page server needs (process tree, memory areas,
//!   page maps).
//! - [`compat`]: refuses, before touching anything, to restore an image on a machine that
//!   cannot take it.
//!
//! CPU-only processes go through CRIU alone. Nothing here depends on the store.

#![deny(missing_docs)]

pub mod checkpoint;
pub mod compat;
pub mod criu;
pub mod cuda;
pub mod error;
pub mod fifo;
pub mod gpumap;
pub mod images;
pub mod procfs;
#[cfg(test)]
mod testutil;

pub use checkpoint::{CaptureReport, CheckpointOptions, ImageKind, RestoreReport};
pub use compat::{check_compatible, ImageNeeds, MachineInfo};
pub use criu::Criu;
pub use cuda::{CudaDriver, GpuInfo, ProcessState};
pub use error::{CriuCause, GpuDumpError, Phase, Result};
pub use gpumap::GpuMap;
