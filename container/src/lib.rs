//! Containers and their checkpoint archives in the store.
//!
//! - [`archive`]: a container checkpoint archive (what `podman container checkpoint --export`
//!   and the kubelet's checkpoint API write: a tar, plain, gzip or zstd) pushed entry by entry
//!   as it is read, so CRIU's page images get page-level deltas, and an image written back as
//!   a plain tar that the runtimes import.
//! - [`podman`]: the container runtime, driven through its command line.
//! - [`checkpoint`] / [`restore`]: a container checkpointed through its runtime straight into
//!   the store (the archive streams through a FIFO, never landing on disk), and restored from
//!   it after checking that this machine can.

pub mod archive;
pub mod checkpoint;
mod error;
pub mod podman;
pub mod restore;

pub use error::{ContainerError, Result};

/// The `kind` an image of a container checkpoint records in its metadata.
pub const KIND: &str = "container-checkpoint";
