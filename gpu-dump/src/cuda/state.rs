//! Where a process stands in the driver's checkpoint cycle.

/// `CUprocessState`: where a process stands in the checkpoint cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// 0: running normally.
    Running,
    /// 1: CUDA API locked; further calls block.
    Locked,
    /// 2: GPU memory moved to host memory; device handles released.
    Checkpointed,
    /// 3: an uncorrectable error during checkpoint or restore.
    Failed,
    /// Any other value (CUDA 13.4 adds 4 checkpointing and 5 restoring).
    Other(i32),
}

impl ProcessState {
    /// Maps a raw `CUprocessState` value.
    pub fn from_raw(raw: i32) -> Self {
        match raw {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            3 => ProcessState::Failed,
            other => ProcessState::Other(other),
        }
    }
}

impl std::fmt::Display for ProcessState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProcessState::Running => f.write_str("running"),
            ProcessState::Locked => f.write_str("locked"),
            ProcessState::Checkpointed => f.write_str("checkpointed"),
            ProcessState::Failed => f.write_str("failed"),
            ProcessState::Other(raw) => write!(f, "state {raw}"),
        }
    }
}
