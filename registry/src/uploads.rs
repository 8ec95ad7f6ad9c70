//! The registry's local upload area: blobs being uploaded (`uploads/ID`) and uploaded blobs
//! that no stored manifest has taken in yet (`blobs/HEX`). A manifest's push reads its new
//! blobs from here into the store and then removes them. The area is the server's own:
//! uploads of one image go to one server.
//!
//! The area is bounded ([`Limits`]): the bytes it holds, uploads in progress and uploaded
//! blobs alike, in all and per owner (the server's token). [`Uploads::sweep`], which the
//! server runs while it serves, removes an upload that received nothing for [`UPLOAD_IDLE`]
//! and an uploaded blob that no manifest took in within [`STAGED_FOR`]. An upload belongs to
//! the repository it was started in, and is unknown under any other.

use crate::digest::{Digest, Hashing};
use crate::error::{RegistryError, Result};
use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// How long an upload in progress is kept after it last received bytes.
pub const UPLOAD_IDLE: Duration = Duration::from_secs(3600);

/// How long an uploaded blob that no manifest names is kept.
pub const STAGED_FOR: Duration = Duration::from_secs(24 * 3600);

/// The most bytes the upload area holds.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// In all.
    pub total: u64,
    /// For one owner.
    pub per_owner: u64,
}

/// Bytes in the area, and whose they are (`None`: found there when the area was opened).
#[derive(Clone, Copy, Debug)]
struct Charge {
    owner: Option<u64>,
    bytes: u64,
}

/// An upload in progress.
#[derive(Debug)]
struct Upload {
    repo: String,
    owner: u64,
    bytes: u64,
}

/// What the area holds, by upload id and by staged blob (its digest's hex).
#[derive(Debug, Default)]
struct Held {
    uploads: HashMap<String, Upload>,
    staged: HashMap<String, Charge>,
    total: u64,
    by_owner: HashMap<u64, u64>,
}

impl Held {
    fn add(&mut self, c: Charge) {
        self.total += c.bytes;
        if let Some(o) = c.owner {
            *self.by_owner.entry(o).or_default() += c.bytes;
        }
    }

    fn remove(&mut self, c: Charge) {
        self.total = self.total.saturating_sub(c.bytes);
        if let Some(o) = c.owner {
            let held = self.by_owner.entry(o).or_default();
            *held = held.saturating_sub(c.bytes);
            if *held == 0 {
                self.by_owner.remove(&o);
            }
        }
    }

    /// Whether `owner` may put `more` bytes in the area.
    fn room(&self, owner: u64, more: u64, limits: &Limits) -> Result<()> {
        let mine = self.by_owner.get(&owner).copied().unwrap_or(0);
        let over = |held: u64, limit: u64, whose: &str| {
            RegistryError::UploadLimit(format!(
                "{whose} uploads waiting on this server would hold {} bytes, over the limit of {limit}: finish, cancel or push the manifests of the uploads in progress",
                held.saturating_add(more)
            ))
        };
        if mine.saturating_add(more) > limits.per_owner {
            return Err(over(mine, limits.per_owner, "this token's"));
        }
        if self.total.saturating_add(more) > limits.total {
            return Err(over(self.total, limits.total, "the"));
        }
        Ok(())
    }

    /// Upload `id` if it was started in repository `repo`.
    fn upload(&self, repo: &str, id: &str) -> Result<&Upload> {
        self.uploads.get(id).filter(|u| u.repo == repo).ok_or_else(|| RegistryError::BlobUploadUnknown(id.to_string()))
    }

    /// Forgets upload `id`, giving back its bytes.
    fn drop_upload(&mut self, id: &str) {
        if let Some(u) = self.uploads.remove(id) {
            self.remove(Charge { owner: Some(u.owner), bytes: u.bytes });
        }
    }

    /// Forgets staged blob `hex`, giving back its bytes.
    fn drop_staged(&mut self, hex: &str) {
        if let Some(c) = self.staged.remove(hex) {
            self.remove(c);
        }
    }
}

/// The upload area (a directory on this machine).
#[derive(Debug)]
pub struct Uploads {
    dir: PathBuf,
    limits: Limits,
    held: Mutex<Held>,
}

impl Uploads {
    /// The area in `dir`, created if need be, bounded by `limits`; what is there already is
    /// swept ([`Uploads::sweep`]), and the uploaded blobs left count against the limits.
    /// Uploads in progress before cannot be continued: they belong to no repository here.
    pub fn open(dir: PathBuf, limits: Limits) -> Result<Uploads> {
        let u = Uploads { dir, limits, held: Mutex::default() };
        for sub in [u.dir.join("uploads"), u.dir.join("blobs")] {
            fs::create_dir_all(&sub).map_err(|e| RegistryError::io("creating", &sub, e))?;
        }
        u.sweep();
        let blobs = u.dir.join("blobs");
        let mut held = u.held();
        for entry in fs::read_dir(&blobs).map_err(|e| RegistryError::io("listing", &blobs, e))?.flatten() {
            let (Ok(name), Ok(meta)) = (entry.file_name().into_string(), entry.metadata()) else { continue };
            let c = Charge { owner: None, bytes: meta.len() };
            held.add(c);
            held.staged.insert(name, c);
        }
        drop(held);
        Ok(u)
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().expect("upload area lock")
    }

    /// Starts an upload in repository `repo` for `owner`, who says it brings at least
    /// `declared` bytes; returns its id. Refused when that would pass the limits.
    pub fn start(&self, repo: &str, owner: u64, declared: u64) -> Result<String> {
        self.held().room(owner, declared, &self.limits)?;
        let id = hex::encode(rand::random::<[u8; 16]>());
        let path = self.upload_path(&id);
        fs::File::create(&path).map_err(|e| RegistryError::io("creating", &path, e))?;
        self.held().uploads.insert(id.clone(), Upload { repo: repo.to_string(), owner, bytes: 0 });
        Ok(id)
    }

    /// The file upload `id` of repository `repo` appends to, if it is in progress.
    pub fn upload_path_of(&self, repo: &str, id: &str) -> Result<PathBuf> {
        self.held().upload(repo, id)?;
        Ok(self.upload_path(id))
    }

    /// Whether upload `id` may take `more` bytes, without taking them.
    pub fn room(&self, id: &str, more: u64) -> Result<()> {
        let held = self.held();
        let owner = held.uploads.get(id).ok_or_else(|| RegistryError::BlobUploadUnknown(id.to_string()))?.owner;
        held.room(owner, more, &self.limits)
    }

    /// Counts `more` bytes into upload `id`, before they are written; refused when they
    /// would pass the limits.
    pub fn grow(&self, id: &str, more: u64) -> Result<()> {
        let mut held = self.held();
        let owner = held.uploads.get(id).ok_or_else(|| RegistryError::BlobUploadUnknown(id.to_string()))?.owner;
        held.room(owner, more, &self.limits)?;
        held.add(Charge { owner: Some(owner), bytes: more });
        if let Some(u) = held.uploads.get_mut(id) {
            u.bytes += more;
        }
        Ok(())
    }

    /// Bytes received so far by upload `id` of repository `repo`.
    pub fn received(&self, repo: &str, id: &str) -> Result<u64> {
        let path = self.upload_path_of(repo, id)?;
        fs::metadata(&path).map(|m| m.len()).map_err(|e| RegistryError::io("reading", &path, e))
    }

    /// Ends upload `id` of repository `repo` as blob `digest`: its bytes are checked against
    /// the digest (a mismatch removes the upload) and kept until a manifest takes them in.
    pub fn finish(&self, repo: &str, id: &str, digest: &Digest) -> Result<u64> {
        let path = self.upload_path_of(repo, id)?;
        let mut hashing = Hashing::default();
        let mut f = fs::File::open(&path).map_err(|e| RegistryError::io("reading", &path, e))?;
        std::io::copy(&mut f, &mut hashing).map_err(|e| RegistryError::io("reading", &path, e))?;
        let (got, len) = hashing.finish();
        if &got != digest {
            self.remove_upload(id);
            return Err(RegistryError::DigestInvalid(format!("the upload's bytes are {got}, not {digest}")));
        }
        let staged = self.staged_path(digest);
        let mut held = self.held();
        let owner = held.upload(repo, id)?.owner;
        fs::rename(&path, &staged).map_err(|e| RegistryError::io("keeping", &staged, e))?;
        held.drop_upload(id);
        held.drop_staged(digest.hex());
        let c = Charge { owner: Some(owner), bytes: len };
        held.add(c);
        held.staged.insert(digest.hex().to_string(), c);
        Ok(len)
    }

    /// Removes upload `id` of repository `repo`.
    pub fn cancel(&self, repo: &str, id: &str) -> Result<()> {
        self.upload_path_of(repo, id)?;
        self.remove_upload(id);
        Ok(())
    }

    /// Removes upload `id`'s file and gives back its bytes.
    fn remove_upload(&self, id: &str) {
        let _ = fs::remove_file(self.upload_path(id));
        self.held().drop_upload(id);
    }

    /// An uploaded blob waiting for its manifest, and its length.
    pub fn staged(&self, digest: &Digest) -> Option<(PathBuf, u64)> {
        let path = self.staged_path(digest);
        let len = fs::metadata(&path).ok()?.len();
        Some((path, len))
    }

    /// Removes staged blobs a stored manifest has taken in.
    pub fn taken_in(&self, digests: &[&Digest]) {
        for d in digests {
            let _ = fs::remove_file(self.staged_path(d));
            self.held().drop_staged(d.hex());
        }
    }

    /// Removes uploads that received nothing for [`UPLOAD_IDLE`] and uploaded blobs older
    /// than [`STAGED_FOR`] (by their files' modification times), giving back their bytes.
    pub fn sweep(&self) {
        self.sweep_dir("uploads", UPLOAD_IDLE, Held::drop_upload);
        self.sweep_dir("blobs", STAGED_FOR, Held::drop_staged);
    }

    /// Removes the files of `sub` not modified for `idle`, and forgets them with `forget`.
    fn sweep_dir(&self, sub: &str, idle: Duration, forget: fn(&mut Held, &str)) {
        let Ok(entries) = fs::read_dir(self.dir.join(sub)) else { return };
        for entry in entries.flatten() {
            let age = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
            if age.is_some_and(|age| age > idle) && fs::remove_file(entry.path()).is_ok() {
                forget(&mut self.held(), &entry.file_name().to_string_lossy());
            }
        }
    }

    fn upload_path(&self, id: &str) -> PathBuf {
        self.dir.join("uploads").join(id)
    }

    fn staged_path(&self, digest: &Digest) -> PathBuf {
        self.dir.join("blobs").join(digest.hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const ROOMY: Limits = Limits { total: 1 << 20, per_owner: 1 << 20 };

    /// Appends `bytes` to upload `id` of `repo`, as the server does.
    fn append(u: &Uploads, repo: &str, id: &str, bytes: &[u8]) -> Result<()> {
        u.grow(id, bytes.len() as u64)?;
        let path = u.upload_path_of(repo, id)?;
        fs::OpenOptions::new().append(true).open(path).unwrap().write_all(bytes).unwrap();
        Ok(())
    }

    #[test]
    fn uploads_are_checked_against_their_digest() {
        let tmp = tempfile::tempdir().unwrap();
        let u = Uploads::open(tmp.path().join("reg"), ROOMY).unwrap();
        let id = u.start("web", 1, 0).unwrap();
        append(&u, "web", &id, b"hello").unwrap();
        assert_eq!(u.received("web", &id).unwrap(), 5);
        let wrong = Digest::of(b"other");
        assert!(matches!(u.finish("web", &id, &wrong), Err(RegistryError::DigestInvalid(_))));
        assert!(matches!(u.received("web", &id), Err(RegistryError::BlobUploadUnknown(_))), "a wrong upload is gone");
        assert!(u.staged(&wrong).is_none());

        let id = u.start("web", 1, 0).unwrap();
        append(&u, "web", &id, b"hello").unwrap();
        let d = Digest::of(b"hello");
        assert_eq!(u.finish("web", &id, &d).unwrap(), 5);
        assert_eq!(u.staged(&d).unwrap().1, 5);
        u.taken_in(&[&d]);
        assert!(u.staged(&d).is_none());
        assert_eq!(u.held().total, 0, "every byte given back");
        assert!(matches!(u.upload_path_of("web", "../../etc/passwd"), Err(RegistryError::BlobUploadUnknown(_))));
    }

    #[test]
    fn uploads_belong_to_their_repository_and_stay_within_the_limits() {
        let tmp = tempfile::tempdir().unwrap();
        let u = Uploads::open(tmp.path().join("reg"), Limits { total: 100, per_owner: 60 }).unwrap();
        let a = u.start("web", 1, 0).unwrap();
        assert!(matches!(u.upload_path_of("team-a", &a), Err(RegistryError::BlobUploadUnknown(_))));
        assert!(matches!(u.cancel("team-a", &a), Err(RegistryError::BlobUploadUnknown(_))));
        append(&u, "web", &a, &[1; 50]).unwrap();
        assert!(matches!(append(&u, "web", &a, &[1; 11]), Err(RegistryError::UploadLimit(_))), "per owner");
        assert!(matches!(u.start("web", 1, 11), Err(RegistryError::UploadLimit(_))), "declared");
        let b = u.start("web", 2, 0).unwrap();
        append(&u, "web", &b, &[2; 50]).unwrap();
        assert!(matches!(append(&u, "web", &b, &[2; 1]), Err(RegistryError::UploadLimit(_))), "in all");
        // Finished, the bytes still count until a manifest takes them in.
        let d = Digest::of(&[1; 50]);
        u.finish("web", &a, &d).unwrap();
        assert!(matches!(u.room(&b, 1), Err(RegistryError::UploadLimit(_))));
        u.taken_in(&[&d]);
        u.room(&b, 10).unwrap();
        u.cancel("web", &b).unwrap();
        let held = u.held();
        assert_eq!((held.total, held.by_owner.len()), (0, 0));
    }

    #[test]
    fn idle_uploads_are_swept_and_give_their_bytes_back() {
        let tmp = tempfile::tempdir().unwrap();
        let u = Uploads::open(tmp.path().join("reg"), ROOMY).unwrap();
        let (old, fresh) = (u.start("web", 1, 0).unwrap(), u.start("web", 1, 0).unwrap());
        append(&u, "web", &old, b"abandoned").unwrap();
        append(&u, "web", &fresh, b"busy").unwrap();
        let long_ago = std::time::SystemTime::now() - UPLOAD_IDLE - Duration::from_secs(60);
        let path = u.upload_path_of("web", &old).unwrap();
        fs::File::options().write(true).open(&path).unwrap().set_modified(long_ago).unwrap();
        u.sweep();
        assert!(!path.exists());
        assert!(matches!(u.received("web", &old), Err(RegistryError::BlobUploadUnknown(_))));
        assert_eq!(u.received("web", &fresh).unwrap(), 4);
        assert_eq!(u.held().total, 4);
    }
}
