//! How a failed command ends: a distinct exit status per kind of failure, and with `--json`
//! an error object on stdout (docs/CLI.md).

use gstore_capture::CaptureError;
use gstore_container::ContainerError;
use gstore_gpu_dump::GpuDumpError;
use gstore_store::ObjectKind;
use gstore_store::{format_kind, ErrorKind, FormatError, StoreError};
use serde::Serialize;

/// A command line gstore refuses beyond what the argument parser checks.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// Damaged images were found (`gstore verify`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Damaged(pub String);

/// The kind of a failure: its `--json` code and its exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// Anything else (exit 1): I/O, the network, CRIU, the GPU driver, ...
    Failed,
    /// A refused command line or input (exit 2, as for the argument parser's own errors).
    Usage,
    /// The named image, tag, object or store does not exist (exit 3).
    NotFound,
    /// Stored data is damaged (exit 4).
    Damaged,
    /// Another writer got there first, or something is locked (exit 5).
    Conflict,
    /// The store did not answer or failed in transit after the retries (exit 6): running the
    /// command again later may succeed.
    Unavailable,
}

impl Code {
    /// The process exit status.
    pub fn exit_status(self) -> i32 {
        match self {
            Code::Failed => 1,
            Code::Usage => 2,
            Code::NotFound => 3,
            Code::Damaged => 4,
            Code::Conflict => 5,
            Code::Unavailable => 6,
        }
    }
}

/// The kind of `e`, from the first cause in its chain that says.
pub fn classify(e: &anyhow::Error) -> Code {
    for cause in e.chain() {
        if cause.is::<Usage>() {
            return Code::Usage;
        }
        if cause.is::<Damaged>() {
            return Code::Damaged;
        }
        if let Some(s) = cause.downcast_ref::<StoreError>() {
            return store_code(s.kind());
        }
        if let Some(f) = cause.downcast_ref::<FormatError>() {
            return store_code(format_kind(f));
        }
        if let Some(c) = cause.downcast_ref::<ContainerError>() {
            match c {
                ContainerError::NotACheckpoint(_) | ContainerError::BadArchive { .. } => return Code::Usage,
                ContainerError::NoSuchContainer(_) => return Code::NotFound,
                ContainerError::NameTaken { .. } => return Code::Conflict,
                _ => {}
            }
            if let Some(s) = c.store_error() {
                return store_code(s.kind());
            }
        }
        if let Some(GpuDumpError::NoSuchProcess { .. }) = cause.downcast_ref::<GpuDumpError>() {
            return Code::NotFound;
        }
        // Capture and restore errors wrap the store's (transparently, or boxed): their kind
        // is the store's.
        if let Some(c) = cause.downcast_ref::<CaptureError>() {
            if c.is_wrong_kind() {
                return Code::Usage;
            }
            if let Some(s) = c.store_error() {
                return store_code(s.kind());
            }
        }
    }
    Code::Failed
}

/// The exit status of a store failure, by its kind.
fn store_code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Damage => Code::Damaged,
        ErrorKind::Conflict => Code::Conflict,
        ErrorKind::Usage => Code::Usage,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Failure => Code::Failed,
    }
}

/// The error and its causes on one line, each cause once: most of gstore's errors already
/// say their cause in their own message, and a cause said there is not repeated. Damage
/// found in a chunk, pack or manifest while reading points to `gstore verify --read-data`.
pub fn message(e: &anyhow::Error, code: Code) -> String {
    let mut said = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !said.contains(&cause) {
            said = format!("{said}: {cause}");
        }
    }
    let stored = |what: &ObjectKind| {
        matches!(what, ObjectKind::Chunk | ObjectKind::Pack | ObjectKind::Manifest | ObjectKind::SealedObject)
    };
    let stored_data =
        |c: &(dyn std::error::Error + 'static)| match (c.downcast_ref::<StoreError>(), c.downcast_ref::<FormatError>())
        {
            (Some(StoreError::Corrupt { what, .. }), _) | (_, Some(FormatError::Corrupt { what, .. })) => stored(what),
            _ => false,
        };
    if code == Code::Damaged && e.chain().any(stored_data) {
        said.push_str(" (`gstore verify --read-data` lists every image the damage breaks)");
    }
    said
}

/// What `--json` prints on stdout for a failure.
#[derive(Serialize)]
pub struct ErrorReport {
    /// The failure.
    pub error: ErrorBody,
}

/// The failure's kind and message.
#[derive(Serialize)]
pub struct ErrorBody {
    /// Stable code: `failed`, `usage`, `not_found`, `damaged` or `conflict`.
    pub code: Code,
    /// The exit status that goes with it.
    pub exit_status: i32,
    /// What went wrong, as the human output says it.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer failed: {source}")]
    struct Says {
        source: std::io::Error,
    }

    #[test]
    fn a_cause_is_said_once() {
        let io = || std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(Says { source: io() });
        assert_eq!(message(&e, classify(&e)), "outer failed: disk on fire");
        let e = anyhow::Error::new(io()).context("writing x");
        assert_eq!(message(&e, classify(&e)), "writing x: disk on fire");
    }

    #[test]
    fn store_errors_keep_their_kind_under_context() {
        let e = anyhow::Error::new(StoreError::NotFound { what: ObjectKind::Tag, key: "a:b".into() })
            .context("restore failed");
        assert_eq!(classify(&e), Code::NotFound);
        let e = anyhow::Error::new(StoreError::corrupt(ObjectKind::Chunk, "ab", "hash")).context("restore failed");
        assert_eq!(classify(&e), Code::Damaged);
        assert!(message(&e, Code::Damaged).contains("gstore verify --read-data"));
        assert_eq!(classify(&anyhow::Error::new(Usage("bad".into()))).exit_status(), 2);
        assert_eq!(classify(&anyhow::anyhow!("other")), Code::Failed);
    }
}
