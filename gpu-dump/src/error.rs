//! The crate's error type: each variant says what failed and, where there is one, what to do.

use std::path::PathBuf;
use std::time::Duration;

/// Result with [`GpuDumpError`].
pub type Result<T, E = GpuDumpError> = std::result::Result<T, E>;

/// A step of a checkpoint or restore, named in errors so the user knows where it stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `cuCheckpointProcessLock`.
    GpuLock,
    /// `cuCheckpointProcessCheckpoint`.
    GpuCheckpoint,
    /// `criu dump`.
    CriuDump,
    /// Restore + unlock of the GPU state after a `--leave-running` dump.
    GpuResume,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::GpuLock => "GPU lock",
            Phase::GpuCheckpoint => "GPU checkpoint",
            Phase::CriuDump => "criu dump",
            Phase::GpuResume => "GPU resume after the dump",
        })
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum GpuDumpError {
    /// libcuda could not be loaded.
    #[error(
        "no CUDA driver (libcuda.so.1) found: {detail}; this machine cannot use NVIDIA GPUs \
         (loads into GPU memory and checkpoints of GPU processes need the driver; host loads and \
         CPU-only processes work without it)"
    )]
    NoCudaDriver {
        /// What the loader said for each library name tried.
        detail: String,
    },

    /// libcuda loaded but lacks a basic driver API symbol.
    #[error("{library} lacks {symbol}: {detail}; the NVIDIA driver install looks broken")]
    CudaSymbol {
        /// The library that was loaded.
        library: String,
        /// The missing symbol.
        symbol: &'static str,
        /// The loader's message.
        detail: String,
    },

    /// libcuda has no checkpoint API.
    #[error(
        "driver too old: needs >= 570 (CUDA 12.8) for the checkpoint API, but {library} lacks \
         {symbol}; upgrade the NVIDIA driver"
    )]
    DriverTooOld {
        /// The library that was loaded.
        library: String,
        /// The first missing checkpoint symbol.
        symbol: &'static str,
    },

    /// A CUDA driver call returned an error.
    #[error("{call}: {name} ({code}): {description}{hint}")]
    Cuda {
        /// The call and its target, e.g. `cuCheckpointProcessLock(pid 123)`.
        call: String,
        /// The `CUresult` code.
        code: i32,
        /// `cuGetErrorName`, e.g. `CUDA_ERROR_NOT_READY`.
        name: String,
        /// `cuGetErrorString`.
        description: String,
        /// Advice for well-known codes (starts with "; "), else empty.
        hint: &'static str,
    },

    /// An optional GPU library (nvCOMP) could not be loaded or failed a call.
    #[error("{library}: {detail}")]
    GpuLibrary {
        /// The library name or path.
        library: String,
        /// What went wrong.
        detail: String,
    },

    /// No CRIU binary was found.
    #[error(
        "CRIU not found (tried {tried}); install CRIU >= 4.0 with scripts/criu.sh, or name the \
         binary explicitly"
    )]
    CriuNotFound {
        /// The places looked at.
        tried: String,
    },

    /// The CRIU binary is older than 4.0.
    #[error(
        "{path} is CRIU {version}, but gstore needs CRIU >= 4.0: older releases cannot handle the \
         vDSO layout of kernels >= 6.13 (\"Unexpected rt vDSO area bounds\"); install 4.x with \
         scripts/criu.sh (builds it into /opt/criu/sbin/criu)"
    )]
    CriuTooOld {
        /// The binary.
        path: PathBuf,
        /// The version it reported.
        version: String,
    },

    /// `criu --version` did not print a version gstore understands.
    #[error("{path} --version printed no \"Version: X.Y\" line (got {output:?}); is it really CRIU?")]
    CriuVersion {
        /// The binary.
        path: PathBuf,
        /// What it printed.
        output: String,
    },

    /// The CRIU binary could not be started.
    #[error("could not run {path}: {source}")]
    CriuSpawn {
        /// The binary.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },

    /// `criu dump` or `criu restore` exited with an error.
    #[error("criu {action} exited with {status}{cause}\n{details}")]
    CriuFailed {
        /// `dump` or `restore`.
        action: &'static str,
        /// The exit status.
        status: String,
        /// What CRIU's log or output says went wrong, where it is recognised.
        cause: CriuCause,
        /// CRIU's stderr and the last lines of its log, each labelled.
        details: String,
    },

    /// A load needs more device memory than the device has free.
    #[error(
        "the image's files need {needed} bytes of device memory and cuda:{device} has {free} free; nothing was loaded"
    )]
    DeviceFull {
        /// The device's ordinal.
        device: u32,
        /// Bytes the load needs.
        needed: u64,
        /// Bytes free on the device.
        free: u64,
    },

    /// A pid the restore needs is still taken.
    #[error(
        "pid {pid} is still in use by another process after waiting {timeout:?}; CRIU restores a \
         process under its original pid, so stop that process (or wait for it to be reaped) first"
    )]
    PidInUse {
        /// The pid.
        pid: u32,
        /// How long we waited.
        timeout: Duration,
    },

    /// A process restored with its tasks left stopped did not stop (it exited, or it ran on).
    #[error(
        "restored process {pid} did not stop as CRIU's --leave-stopped promises (its state: \
         {state}, after {timeout:?}); the restored tree was killed before it could run"
    )]
    NotStopped {
        /// The pid.
        pid: u32,
        /// Its last state letter from `/proc/PID/stat`, or `gone`.
        state: String,
        /// How long we waited.
        timeout: Duration,
    },

    /// The process to checkpoint does not exist.
    #[error("no process with pid {pid}{detail}")]
    NoSuchProcess {
        /// The pid.
        pid: u32,
        /// More detail (starts with " "), else empty.
        detail: &'static str,
    },

    /// The process uses CUDA but this machine has no usable driver binding.
    #[error(
        "process {pid} uses CUDA (libcuda is mapped into it) but no CUDA driver could be loaded \
         here, so its GPU state cannot be checkpointed: {detail}"
    )]
    GpuProcessWithoutDriver {
        /// The pid.
        pid: u32,
        /// Why the driver is unavailable.
        detail: String,
    },

    /// A step failed and the process was put back to running.
    #[error("{phase} failed; the process was resumed and is still running: {source}")]
    Resumed {
        /// The step that failed.
        phase: Phase,
        /// Why it failed.
        source: Box<GpuDumpError>,
    },

    /// A step failed and putting the process back to running failed too.
    #[error(
        "{phase} failed and the process could not be resumed, so it may be lost (it may be \
         stuck in GPU state {state}; kill it if it does not recover); resuming failed with: \
         {rollback}; the {phase} error was: {source}"
    )]
    Lost {
        /// The step that failed.
        phase: Phase,
        /// The GPU state last seen, or "unknown".
        state: String,
        /// Why the step failed.
        source: Box<GpuDumpError>,
        /// Why the rollback failed.
        rollback: Box<GpuDumpError>,
    },

    /// `criu dump` failed and the process is gone.
    #[error("criu dump failed and process {pid} is gone (CRIU had already killed it): {source}")]
    DumpKilled {
        /// The pid.
        pid: u32,
        /// Why the dump failed.
        source: Box<GpuDumpError>,
    },

    /// CRIU restored the process but its GPU state could not be restored.
    #[error(
        "the process was restored as pid {pid} but its GPU state could not be restored; it is \
         blocked in any CUDA call and should be killed: {source}"
    )]
    GpuRestore {
        /// The restored pid.
        pid: u32,
        /// Why the GPU restore failed.
        source: Box<GpuDumpError>,
    },

    /// The process is in a CUDA checkpoint state that the step cannot handle.
    #[error("process {pid} is in CUDA checkpoint state {state}; cannot {action}")]
    GpuState {
        /// The pid.
        pid: u32,
        /// The state it is in.
        state: crate::cuda::state::ProcessState,
        /// What could not be done.
        action: &'static str,
    },

    /// The image cannot be restored on this machine.
    #[error("this image cannot be restored on this machine: {reason}")]
    Incompatible {
        /// Why.
        reason: String,
    },

    /// Recorded image metadata is missing or malformed.
    #[error("image metadata field {key:?}: {detail}")]
    Metadata {
        /// The field.
        key: &'static str,
        /// What is wrong with it.
        detail: String,
    },

    /// A CRIU image file could not be understood.
    #[error("CRIU image {path}: {detail}")]
    Image {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },

    /// A file system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Why CRIU failed, as far as its log or output says; shown as an explanation (starting with
/// "; ") after CRIU's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CriuCause {
    /// A file the process had open changed size after the dump.
    FileChangedSize,
    /// A pid the image needs is taken by another process: waiting and trying again can
    /// succeed.
    PidTaken,
    /// The process is attached to a terminal and was not dumped as a shell job.
    Terminal,
    /// The process is gstore's own ancestor (the shell that runs it, say): CRIU cannot dump
    /// the tree it runs in.
    OwnAncestor,
    /// The process runs in a container, whose mounts CRIU cannot dump from outside it.
    Container,
    /// CRIU before 4.2 asked the kernel (>= 6.16) for credential options of an inet socket,
    /// which it no longer has.
    SocketOptions,
    /// The process (or the image) has an established TCP connection and `--tcp-established`
    /// was not given.
    TcpEstablished,
    /// A deleted file the process holds is larger than CRIU's `--ghost-limit`.
    GhostLimit,
    /// The process has an io_uring, which CRIU cannot dump.
    IoUring,
    /// Nothing recognised.
    Unknown,
}

impl std::fmt::Display for CriuCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CriuCause::FileChangedSize => {
                "; a file the process had open changed size after the dump (e.g. it kept appending after a \
                 --leave-running checkpoint); CRIU cannot restore it"
            }
            CriuCause::PidTaken => {
                "; a pid the image needs is taken by another process (the original process may not have \
                 been reaped yet); wait until it is gone and retry"
            }
            CriuCause::Terminal => {
                "; the process is attached to a terminal: checkpoint and restore it with --shell-job (it \
                 then needs a terminal again when restored)"
            }
            CriuCause::OwnAncestor => {
                "; the process is an ancestor of gstore itself (the shell gstore runs in?): CRIU cannot \
                 checkpoint the tree it runs in; checkpoint a process started elsewhere (e.g. with setsid)"
            }
            CriuCause::Container => {
                "; the process runs in a container (its mounts belong to another mount namespace): \
                 checkpoint the container through its runtime (e.g. podman container checkpoint), not its pid"
            }
            CriuCause::SocketOptions => {
                "; this CRIU cannot dump inet sockets on Linux >= 6.16 (the kernel no longer has \
                 SO_PASSCRED/SO_PASSSEC for them): install CRIU >= 4.2 (scripts/criu.sh builds 4.2.1)"
            }
            CriuCause::TcpEstablished => {
                "; the process has a TCP connection to a process outside the checkpointed tree: pass \
                 --criu-opt=--tcp-established to dump it as it is (after a restore it works only if its \
                 peer kept it open and waited)"
            }
            CriuCause::GhostLimit => {
                "; the process holds a deleted file larger than the size gstore measured before the \
                 dump (it grew meanwhile): pass --criu-opt=--ghost-limit=BYTES with room for it"
            }
            CriuCause::IoUring => {
                "; the process has an io_uring, which CRIU cannot dump (PyTorch's TCPStore server \
                 sets one up through libuv: start the job with USE_LIBUV=0)"
            }
            CriuCause::Unknown => "",
        })
    }
}

impl GpuDumpError {
    /// Whether CRIU failed because a pid the image needs was taken: by a process that got it
    /// after the restore saw it free, on a busy machine. Waiting and trying again can succeed.
    pub fn is_pid_taken(&self) -> bool {
        matches!(self, GpuDumpError::CriuFailed { cause: CriuCause::PidTaken, .. })
    }

    /// Whether the driver said the target process holds no CUDA context
    /// (`CUDA_ERROR_NOT_INITIALIZED` from a checkpoint call about it): a process that maps
    /// libcuda without ever initialising CUDA, whose memory CRIU alone can take.
    pub fn is_no_context(&self) -> bool {
        matches!(self, GpuDumpError::Cuda { code: 3, call, .. } if call.starts_with("cuCheckpointProcess"))
    }

    /// An [`GpuDumpError::Io`] with context.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        GpuDumpError::Io { context: context.into(), source }
    }
}
