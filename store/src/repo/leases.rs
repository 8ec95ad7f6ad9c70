//! Leases in the store (`leases/<name>`): taken, grown and confirmed by a push or tag copy,
//! dropped when its tag is written (docs/GC.md gives the protocol). The record's layout is
//! `gstore_format::lease`.
//!
//! Only a gstore on the owner's boot and pid namespace can tell that the owner died (the pid
//! is gone or belongs to a later process), and only then is a lease dropped without the
//! operator's word: no clock is trusted.

use crate::backend::{self, Backend};
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::{Family, ObjectKey};
use crate::format::lease::{owner_prefix, LeaseRecord, Owner};
use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

/// What this machine can say of a lease's owner.
pub trait Liveness {
    /// The calling process.
    fn current() -> Self;
    /// True only when this process can prove the owner is gone: same boot and pid namespace,
    /// and the pid no longer exists or now belongs to a process started at another time.
    fn is_dead_here(&self) -> bool;
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Start time (field 22) of a process, from `/proc/PID/stat`.
fn start_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

impl Liveness for Owner {
    fn current() -> Owner {
        Owner {
            host: read_trimmed("/proc/sys/kernel/hostname"),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            pid_ns: std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_default(),
            pid: std::process::id(),
            start_ticks: start_ticks("self").unwrap_or(0),
        }
    }

    fn is_dead_here(&self) -> bool {
        let me = Owner::current();
        if self.boot_id.is_empty() || self.boot_id != me.boot_id || self.pid_ns != me.pid_ns {
            return false;
        }
        start_ticks(&self.pid.to_string()) != Some(self.start_ticks)
    }
}

/// A held lease. It is rewritten whenever it protects more; dropping it deletes it (best
/// effort), so it must be dropped only once the tag naming what it protects is written, or
/// when the work it protected is abandoned.
pub struct Lease {
    backend: Backend,
    key: ObjectKey,
    record: Mutex<LeaseRecord>,
    /// Set when a write found the lease gone: someone removed it while it was held, and a gc
    /// may have deleted what it protected meanwhile ([`Lease::confirm`]).
    lost: std::sync::atomic::AtomicBool,
}

/// A new lease name: 32 lowercase hex digits, the first 16 [`owner_prefix`] of
/// `$GSTORE_TOKEN` when it is set, random otherwise, the rest random.
fn new_lease_name() -> String {
    let random = ObjectId::unique().to_hex();
    match crate::environment::Http::read().token {
        Some(token) => format!("{}{}", owner_prefix(token.as_bytes()), &random[..16]),
        None => random[..32].to_string(),
    }
}

impl Lease {
    /// Takes a new lease (create-only write).
    pub fn take(backend: &Backend, purpose: &str) -> Result<Lease> {
        let owner = Owner::current();
        let key = ObjectKey::Lease(new_lease_name());
        let record = LeaseRecord {
            format: 1,
            owner,
            purpose: purpose.to_string(),
            packs: BTreeSet::new(),
            manifests: BTreeSet::new(),
        };
        backend.create_record(&key, serde_json::to_vec_pretty(&record).expect("lease serializes"))?;
        Ok(Lease { backend: backend.clone(), key, record: Mutex::new(record), lost: Default::default() })
    }

    /// Adds packs and manifests to what the lease protects and writes it, before the caller
    /// writes or relies on them. Nothing is written when they were protected already.
    pub fn protect(&self, packs: &[ObjectId], manifests: &[ObjectId]) -> Result<()> {
        let mut r = self.record.lock().expect("lease lock");
        let before = (r.packs.len(), r.manifests.len());
        r.packs.extend(packs.iter().map(ObjectId::to_hex));
        r.manifests.extend(manifests.iter().map(ObjectId::to_hex));
        if before == (r.packs.len(), r.manifests.len()) {
            return Ok(());
        }
        self.write(&r)
    }

    /// Writes the record, noting when the lease was gone before the write.
    fn write(&self, r: &LeaseRecord) -> Result<()> {
        if self.backend.size(&self.key)?.is_none() {
            self.lost.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.backend.put_volatile(&self.key, serde_json::to_vec_pretty(r).expect("lease serializes"))
    }

    /// Checks, before the holder tags what the lease protects, that nothing it relies on went
    /// while it ran: when the lease was removed meanwhile (by an admin, or by a gc that took
    /// its owner for dead), it is written again and every pack it protects must still be
    /// listed without a tombstone; otherwise the work is refused as a conflict (push again).
    pub fn confirm(&self) -> Result<()> {
        let held = self.backend.size(&self.key)?.is_some();
        if held && !self.lost.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let r = self.record.lock().expect("lease lock").clone();
        self.write(&r)?;
        let (bad, _) = unreliable_packs(&self.backend, &r.pack_ids().collect())?;
        if bad.is_empty() {
            return Ok(());
        }
        Err(StoreError::Conflict(format!(
            "{} was removed while this {} ran, and {} pack(s) it relied on are gone or about to be deleted \
             by gc: nothing was tagged; run it again",
            self.key,
            r.purpose,
            bad.len()
        )))
    }

    /// The lease's key.
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.backend.delete(&self.key);
    }
}

/// Which of `relied` — packs a lease already protects — may have been deleted or be about to
/// be: those with a tombstone and those no longer listed. Also returns the packs that have a
/// tombstone.
pub fn unreliable_packs(
    backend: &Backend,
    relied: &HashSet<ObjectId>,
) -> Result<(HashSet<ObjectId>, HashSet<ObjectId>)> {
    let (doomed, listed) = doomed_then_listed(backend)?;
    let present: HashSet<ObjectId> = listed.iter().filter_map(|l| l.key.pack()).collect();
    let bad = relied.iter().filter(|p| doomed.contains(p) || !present.contains(p)).copied().collect();
    Ok((bad, doomed))
}

/// The packs that have a tombstone, then the listing of `packs/`: listed in that order, so
/// that a pack gc tombstones and deletes meanwhile is in one list or missing from the
/// second (docs/GC.md, push step 4).
pub fn doomed_then_listed(backend: &Backend) -> Result<(HashSet<ObjectId>, Vec<backend::Listed>)> {
    let doomed = tombstoned_packs(backend)?;
    Ok((doomed, backend.list(Family::Packs.prefix())?))
}

/// The packs that have a gc tombstone now: nothing may deduplicate against them.
pub fn tombstoned_packs(backend: &Backend) -> Result<HashSet<ObjectId>> {
    Ok(backend.list(Family::Tombstones.prefix())?.iter().filter_map(|l| l.key.tombstoned()?.pack()).collect())
}

/// True when the object under `key` has a gc tombstone.
pub fn has_tombstone(backend: &Backend, key: &ObjectKey) -> Result<bool> {
    Ok(backend.size(&key.tombstone())?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::lease::LeaseRecord;

    #[test]
    fn owner_is_alive_here_and_a_gone_pid_is_dead() {
        let me = Owner::current();
        assert!(me.start_ticks > 0 && !me.boot_id.is_empty());
        assert!(!me.is_dead_here());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(Owner { pid, ..me.clone() }.is_dead_here());
        // Another boot cannot be judged from here.
        assert!(!Owner { pid, boot_id: "other".into(), ..me.clone() }.is_dead_here());
        // Same pid, other start time: a later process reused the pid.
        assert!(Owner { start_ticks: me.start_ticks + 1, ..me }.is_dead_here());
    }

    #[test]
    fn lease_is_written_grows_and_goes_away_on_drop() {
        let b = Backend::memory();
        let lease = Lease::take(&b, "push t:latest").unwrap();
        let key = lease.key().clone();
        let p = ObjectId::of(b"p");
        lease.protect(&[p], &[]).unwrap();
        let before = b.requests();
        lease.protect(&[p], &[]).unwrap();
        assert_eq!(b.requests(), before, "nothing new, nothing written");
        let rec = LeaseRecord::from_json(&b.get(&key).unwrap(), &key.to_string()).unwrap();
        assert_eq!(rec.pack_ids().collect::<Vec<_>>(), vec![p]);
        drop(lease);
        assert!(b.get_opt(&key).unwrap().is_none());
        assert!(StoreError::from(LeaseRecord::from_json(b"{", "k").unwrap_err()).is_damage());
    }

    #[test]
    fn a_lease_removed_while_held_is_confirmed_only_if_its_packs_remain() {
        let b = Backend::memory();
        let (kept, gone) = (ObjectId::of(b"kept"), ObjectId::of(b"gone"));
        for p in [kept, gone] {
            b.put(&ObjectKey::Pack(p), b"pack".to_vec()).unwrap();
        }
        let lease = Lease::take(&b, "push t:1").unwrap();
        lease.protect(&[kept], &[]).unwrap();
        lease.confirm().unwrap();
        // Removed behind its holder's back, then written again by a later protect: still lost.
        b.delete(lease.key()).unwrap();
        lease.protect(&[gone], &[]).unwrap();
        lease.confirm().unwrap();
        // A gc deletes a pack it protected while it was gone: the holder must not tag.
        b.delete(&ObjectKey::Pack(gone)).unwrap();
        let err = lease.confirm().unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::Conflict, "{err}");
        assert!(err.to_string().contains("nothing was tagged"), "{err}");
        assert!(b.get_opt(lease.key()).unwrap().is_some(), "the lease is written again");
    }
}
