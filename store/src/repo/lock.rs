//! The per-store process lock: one gstore process at a time owns a store's local index; a
//! second one waits, saying so, instead of failing on RocksDB's own lock.

use crate::error::{Result, StoreError};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

/// Held for as long as the index is open; dropping it releases the lock.
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    /// Takes the lock at `path`, calling `on_wait` with a message once if another process
    /// holds it, then waiting until it is free.
    pub fn acquire(path: &Path, on_wait: &dyn Fn(&str)) -> Result<StoreLock> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| StoreError::io("opening lock file", path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let who = holder.trim();
                let who =
                    if who.is_empty() { "another gstore process".to_string() } else { format!("gstore process {who}") };
                on_wait(&format!("waiting for {who}, which is using this store ({})", path.display()));
                file.lock().map_err(|e| StoreError::io("locking", path, e))?;
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(StoreError::io("locking", path, e)),
        }
        let _ = file.set_len(0).and_then(|_| file.rewind()).and_then(|_| write!(file, "pid {}", std::process::id()));
        Ok(StoreLock { _file: file })
    }
}
