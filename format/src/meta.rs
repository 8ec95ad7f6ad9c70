//! The keys of an image's metadata (the manifest's `meta` object, docs/FORMAT.md), named here
//! for every crate above the store that writes or reads them. Values are JSON; the key's
//! comment says what each holds. The keys only process checkpoints have (`pid`, `gpus`,
//! `gpu_pids`, `cuda_driver_version`, `capture_timings`) are gpu-dump's, which writes them
//! from below the store (`gstore_gpu_dump::checkpoint::META_*`); the three it shares with
//! container checkpoints ([`KIND`], [`LEAVE_RUNNING`], [`CRIU_VERSION`]) are named in both,
//! and gpu-dump's tests hold them equal.

/// The image's kind: `gpu-process` or `cpu-process` (process checkpoints),
/// `container-checkpoint`, `oci-image` (an image the registry keeps as an OCI layout); none
/// for a plain tree of files.
pub const KIND: &str = "kind";
/// The tag this image was pushed on top of (`NAME:VERSION`): its chunks are the first
/// candidates for page-level deltas.
pub const PARENT: &str = "parent";
/// Whether the process (or container) kept running after the checkpoint.
pub const LEAVE_RUNNING: &str = "leave_running";
/// The CRIU version that dumped the image.
pub const CRIU_VERSION: &str = "criu_version";
/// The manifest ids (hex) of the images this image needs to be restored (a process image
/// whose weights are left out names the model image they come from); gc keeps them, their
/// chunks included, for as long as it keeps this image.
pub const USES: &str = "uses";
/// The registrations of the processes whose weights the image leaves out, a list
/// (`gstore_capture::cooperate`).
pub const RELEASED_WEIGHTS: &str = "released_weights";
/// A recorded access order: a JSON array of entry paths, most urgent first; entries it does
/// not name follow in manifest order.
pub const ACCESS_ORDER: &str = "access_order";
/// What a runc restore needs (bundle, rootfs).
pub const RUNC: &str = "runc";
/// The container runtime that checkpointed the container: `{"engine", "version"}`.
pub const RUNTIME: &str = "runtime";
/// The container a checkpoint is of (its id, name, image, as the runtime described it).
pub const CONTAINER: &str = "container";
/// The kernel release of the capturing machine.
pub const KERNEL: &str = "kernel";
/// The archive a node agent stored the image from: `{"name", "size", "modified_ns"}`.
pub const SOURCE_ARCHIVE: &str = "source_archive";
/// What a pushed checkpoint image's documents said (its config, as text, and its manifest's
/// annotations), or a layout image's manifest media type and digest (the registry).
pub const OCI: &str = "oci";
