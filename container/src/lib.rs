//! Containers and their checkpoint archives in the store.
//!
//! - [`archive`]: a container checkpoint archive (what `podman container checkpoint --export`
//!   and the kubelet's checkpoint API write: a tar, plain, gzip or zstd) pushed entry by entry
//!   as it is read, so CRIU's page images get page-level deltas, and an image written back as
//!   a plain tar that the runtimes import.
//! - [`podman`]: the container runtime, driven through its command line.
//! - [`runc`]: containers run by runc itself (where there is no podman, or on request), GPU
//!   processes included: their CUDA state goes through the driver's checkpoint API around
//!   runc's dump and restore.
//! - [`checkpoint`] / [`restore`]: a container checkpointed through its runtime straight into
//!   the store (the archive streams through a FIFO, never landing on disk), and restored from
//!   it after checking that this machine can.

pub mod archive;
pub mod checkpoint;
mod error;
mod follow;
pub mod podman;
pub mod restore;
pub mod runc;
pub mod watch;

pub use error::{ContainerError, Result};

/// The container runtimes gstore drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// podman (its checkpoint archive streams into the store).
    Podman,
    /// runc itself (its CRIU images are staged, then pushed).
    Runc,
}

impl Runtime {
    /// "podman" or "runc".
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Podman => "podman",
            Runtime::Runc => "runc",
        }
    }

    /// The runtime to checkpoint container `name` through: `wanted` if given; else podman where
    /// it is installed and knows the container, else runc where it knows it; else the one
    /// installed (podman first), whose error then says what is missing.
    pub fn for_checkpoint(wanted: Option<Runtime>, name: &str) -> Runtime {
        if let Some(r) = wanted {
            return r;
        }
        if podman::Podman::installed() && podman::Podman::knows(name) {
            Runtime::Podman
        } else if runc::Runc::knows(name) || (!podman::Podman::installed() && runc::Runc::installed()) {
            Runtime::Runc
        } else {
            Runtime::Podman
        }
    }

    /// The runtime image `m` was checkpointed through (podman unless it records runc).
    pub fn of_image(m: &gstore_store::format::manifest::Manifest) -> Runtime {
        if runc::is_runc_image(m) {
            Runtime::Runc
        } else {
            Runtime::Podman
        }
    }
}
