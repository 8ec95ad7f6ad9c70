//! Temporary files that killed writers left in a local store's directory.
//!
//! The local backend writes an object to `<key>#<n>` and renames it into place (docs/FORMAT.md);
//! a writer killed in between leaves the temporary file, which is no object: listings skip it,
//! so only this sweep ever removes it. No clock says when a writer is gone; instead (docs/GC.md,
//! "Temporary files"):
//!
//! - A push or tag copy names a pack or manifest in its lease *before* writing it (or a tag
//!   naming the manifest), and removes its temporary file (rename, or cleanup of a failed
//!   write) *before* deleting its lease. Temporary files are listed before leases are read,
//!   and each is checked again afterwards: one that no live lease covers and that is still
//!   there, unchanged, was not removed by its writer although the lease is gone — so its
//!   writer is dead, and no one else writes that file.
//! - A lease's temporary file belongs to the lease's holder (lease names are random and
//!   written only by their holder): swept once that owner is provably dead, as the file names
//!   it or, when the file was cut short (its writer killed mid-write), as the lease under its
//!   key does.
//! - Tombstones are written only by the gc that holds the gc lock: one left behind is from a
//!   gc that died.
//!
//! Anything else (a file that cannot be read or parsed, other than a lease's; `config.json`;
//! the gc lock, which a gc that is refused the lock writes for a moment) is left alone.

use super::{GcReport, Leases};
use crate::backend::Backend;
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::{Family, ObjectKey};
use crate::format::lease::LeaseRecord;
use crate::repo::leases::Liveness;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Prefixes whose temporary files may be swept.
const PREFIXES: [&str; 5] = [
    Family::Packs.prefix(),
    Family::Manifests.prefix(),
    Family::Tags.prefix(),
    Family::Leases.prefix(),
    Family::Tombstones.prefix(),
];

/// A temporary file as listed.
pub(super) struct TempFile {
    /// The key of the object it was to become.
    key: String,
    path: PathBuf,
    identity: Identity,
}

/// What tells one file from another that later took its name: inode, size and times.
#[derive(Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Identity {
    /// The identity of the file at `path` now, if there is one.
    fn of(path: &Path) -> Option<Identity> {
        let m = std::fs::symlink_metadata(path).ok().filter(|m| m.is_file())?;
        Some(Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// The object key a temporary file's name stands for: `<key>#<digits>`, as the local backend
/// names them.
fn temp_key(rel: &str) -> Option<&str> {
    let (key, n) = rel.rsplit_once('#')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !key.contains('#')).then_some(key)
}

/// Every temporary file under the object prefixes of a local store (none for other backends).
/// Must be called before leases are read.
pub(super) fn list(b: &Backend) -> Result<Vec<TempFile>> {
    let Some(root) = b.local_root() else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for prefix in PREFIXES {
        walk(root, &root.join(prefix), &mut out)?;
    }
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<TempFile>) -> Result<()> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io("listing", dir, e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| StoreError::io("listing", dir, e))?;
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            walk(root, &path, out)?;
            continue;
        }
        let Some(rel) = path.strip_prefix(root).ok().and_then(Path::to_str) else { continue };
        let (Some(key), Some(identity)) = (temp_key(rel), Identity::of(&path)) else { continue };
        out.push(TempFile { key: key.to_string(), path, identity });
    }
    Ok(())
}

/// Removes the temporary files of `temps` whose writers are gone (module docs), given the
/// leases as read after `temps` was listed; with `dry_run`, only counts them. Needs the gc
/// lock unless `dry_run`.
pub(super) fn sweep(temps: Vec<TempFile>, leases: &Leases, dry_run: bool, report: &mut GcReport) -> Result<()> {
    for t in temps {
        let writer_gone = match ObjectKey::parse(&t.key) {
            Ok(key @ ObjectKey::Lease(_)) => match std::fs::read(&t.path).map(|b| LeaseRecord::from_json(&b, &t.key)) {
                Ok(Ok(l)) => l.owner.is_dead_here(),
                // Cut short: the lease under its key names the owner.
                Ok(Err(_)) => leases.dead.contains(&key),
                Err(_) => false,
            },
            Ok(ObjectKey::Tag(_)) => tag_manifest(&t.path).is_some_and(|m| !leases.manifests.contains(&m)),
            Ok(ObjectKey::Tombstone(_)) => true,
            Ok(ObjectKey::Pack(pack)) => !leases.packs.contains(&pack),
            Ok(ObjectKey::Manifest(manifest)) => !leases.manifests.contains(&manifest),
            _ => false,
        };
        // Still there and unchanged since it was listed (before the leases were read).
        if !writer_gone || Identity::of(&t.path).as_ref() != Some(&t.identity) {
            continue;
        }
        if !dry_run {
            match std::fs::remove_file(&t.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(StoreError::io("removing", &t.path, e))
                }
                _ => {}
            }
        }
        report.temp_files_swept += 1;
        report.temp_bytes_swept += t.identity.size;
    }
    Ok(())
}

/// The manifest a tag record's temporary file names, if it can be read.
fn tag_manifest(path: &Path) -> Option<ObjectId> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    ObjectId::from_hex(v.get("manifest")?.as_str()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn temporary_names_are_recognised() {
        assert_eq!(temp_key("packs/ab/ab12.pack#1"), Some("packs/ab/ab12.pack"));
        assert_eq!(temp_key("tombstones/packs/ab/ab12.pack#17"), Some("tombstones/packs/ab/ab12.pack"));
        for not_temp in ["packs/ab/ab12.pack", "packs/ab/ab12.pack#", "packs/ab/ab12.pack#1a", "a#1#2"] {
            assert_eq!(temp_key(not_temp), None, "{not_temp}");
        }
    }

    /// Every file below `dir`, as paths relative to `root`.
    fn files_below(root: &Path, dir: &Path) -> HashSet<String> {
        let mut out = HashSet::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                out.extend(files_below(root, &e.path()));
            } else {
                out.insert(e.path().strip_prefix(root).unwrap().to_str().unwrap().to_string());
            }
        }
        out
    }

    /// A local store directory with `files` (key, content) in it, listed.
    fn listed(files: &[(&str, &[u8])]) -> (tempfile::TempDir, Backend, Vec<TempFile>) {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::local(dir.path()).unwrap();
        for (key, content) in files {
            let p = dir.path().join(key);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        let temps = list(&b).unwrap();
        (dir, b, temps)
    }

    #[test]
    fn leased_objects_and_live_owners_keep_their_temporary_files() {
        let (leased, free) = (ObjectId::of(b"leased"), ObjectId::of(b"free"));
        let tag = |m: &ObjectId| format!(r#"{{"format":1,"manifest":"{}"}}"#, m.to_hex());
        let lease = |pid: u32, start_ticks: u64| {
            let owner = crate::format::lease::Owner { pid, start_ticks, ..crate::format::lease::Owner::current() };
            serde_json::json!({ "format": 1, "owner": owner, "purpose": "push t" }).to_string()
        };
        let me = crate::format::lease::Owner::current();
        let (tag_leased, tag_free) = (tag(&leased), tag(&free));
        let (alive, dead) = (lease(me.pid, me.start_ticks), lease(me.pid, me.start_ticks + 1));
        let files: Vec<(String, &[u8])> = vec![
            (format!("{}#1", ObjectKey::Pack(leased)), b"kept"),
            (format!("{}#1", ObjectKey::Pack(free)), b"swept"),
            (format!("{}#2", ObjectKey::Manifest(leased)), b"kept"),
            (format!("{}#1", ObjectKey::Manifest(free)), b"swept"),
            ("tags/t/a.tag#1".into(), tag_leased.as_bytes()),
            ("tags/t/b.tag#1".into(), tag_free.as_bytes()),
            ("tags/t/c.tag#1".into(), b"{\"form"),
            (format!("{}#1", ObjectKey::Lease("aa".repeat(16))), alive.as_bytes()),
            (format!("{}#1", ObjectKey::Lease("bb".repeat(16))), dead.as_bytes()),
            (format!("tombstones/{}#1", ObjectKey::Pack(free)), b"swept"),
            ("config.json#1".into(), b"kept"),
            ("gc/lock#1".into(), b"kept"),
            (ObjectKey::Pack(free).to_string(), b"an object"),
        ];
        let files: Vec<(&str, &[u8])> = files.iter().map(|(k, c)| (k.as_str(), *c)).collect();
        let (dir, _b, temps) = listed(&files);
        assert_eq!(temps.len(), 10, "objects, config.json and the gc lock are not listed");
        let mut report = GcReport::default();
        let leases = Leases { packs: [leased].into(), manifests: [leased].into(), dead: HashSet::new() };
        sweep(temps, &leases, false, &mut report).unwrap();
        let left = files_below(dir.path(), dir.path());
        let expect_left: HashSet<String> = [
            format!("{}#1", ObjectKey::Pack(leased)),
            format!("{}#2", ObjectKey::Manifest(leased)),
            "tags/t/a.tag#1".into(),
            "tags/t/c.tag#1".into(),
            format!("{}#1", ObjectKey::Lease("aa".repeat(16))),
            "config.json#1".into(),
            "gc/lock#1".into(),
            ObjectKey::Pack(free).to_string(),
        ]
        .into();
        assert_eq!(left, expect_left);
        assert_eq!(report.temp_files_swept, 5);
    }

    #[test]
    fn a_file_changed_or_replaced_since_the_listing_is_kept() {
        let free = ObjectId::of(b"free");
        let key = format!("{}#1", ObjectKey::Pack(free));
        let (dir, _b, temps) = listed(&[(key.as_str(), b"one")]);
        // Its writer was still writing, or it went and another took the name.
        std::fs::write(dir.path().join(&key), b"longer now").unwrap();
        let mut report = GcReport::default();
        sweep(temps, &Leases::default(), false, &mut report).unwrap();
        assert!(dir.path().join(&key).exists());
        assert_eq!(report.temp_files_swept, 0);
        // A dry run counts and removes nothing.
        let temps = list(&Backend::local(dir.path()).unwrap()).unwrap();
        sweep(temps, &Leases::default(), true, &mut report).unwrap();
        assert!(dir.path().join(&key).exists());
        assert_eq!((report.temp_files_swept, report.temp_bytes_swept), (1, 10));
    }

    /// A push killed while it rewrote its lease leaves the lease's temporary file empty or cut
    /// short: it goes once the lease under its key is found to have a dead owner, and stays
    /// while that owner may live or the lease is not there to say.
    #[test]
    fn a_cut_short_lease_file_goes_with_its_dead_leases_owner() {
        let (dead, alive, gone) =
            (ObjectKey::Lease("cc".repeat(16)), ObjectKey::Lease("dd".repeat(16)), ObjectKey::Lease("ee".repeat(16)));
        let names = [format!("{dead}#1"), format!("{dead}#2"), format!("{alive}#1"), format!("{gone}#1")];
        let files: Vec<(&str, &[u8])> =
            vec![(&names[0], b""), (&names[1], b"{\n  \"format\": 1,\n  \"own"), (&names[2], b""), (&names[3], b"")];
        let (dir, _b, temps) = listed(&files);
        let leases = Leases { dead: [dead].into(), ..Leases::default() };
        let mut report = GcReport::default();
        sweep(temps, &leases, false, &mut report).unwrap();
        let left = files_below(dir.path(), dir.path());
        assert_eq!(left, [names[2].clone(), names[3].clone()].into());
        assert_eq!(report.temp_files_swept, 2);
    }
}
