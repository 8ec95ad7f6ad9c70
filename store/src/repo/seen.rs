//! What this machine has seen of an encrypted remote store's tags: the newest value of each,
//! so that a tag record put back in the bucket by someone without the key (an older sealed
//! record of the same tag authenticates) is refused here instead of read as current
//! (docs/SECURITY.md). Kept as JSON (`"NAME:VERSION": [unix, nanos]`) beside the machine's
//! index, read and rewritten under a file lock.

use crate::error::{Result, StoreError};
use crate::format::tag::{SetTime, TagRecord};
use crate::ObjectKind;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Seek, Write};
use std::path::PathBuf;

/// The newest value seen of each tag of one store, on this machine.
pub(crate) struct SeenTags {
    path: PathBuf,
}

impl SeenTags {
    /// The record kept at `path` (created when first needed).
    pub(crate) fn at(path: PathBuf) -> SeenTags {
        SeenTags { path }
    }

    /// Checks records just read against the newest values seen, and remembers newer ones.
    /// A record older than one seen is [`StoreError::Corrupt`]: the tag was rolled back.
    pub(crate) fn check(&self, records: &[&TagRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let io = |action, e| StoreError::io(action, &self.path, e);
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io("creating", e))?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(|e| io("opening", e))?;
        file.lock().map_err(|e| io("locking", e))?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| io("reading", e))?;
        // A damaged record of what was seen is started afresh: it only ever adds refusals.
        let mut seen: BTreeMap<String, (u64, u32)> = serde_json::from_str(&text).unwrap_or_default();
        let mut changed = false;
        for rec in records {
            let name = rec.tag().to_string();
            let at = rec.set_time();
            match seen.get(&name).map(|&(unix, nanos)| SetTime { unix, nanos }) {
                Some(newest) if at < newest => {
                    return Err(StoreError::corrupt(
                        ObjectKind::Tag,
                        name,
                        format!(
                            "it reads as set at {} s, but this machine saw it set later, at {} s: the store's record was rolled back to an earlier value",
                            at.unix, newest.unix
                        ),
                    ));
                }
                Some(newest) if at == newest => {}
                _ => {
                    seen.insert(name, (at.unix, at.nanos));
                    changed = true;
                }
            }
        }
        if changed {
            let json = serde_json::to_vec(&seen).expect("map serializes");
            file.set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| file.write_all(&json))
                .map_err(|e| io("writing", e))?;
        }
        Ok(())
    }
}
