//! The registry's uploads, kept in the store (`uploads/`, docs/FORMAT.md): blobs being
//! uploaded and uploaded blobs that no manifest has taken in yet. Nothing of an upload is
//! kept on the server that received it, so servers over one store behind a load balancer
//! continue each other's uploads, and an upload whose server died midway goes on from the
//! last part that server stored (the client asks where it stands, then sends the rest).
//!
//! An upload is its owner's (the uploading token's number) and belongs to the repository it
//! was started in: it is unknown to any other token or under any other name. Its bytes are
//! stored as parts of at most [`PART`] bytes, each written whole and once; a request that brings an
//! upload's bytes from the first one also stores their SHA-256, so ending the upload needs no
//! second read of them. The uploads are bounded ([`Limits`]): the bytes their parts hold, in
//! all and per owner, as listed from the store, so every server counts the same.
//! [`Uploads::sweep`], which servers run while they serve, removes an upload that received
//! nothing for [`UPLOAD_IDLE`] and an uploaded blob that no manifest took in within
//! [`STAGED_FOR`], by the store's modification times.

use crate::digest::{Digest, Hashing};
use crate::error::{RegistryError, Result};
use gstore_store::backend::{Backend, Listed};
use gstore_store::format::key::{ObjectKey, UploadKey};
use gstore_store::StoreError;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, SystemTime};

/// How long an upload in progress is kept after it last received bytes.
pub const UPLOAD_IDLE: Duration = Duration::from_secs(3600);

/// How long an uploaded blob that no manifest names is kept.
pub const STAGED_FOR: Duration = Duration::from_secs(24 * 3600);

/// The most bytes of one stored part: what a request holds in memory before storing it.
pub const PART: usize = 16 << 20;

/// The most bytes the uploads hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// In all.
    pub total: u64,
    /// For one owner.
    pub per_owner: u64,
}

/// The registry's uploads in a store.
pub struct Uploads {
    backend: Backend,
    limits: Limits,
}

/// What the store holds of one upload, as listed.
#[derive(Debug, Default)]
struct Listing {
    /// The repository it was started in.
    repo: Option<String>,
    /// Its parts: offset → length.
    parts: BTreeMap<u64, u64>,
    /// The ends before which its bytes' SHA-256 is stored.
    hashed: Vec<u64>,
}

impl Listing {
    /// The bytes received: the parts that follow each other from the first byte. A part past
    /// a gap (never written by gstore) is not counted.
    fn received(&self) -> u64 {
        let mut end = 0;
        for (&at, &len) in &self.parts {
            if at != end {
                break;
            }
            end += len;
        }
        end
    }
}

/// An upload's bytes being stored: appended a part at a time ([`PART`]), each checked
/// against the limits before it is written.
pub struct Appending<'a> {
    uploads: &'a Uploads,
    owner: u64,
    id: String,
    limit: u64,
    at: u64,
    piece: Vec<u8>,
    /// The SHA-256 of the bytes so far, when this writer has them all from the first.
    hashing: Option<Hashing>,
}

/// An uploaded blob waiting for its manifest.
#[derive(Clone, Debug)]
pub struct Staged {
    owner: u64,
    id: String,
    /// Its parts: offset → length.
    parts: Vec<(u64, u64)>,
}

impl Staged {
    /// Its length in bytes.
    pub fn size(&self) -> u64 {
        self.parts.iter().map(|(_, len)| len).sum()
    }
}

/// Reads a staged blob's parts in order.
pub struct StagedReader<'a> {
    backend: &'a Backend,
    staged: Staged,
    next: usize,
    piece: bytes::Bytes,
}

impl Read for StagedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.piece.is_empty() {
            let Some(&(offset, len)) = self.staged.parts.get(self.next) else { return Ok(0) };
            let key = part_key(self.staged.owner, &self.staged.id, offset);
            let got = self.backend.get(&key).map_err(std::io::Error::other)?;
            if got.len() as u64 != len {
                return Err(std::io::Error::other(format!("{key}: {} bytes, listed as {len}", got.len())));
            }
            self.piece = got;
            self.next += 1;
        }
        let n = buf.len().min(self.piece.len());
        buf[..n].copy_from_slice(&self.piece[..n]);
        self.piece = self.piece.slice(n..);
        Ok(n)
    }
}

fn part_key(owner: u64, id: &str, offset: u64) -> ObjectKey {
    ObjectKey::Upload(UploadKey::Part { owner, id: id.to_string(), offset })
}

/// Whether `id` can name an upload (32 lowercase hex digits); any other is unknown.
fn well_formed(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Uploads {
    /// The uploads kept in `backend`, bounded by `limits`.
    pub fn new(backend: Backend, limits: Limits) -> Uploads {
        Uploads { backend, limits }
    }

    /// The bytes the uploads' parts hold: in all, and `owner`'s.
    fn held(&self, owner: u64) -> Result<(u64, u64)> {
        let (mut total, mut mine) = (0, 0);
        for l in self.backend.list(UploadKey::PREFIX)? {
            if let ObjectKey::Upload(u @ UploadKey::Part { .. }) = &l.key {
                total += l.size;
                if u.owner() == owner {
                    mine += l.size;
                }
            }
        }
        Ok((total, mine))
    }

    /// Whether `owner` may add `more` bytes, its own bound being `limit` (at most
    /// [`Limits::per_owner`]).
    fn room(&self, owner: u64, limit: u64, more: u64) -> Result<()> {
        let (total, mine) = self.held(owner)?;
        let over = |held: u64, limit: u64, whose: &str| {
            RegistryError::UploadLimit(format!(
                "{whose} uploads waiting in the store would hold {} bytes, over the limit of {limit}: finish, cancel or push the manifests of the uploads in progress",
                held.saturating_add(more)
            ))
        };
        if mine.saturating_add(more) > limit.min(self.limits.per_owner) {
            let whose = if limit < self.limits.per_owner {
                "this token's quota leaves room for its images' stored bytes and its"
            } else {
                "this token's"
            };
            return Err(over(mine, limit.min(self.limits.per_owner), whose));
        }
        if total.saturating_add(more) > self.limits.total {
            return Err(over(total, self.limits.total, "the"));
        }
        Ok(())
    }

    /// What the store holds of upload `id` of `owner`.
    fn list_upload(&self, owner: u64, id: &str) -> Result<Listing> {
        let mut l = Listing::default();
        for listed in self.backend.list(&UploadKey::upload_prefix(owner, id))? {
            match listed.key {
                ObjectKey::Upload(UploadKey::Started { repo, .. }) => l.repo = Some(repo),
                ObjectKey::Upload(UploadKey::Part { offset, .. }) => {
                    l.parts.insert(offset, listed.size);
                }
                ObjectKey::Upload(UploadKey::Sha256 { end, .. }) => l.hashed.push(end),
                _ => {}
            }
        }
        Ok(l)
    }

    /// [`Uploads::list_upload`], for a request: unknown unless the upload was started in `repo`.
    fn listing(&self, owner: u64, repo: &str, id: &str) -> Result<Listing> {
        let unknown = || RegistryError::BlobUploadUnknown(id.to_string());
        if !well_formed(id) {
            return Err(unknown());
        }
        let l = self.list_upload(owner, id)?;
        if l.repo.as_deref() != Some(repo) {
            return Err(unknown());
        }
        Ok(l)
    }

    /// Starts an upload in repository `repo` for `owner`, who says it brings at least
    /// `declared` bytes and may hold `limit`; returns its id. Refused when that would pass
    /// the limits.
    pub fn start(&self, repo: &str, owner: u64, declared: u64, limit: u64) -> Result<String> {
        self.room(owner, limit, declared)?;
        let id = hex::encode(rand::random::<[u8; 16]>());
        let key = ObjectKey::Upload(UploadKey::Started { owner, id: id.clone(), repo: repo.to_string() });
        self.backend.put(&key, Vec::new())?;
        Ok(id)
    }

    /// Bytes received so far by upload `id` of `owner` in repository `repo`.
    pub fn received(&self, owner: u64, repo: &str, id: &str) -> Result<u64> {
        Ok(self.listing(owner, repo, id)?.received())
    }

    /// Appends to upload `id` of `owner` in `repo` from byte `from` (where a client says its
    /// bytes start; none: where the upload stands), `owner` holding at most `limit`, which a
    /// body of `declared` bytes must leave room for. A start other than where the upload
    /// stands is refused ([`RegistryError::RangeInvalid`]).
    pub fn append(
        &self,
        owner: u64,
        repo: &str,
        id: &str,
        from: Option<u64>,
        limit: u64,
        declared: Option<u64>,
    ) -> Result<Appending<'_>> {
        let at = self.listing(owner, repo, id)?.received();
        if from.is_some_and(|f| f != at) {
            return Err(RegistryError::RangeInvalid(format!(
                "the upload has {at} bytes; the request's start, {}, must be that",
                from.unwrap_or_default()
            )));
        }
        if let Some(n) = declared {
            self.room(owner, limit, n)?;
        }
        Ok(Appending {
            uploads: self,
            owner,
            id: id.to_string(),
            limit,
            at,
            piece: Vec::new(),
            hashing: (at == 0).then(Hashing::default),
        })
    }

    /// Ends upload `id` of `owner` in `repo` as blob `digest`: its bytes are checked against
    /// the digest (a mismatch removes the upload) and kept until a manifest takes them in.
    /// Returns the blob's length.
    pub fn finish(&self, owner: u64, repo: &str, id: &str, digest: &Digest) -> Result<u64> {
        let l = self.listing(owner, repo, id)?;
        let end = l.received();
        let stored = if l.hashed.contains(&end) {
            let key = ObjectKey::Upload(UploadKey::Sha256 { owner, id: id.to_string(), end });
            String::from_utf8(self.backend.get(&key)?.to_vec()).ok()
        } else {
            None
        };
        let got = match stored.and_then(|hex| Digest::parse(&format!("sha256:{hex}")).ok()) {
            Some(d) => d,
            None => {
                let mut hashing = Hashing::default();
                let staged = Staged { owner, id: id.to_string(), parts: in_order(&l, end) };
                std::io::copy(&mut self.reader(&staged), &mut hashing)
                    .map_err(|e| RegistryError::io("reading", std::path::Path::new("an upload"), e))?;
                hashing.finish().0
            }
        };
        if &got != digest {
            self.remove(owner, id)?;
            return Err(RegistryError::DigestInvalid(format!("the upload's bytes are {got}, not {digest}")));
        }
        let key = ObjectKey::Upload(UploadKey::Staged { owner, digest: digest.hex().to_string(), id: id.to_string() });
        self.backend.put(&key, end.to_string().into_bytes())?;
        Ok(end)
    }

    /// Removes upload `id` of `owner` in repository `repo`.
    pub fn cancel(&self, owner: u64, repo: &str, id: &str) -> Result<()> {
        self.listing(owner, repo, id)?;
        self.remove(owner, id)
    }

    /// Removes every object of upload `id` of `owner`, its bytes first.
    fn remove(&self, owner: u64, id: &str) -> Result<()> {
        let mut listed = self.backend.list(&UploadKey::upload_prefix(owner, id))?;
        // The record saying where it was started goes last: an upload cut short here stays
        // known, and is removed again by a retry or the sweep.
        listed.sort_by_key(|l| matches!(l.key, ObjectKey::Upload(UploadKey::Started { .. })));
        for l in listed {
            self.backend.delete(&l.key)?;
        }
        Ok(())
    }

    /// Blob `digest` as `owner` uploaded it, waiting for a manifest.
    pub fn staged(&self, owner: u64, digest: &Digest) -> Result<Option<Staged>> {
        let mut listed = self.backend.list(&UploadKey::staged_prefix(owner, digest.hex()))?;
        listed.sort_by_key(|l| std::cmp::Reverse(l.modified));
        for l in listed {
            let ObjectKey::Upload(UploadKey::Staged { id, .. }) = &l.key else { continue };
            // Its length as the upload ended; parts found short of it (an upload being
            // removed) do not make the blob.
            let Some(size) =
                self.backend.get_opt(&l.key)?.and_then(|b| std::str::from_utf8(&b).ok()?.parse::<u64>().ok())
            else {
                continue;
            };
            let found = self.list_upload(owner, id)?;
            if found.received() == size {
                return Ok(Some(Staged { owner, parts: in_order(&found, size), id: id.clone() }));
            }
        }
        Ok(None)
    }

    /// A reader of a staged blob's bytes.
    pub fn reader(&self, staged: &Staged) -> StagedReader<'_> {
        StagedReader { backend: &self.backend, staged: staged.clone(), next: 0, piece: bytes::Bytes::new() }
    }

    /// Removes the blobs `owner` uploaded as `digests`, which a stored manifest has taken in.
    pub fn taken_in(&self, owner: u64, digests: &[&Digest]) -> Result<()> {
        for d in digests {
            // The staged record first: a blob is staged only while its upload is whole.
            for l in self.backend.list(&UploadKey::staged_prefix(owner, d.hex()))? {
                let ObjectKey::Upload(u) = &l.key else { continue };
                self.backend.delete(&l.key)?;
                self.remove(owner, u.id())?;
            }
        }
        Ok(())
    }

    /// Removes uploads that received nothing for [`UPLOAD_IDLE`] and uploaded blobs staged
    /// longer than [`STAGED_FOR`] (by the store's modification times); returns how many.
    pub fn sweep(&self) -> Result<usize> {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
        let older = |l: &Listed, age: Duration| l.modified > 0 && now.saturating_sub(l.modified) > age.as_secs();
        // By upload: its newest write, and whether it ended as a staged blob.
        let mut newest: BTreeMap<(u64, String), u64> = BTreeMap::new();
        let mut staged: Vec<Listed> = Vec::new();
        for l in self.backend.list(UploadKey::PREFIX)? {
            let ObjectKey::Upload(u) = &l.key else { continue };
            if let UploadKey::Staged { .. } = u {
                staged.push(l);
                continue;
            }
            let at = newest.entry((u.owner(), u.id().to_string())).or_default();
            *at = (*at).max(l.modified);
        }
        let mut removed = 0;
        for l in &staged {
            let ObjectKey::Upload(u) = &l.key else { continue };
            let upload = (u.owner(), u.id().to_string());
            if older(l, STAGED_FOR) || !newest.contains_key(&upload) {
                self.backend.delete(&l.key)?;
                self.remove(upload.0, &upload.1)?;
                removed += 1;
            }
            newest.remove(&upload);
        }
        for ((owner, id), at) in newest {
            if at > 0 && now.saturating_sub(at) > UPLOAD_IDLE.as_secs() {
                self.remove(owner, &id)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// The parts of an upload before `end`, in order.
fn in_order(l: &Listing, end: u64) -> Vec<(u64, u64)> {
    l.parts.iter().map(|(&at, &len)| (at, len)).take_while(|(at, _)| *at < end).collect()
}

impl Appending<'_> {
    /// Takes `bytes`, storing a part whenever [`PART`] bytes are held.
    pub fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(PART - self.piece.len());
            self.piece.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.piece.len() == PART {
                self.store_part()?;
            }
        }
        Ok(())
    }

    /// Stores the bytes held as the next part, once the limits allow them.
    fn store_part(&mut self) -> Result<()> {
        if self.piece.is_empty() {
            return Ok(());
        }
        let len = self.piece.len() as u64;
        self.uploads.room(self.owner, self.limit, len)?;
        if let Some(h) = &mut self.hashing {
            h.write_all(&self.piece).expect("hashing does not fail");
        }
        // Written once: two requests appending at once cannot both write these bytes.
        let piece = std::mem::take(&mut self.piece);
        self.uploads.backend.create_record(&part_key(self.owner, &self.id, self.at), piece).map_err(|e| match e {
            StoreError::AlreadyExists { .. } => RegistryError::RangeInvalid(format!(
                "another request wrote bytes {}.. of the upload at the same time; ask where it stands",
                self.at
            )),
            e => e.into(),
        })?;
        self.at += len;
        Ok(())
    }

    /// Stores what is held; returns where the upload stands. When this writer had every byte
    /// from the first, their SHA-256 is stored too.
    pub fn finish(&mut self) -> Result<u64> {
        self.store_part()?;
        if let Some(h) = self.hashing.take() {
            let (digest, _) = h.finish();
            let key = ObjectKey::Upload(UploadKey::Sha256 { owner: self.owner, id: self.id.clone(), end: self.at });
            self.uploads.backend.create_record(&key, digest.hex().as_bytes().to_vec())?;
        }
        Ok(self.at)
    }

    /// Removes the upload (its bytes passed a limit, or its request failed).
    pub fn abandon(&self) -> Result<()> {
        self.uploads.remove(self.owner, &self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOMY: Limits = Limits { total: 1 << 30, per_owner: 1 << 30 };

    fn uploads(dir: &std::path::Path, limits: Limits) -> Uploads {
        Uploads::new(Backend::local(dir).unwrap(), limits)
    }

    /// Appends `bytes` to upload `id` of `repo`, as a server does.
    fn append(u: &Uploads, owner: u64, repo: &str, id: &str, bytes: &[u8]) -> Result<u64> {
        let mut a = u.append(owner, repo, id, None, u64::MAX, None)?;
        let stored = a.write(bytes).and_then(|()| a.finish());
        if stored.is_err() {
            a.abandon()?;
        }
        stored
    }

    fn read(u: &Uploads, s: &Staged) -> Vec<u8> {
        let mut out = Vec::new();
        u.reader(s).read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn uploads_are_checked_against_their_digest_and_read_back_from_any_server() {
        let tmp = tempfile::tempdir().unwrap();
        let (one, two) = (uploads(tmp.path(), ROOMY), uploads(tmp.path(), ROOMY));
        let id = one.start("web", 1, 0, u64::MAX).unwrap();
        append(&one, 1, "web", &id, b"hello").unwrap();
        assert_eq!(two.received(1, "web", &id).unwrap(), 5, "another server sees the bytes");
        let wrong = Digest::of(b"other");
        assert!(matches!(two.finish(1, "web", &id, &wrong), Err(RegistryError::DigestInvalid(_))));
        assert!(
            matches!(one.received(1, "web", &id), Err(RegistryError::BlobUploadUnknown(_))),
            "a wrong upload is gone"
        );
        assert!(one.staged(1, &wrong).unwrap().is_none());

        // Bytes over more than one part, from two requests on two servers: no stored hash
        // covers them all, so ending it reads them back.
        let big: Vec<u8> = (0..PART + PART / 2 + 7).map(|i| (i * 7 % 251) as u8).collect();
        let id = one.start("web", 1, 0, u64::MAX).unwrap();
        append(&one, 1, "web", &id, &big[..PART + 3]).unwrap();
        let mut a = two.append(1, "web", &id, Some(PART as u64 + 3), u64::MAX, None).unwrap();
        a.write(&big[PART + 3..]).unwrap();
        assert_eq!(a.finish().unwrap(), big.len() as u64);
        assert!(matches!(one.append(1, "web", &id, Some(3), u64::MAX, None), Err(RegistryError::RangeInvalid(_))));
        let d = Digest::of(&big);
        assert_eq!(one.finish(1, "web", &id, &d).unwrap(), big.len() as u64);
        let s = two.staged(1, &d).unwrap().unwrap();
        assert_eq!((s.size(), read(&two, &s) == big), (big.len() as u64, true));
        assert!(one.staged(2, &d).unwrap().is_none(), "another token does not see it");
        two.taken_in(1, &[&d]).unwrap();
        assert!(one.staged(1, &d).unwrap().is_none());
        assert!(one.backend.list(UploadKey::PREFIX).unwrap().is_empty(), "nothing left");
        assert!(matches!(one.received(1, "web", "../../etc/passwd"), Err(RegistryError::BlobUploadUnknown(_))));
    }

    #[test]
    fn uploads_belong_to_their_owner_and_repository_and_stay_within_the_limits() {
        let tmp = tempfile::tempdir().unwrap();
        let u = uploads(tmp.path(), Limits { total: 100, per_owner: 60 });
        let a = u.start("web", 1, 0, u64::MAX).unwrap();
        assert!(matches!(u.received(1, "team-a", &a), Err(RegistryError::BlobUploadUnknown(_))));
        assert!(matches!(u.received(2, "web", &a), Err(RegistryError::BlobUploadUnknown(_))));
        assert!(matches!(u.cancel(1, "team-a", &a), Err(RegistryError::BlobUploadUnknown(_))));
        append(&u, 1, "web", &a, &[1; 50]).unwrap();
        let b = u.start("web", 1, 0, u64::MAX).unwrap();
        assert!(matches!(append(&u, 1, "web", &b, &[1; 11]), Err(RegistryError::UploadLimit(_))), "per owner");
        assert!(matches!(u.start("web", 1, 11, u64::MAX), Err(RegistryError::UploadLimit(_))), "declared");
        assert!(matches!(u.start("web", 3, 11, 10), Err(RegistryError::UploadLimit(_))), "the caller's bound");
        let c = u.start("web", 2, 0, u64::MAX).unwrap();
        append(&u, 2, "web", &c, &[2; 50]).unwrap();
        let d = u.start("web", 2, 0, u64::MAX).unwrap();
        assert!(matches!(append(&u, 2, "web", &d, &[2; 1]), Err(RegistryError::UploadLimit(_))), "in all");
        // Finished, the bytes still count until a manifest takes them in.
        let digest = Digest::of(&[1; 50]);
        u.finish(1, "web", &a, &digest).unwrap();
        assert!(matches!(u.start("web", 2, 1, u64::MAX), Err(RegistryError::UploadLimit(_))));
        u.taken_in(1, &[&digest]).unwrap();
        u.start("web", 2, 10, u64::MAX).unwrap();
        u.cancel(2, "web", &c).unwrap();
        assert_eq!(u.held(1).unwrap(), (0, 0));
    }

    #[test]
    fn idle_uploads_and_old_staged_blobs_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let u = uploads(tmp.path(), ROOMY);
        let (old, fresh, kept) = (
            u.start("web", 1, 0, u64::MAX).unwrap(),
            u.start("web", 1, 0, u64::MAX).unwrap(),
            u.start("web", 1, 0, u64::MAX).unwrap(),
        );
        append(&u, 1, "web", &old, b"abandoned").unwrap();
        append(&u, 1, "web", &fresh, b"busy").unwrap();
        append(&u, 1, "web", &kept, b"staged").unwrap();
        let d = Digest::of(b"staged");
        u.finish(1, "web", &kept, &d).unwrap();
        let age = |id: &str, by: Duration| {
            for l in u.backend.list(UploadKey::PREFIX).unwrap() {
                let ObjectKey::Upload(k) = &l.key else { continue };
                if k.id() == id {
                    let path = tmp.path().join(l.key.to_string());
                    let f = std::fs::File::options().write(true).open(&path).unwrap();
                    f.set_modified(SystemTime::now() - by - Duration::from_secs(60)).unwrap();
                }
            }
        };
        age(&old, UPLOAD_IDLE);
        age(&kept, UPLOAD_IDLE);
        assert_eq!(u.sweep().unwrap(), 1, "the idle upload; a staged blob waits longer");
        assert!(matches!(u.received(1, "web", &old), Err(RegistryError::BlobUploadUnknown(_))));
        assert_eq!(u.received(1, "web", &fresh).unwrap(), 4);
        assert!(u.staged(1, &d).unwrap().is_some());
        age(&kept, STAGED_FOR);
        assert_eq!(u.sweep().unwrap(), 1);
        assert!(u.staged(1, &d).unwrap().is_none());
        assert_eq!(u.held(1).unwrap(), (4, 4));
    }
}
