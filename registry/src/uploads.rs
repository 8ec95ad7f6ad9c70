//! The registry's local upload area: blobs being uploaded (`uploads/ID`) and uploaded blobs
//! that no stored manifest has taken in yet (`blobs/HEX`). A manifest's push reads its new
//! blobs from here into the store and then removes them; a blob that no manifest took in
//! within [`STAGED_FOR`] is removed when the registry next starts. The area is the server's
//! own: uploads of one image go to one server.

use crate::digest::{Digest, Hashing};
use crate::error::{RegistryError, Result};
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

/// How long an upload, or an uploaded blob no manifest names, is kept.
pub const STAGED_FOR: Duration = Duration::from_secs(24 * 3600);

/// The upload area (a directory on this machine).
#[derive(Debug)]
pub struct Uploads {
    dir: PathBuf,
}

impl Uploads {
    /// The area in `dir`, created if need be; what is older than [`STAGED_FOR`] is removed.
    pub fn open(dir: PathBuf) -> Result<Uploads> {
        let u = Uploads { dir };
        for sub in [u.dir.join("uploads"), u.dir.join("blobs")] {
            fs::create_dir_all(&sub).map_err(|e| RegistryError::io("creating", &sub, e))?;
            for entry in fs::read_dir(&sub).map_err(|e| RegistryError::io("listing", &sub, e))?.flatten() {
                let old = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
                if old.is_some_and(|age| age > STAGED_FOR) {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        Ok(u)
    }

    /// Starts an upload; returns its id.
    pub fn start(&self) -> Result<String> {
        let id = hex::encode(rand::random::<[u8; 16]>());
        let path = self.upload_path(&id);
        fs::File::create(&path).map_err(|e| RegistryError::io("creating", &path, e))?;
        Ok(id)
    }

    /// The file upload `id` appends to, if it is in progress.
    pub fn upload_path_of(&self, id: &str) -> Result<PathBuf> {
        let path = self.upload_path(id);
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) || !path.is_file() {
            return Err(RegistryError::BlobUploadUnknown(id.to_string()));
        }
        Ok(path)
    }

    /// Bytes received so far by upload `id`.
    pub fn received(&self, id: &str) -> Result<u64> {
        let path = self.upload_path_of(id)?;
        fs::metadata(&path).map(|m| m.len()).map_err(|e| RegistryError::io("reading", &path, e))
    }

    /// Ends upload `id` as blob `digest`: its bytes are checked against the digest (a
    /// mismatch removes the upload) and kept until a manifest takes them in.
    pub fn finish(&self, id: &str, digest: &Digest) -> Result<u64> {
        let path = self.upload_path_of(id)?;
        let mut hashing = Hashing::default();
        let mut f = fs::File::open(&path).map_err(|e| RegistryError::io("reading", &path, e))?;
        std::io::copy(&mut f, &mut hashing).map_err(|e| RegistryError::io("reading", &path, e))?;
        let (got, len) = hashing.finish();
        if &got != digest {
            let _ = fs::remove_file(&path);
            return Err(RegistryError::DigestInvalid(format!("the upload's bytes are {got}, not {digest}")));
        }
        let staged = self.staged_path(digest);
        fs::rename(&path, &staged).map_err(|e| RegistryError::io("keeping", &staged, e))?;
        Ok(len)
    }

    /// Removes upload `id`.
    pub fn cancel(&self, id: &str) -> Result<()> {
        let path = self.upload_path_of(id)?;
        fs::remove_file(&path).map_err(|e| RegistryError::io("removing", &path, e))
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

    #[test]
    fn uploads_are_checked_against_their_digest() {
        let tmp = tempfile::tempdir().unwrap();
        let u = Uploads::open(tmp.path().join("reg")).unwrap();
        let id = u.start().unwrap();
        fs::OpenOptions::new().append(true).open(u.upload_path_of(&id).unwrap()).unwrap().write_all(b"hello").unwrap();
        assert_eq!(u.received(&id).unwrap(), 5);
        let wrong = Digest::of(b"other");
        assert!(matches!(u.finish(&id, &wrong), Err(RegistryError::DigestInvalid(_))));
        assert!(matches!(u.received(&id), Err(RegistryError::BlobUploadUnknown(_))), "a wrong upload is gone");
        assert!(u.staged(&wrong).is_none());

        let id = u.start().unwrap();
        fs::OpenOptions::new().append(true).open(u.upload_path_of(&id).unwrap()).unwrap().write_all(b"hello").unwrap();
        let d = Digest::of(b"hello");
        assert_eq!(u.finish(&id, &d).unwrap(), 5);
        assert_eq!(u.staged(&d).unwrap().1, 5);
        u.taken_in(&[&d]);
        assert!(u.staged(&d).is_none());
        assert!(matches!(u.upload_path_of("../../etc/passwd"), Err(RegistryError::BlobUploadUnknown(_))));
    }
}
