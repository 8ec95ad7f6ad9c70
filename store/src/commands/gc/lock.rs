//! The gc lock: an object (`gc/lock`) written create-only, so that one gc runs at a time per
//! store. Pushes never take it. A lock whose holder is provably dead (same boot and pid
//! namespace, pid gone) is taken over; otherwise only `--break-lock` takes it.

use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::ObjectKey;
use crate::format::lease::Owner;
use crate::repo::leases::Liveness;
use serde::Serialize;

/// What the lock object holds: its owner, and a nonce that makes every record unique, so a
/// create retried after its answer was lost recognises its own object.
#[derive(Serialize)]
struct LockRecord {
    #[serde(flatten)]
    owner: Owner,
    nonce: String,
}

/// A held gc lock; dropping it deletes the lock object.
pub struct GcLock {
    backend: Backend,
}

impl GcLock {
    /// Takes the lock. `break_lock` takes it from a holder this machine cannot judge.
    pub fn take(backend: &Backend, break_lock: bool) -> Result<GcLock> {
        let record = LockRecord { owner: Owner::current(), nonce: ObjectId::unique().to_hex()[..32].to_string() };
        let record = serde_json::to_vec_pretty(&record).expect("lock record serializes");
        for _ in 0..2 {
            match backend.create_record(&ObjectKey::GcLock, record.clone()) {
                Ok(()) => return Ok(GcLock { backend: backend.clone() }),
                Err(StoreError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
            let holder = match backend.get_opt(&ObjectKey::GcLock)? {
                None => continue,
                Some(b) => serde_json::from_slice::<Owner>(&b).ok(),
            };
            let dead = holder.as_ref().is_some_and(Owner::is_dead_here);
            if !(dead || break_lock) {
                let who = holder.map(|o| o.describe()).unwrap_or_else(|| "an unreadable holder".into());
                return Err(StoreError::Conflict(format!(
                    "another gc is running on this store ({who}, object {}); if it is dead, run gstore gc --break-lock",
                    ObjectKey::GcLock
                )));
            }
            backend.delete(&ObjectKey::GcLock)?;
        }
        Err(StoreError::Conflict("another gc took the gc lock at the same moment: retry".into()))
    }
}

impl Drop for GcLock {
    fn drop(&mut self) {
        let _ = self.backend.delete(&ObjectKey::GcLock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_dead_holders_are_taken_over() {
        let b = Backend::memory();
        let held = GcLock::take(&b, false).unwrap();
        assert!(matches!(GcLock::take(&b, false), Err(StoreError::Conflict(m)) if m.contains("--break-lock")));
        drop(held);
        assert!(b.get_opt(&ObjectKey::GcLock).unwrap().is_none());
        // A lock left by a process that has exited here is taken over.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = Owner { pid: child.id(), ..Owner::current() };
        child.wait().unwrap();
        b.put_new(&ObjectKey::GcLock, serde_json::to_vec(&dead).unwrap()).unwrap();
        let _l = GcLock::take(&b, false).unwrap();
        // One held by another machine is taken only with --break-lock.
        drop(_l);
        let foreign = Owner { boot_id: "elsewhere".into(), ..Owner::current() };
        b.put_new(&ObjectKey::GcLock, serde_json::to_vec(&foreign).unwrap()).unwrap();
        assert!(GcLock::take(&b, false).is_err());
        assert!(GcLock::take(&b, true).is_ok());
    }
}
