//! Tags: reading, writing (compare-and-swap, keeping history), pinning, listing and resolving
//! references to images, with hints for names that do not exist.

use crate::backend;
use crate::error::{Result, StoreError};
use crate::format::id::ObjectId;
use crate::format::key::{Family, ObjectKey};
use crate::format::tag::{SetTime, TagRecord, TagRef};
use crate::repo::store::Store;
use crate::ObjectKind;
use bytes::Bytes;

/// The manifest id prefix a reference is, lowercased: [`crate::format::tag::ID_LIKE_MIN_LEN`] to 64 hex
/// digits and nothing else (no `:VERSION`).
fn id_prefix(reference: &str) -> Option<String> {
    let hex = reference.bytes().all(|b| b.is_ascii_hexdigit());
    (hex && (crate::format::tag::ID_LIKE_MIN_LEN..=64).contains(&reference.len()))
        .then(|| reference.to_ascii_lowercase())
}

impl Store {
    /// Reads a tag, or `None` if it does not exist.
    pub fn get_tag(&self, tag: &TagRef) -> Result<Option<TagRecord>> {
        Ok(self.get_tag_versioned(tag)?.map(|(r, _)| r).filter(|r| r.removed_unix.is_none()))
    }

    /// Reads a tag record with the version [`Store::put_tag`] can require (a record marked
    /// removed by gc included).
    pub fn get_tag_versioned(&self, tag: &TagRef) -> Result<Option<(TagRecord, backend::Version)>> {
        match self.backend.get_versioned(&ObjectKey::Tag(tag.clone()))? {
            Some((b, v)) => {
                let rec = TagRecord::from_json(&b, tag)?;
                self.check_seen(&[&rec])?;
                Ok(Some((rec, v)))
            }
            None => Ok(None),
        }
    }

    /// Checks tag records just read against the newest values this machine has seen of them
    /// (an encrypted remote store only: [`SeenTags`]), remembering newer ones.
    fn check_seen(&self, records: &[&TagRecord]) -> Result<()> {
        self.seen_tags.as_ref().map_or(Ok(()), |s| s.check(records))
    }

    /// Writes a tag record if the tag is still at `expected` (`None`: if it does not exist):
    /// two writers racing on one tag get one success and one [`StoreError::Conflict`].
    pub fn put_tag(&self, rec: &TagRecord, expected: Option<&backend::Version>) -> Result<()> {
        let json = serde_json::to_vec_pretty(rec).expect("tag serializes");
        self.backend.put_if(&ObjectKey::Tag(rec.tag()), json, expected).map_err(|e| match e {
            StoreError::Conflict(_) => StoreError::lost_race(format_args!("tag {}", rec.tag())),
            other => other,
        })
    }

    /// Points `tag` at `manifest`, keeping the previous value in its history. Fails with
    /// [`StoreError::Conflict`] if another writer points the tag elsewhere in between; a
    /// change that left its value alone (gc trimming its history or removing it) is retried.
    /// A tag whose name reads as a manifest id is refused ([`TagRef::check_new`]).
    pub fn set_tag(&self, tag: &TagRef, manifest: ObjectId) -> Result<TagRecord> {
        tag.check_new()?;
        let key = ObjectKey::Tag(tag.clone());
        let value = |current: &Option<(Bytes, backend::Version)>| {
            // A damaged previous record must not block a new push: start a fresh history. A
            // removed one starts afresh too.
            current.as_ref().and_then(|(b, _)| TagRecord::from_json(b, tag).ok()).filter(|r| r.removed_unix.is_none())
        };
        let mut current = self.backend.get_versioned(&key)?;
        if let Some(rec) = value(&current) {
            self.check_seen(&[&rec])?;
        }
        for _ in 0..8 {
            let previous = value(&current);
            let rec = TagRecord::new(tag, manifest, SetTime::now(), previous.clone());
            match self.put_tag(&rec, current.as_ref().map(|(_, v)| v)) {
                Err(StoreError::Conflict(m)) => {
                    current = self.backend.get_versioned(&key)?;
                    let now = value(&current);
                    let moved = match (&previous, &now) {
                        (Some(a), Some(b)) => a.manifest != b.manifest || a.set_time() != b.set_time(),
                        (None, Some(_)) => true,
                        (_, None) => false,
                    };
                    if moved {
                        return Err(StoreError::Conflict(m));
                    }
                }
                Ok(()) => {
                    self.check_seen(&[&rec])?;
                    return Ok(rec);
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict(format!("tag {tag} keeps changing under this write: retry")))
    }

    /// Pins or unpins `tag` (`gstore pin` / `unpin`): gc's retention never removes a pinned
    /// tag or its current image. A compare-and-swap write, retried while other writers change
    /// the record; returns the record written.
    pub fn set_pinned(&self, tag: &TagRef, pinned: bool) -> Result<TagRecord> {
        for _ in 0..8 {
            let (mut rec, version) = self
                .get_tag_versioned(tag)?
                .filter(|(r, _)| r.removed_unix.is_none())
                .ok_or_else(|| self.no_such_tag(tag))?;
            rec.pinned = pinned;
            match self.put_tag(&rec, Some(&version)) {
                Err(StoreError::Conflict(_)) => continue,
                other => return other.map(|()| rec),
            }
        }
        Err(StoreError::Conflict(format!("tag {tag} keeps changing under this write: retry")))
    }

    /// Removes a tag. Its chunks stay until garbage collection.
    pub fn delete_tag(&self, tag: &TagRef) -> Result<()> {
        if self.get_tag(tag)?.is_none() {
            return Err(self.no_such_tag(tag));
        }
        self.backend.delete(&ObjectKey::Tag(tag.clone()))
    }

    /// Every tag, sorted by name and version. Records that fail to parse are returned as errors
    /// alongside the good ones so that one damaged tag does not hide the rest.
    pub fn list_tags(&self) -> Result<Vec<Result<TagRecord>>> {
        let mut out = Vec::new();
        for l in self.backend.list(Family::Tags.prefix())? {
            let rec = self.backend.get(&l.key);
            let ObjectKey::Tag(tag) = l.key else { continue };
            let rec = rec.and_then(|b| Ok(TagRecord::from_json(&b, &tag)?));
            match rec {
                Ok(r) if r.removed_unix.is_some() => {}
                // Gone between the listing and the read: deleted meanwhile.
                Err(StoreError::NotFound { .. }) => {}
                other => out.push((tag, other)),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        self.check_seen(&out.iter().filter_map(|(_, r)| r.as_ref().ok()).collect::<Vec<_>>())?;
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }

    /// Resolves a reference to an image to its manifest id: `NAME[:VERSION]`, a manifest id,
    /// or an unambiguous prefix of one (at least [`crate::format::tag::ID_LIKE_MIN_LEN`] hex digits, as
    /// `gstore ls` prints them). A reference with a version is always a tag, so a tag an older
    /// gstore let have an id-like name is reached as `NAME:VERSION`. A missing tag is named
    /// with the tags that share its name, or ones spelled alike.
    pub fn resolve(&self, reference: &str) -> Result<ObjectId> {
        if let Some(prefix) = id_prefix(reference) {
            if prefix.len() == 64 {
                return Ok(ObjectId::from_hex(&prefix)?);
            }
            return self.resolve_prefix(&prefix);
        }
        let tag = TagRef::parse(reference)?;
        match self.get_tag(&tag)? {
            Some(r) => Ok(r.manifest_id()?),
            None => Err(self.no_such_tag(&tag)),
        }
    }

    /// The one manifest whose id starts with `prefix` (lowercase hex).
    fn resolve_prefix(&self, prefix: &str) -> Result<ObjectId> {
        let mut found: Vec<ObjectId> = self
            .backend
            .list(Family::Manifests.prefix())?
            .iter()
            .filter_map(|l| l.key.manifest())
            .filter(|id| id.to_hex().starts_with(prefix))
            .collect();
        found.sort();
        match found.len() {
            0 => Err(StoreError::NotFound {
                what: ObjectKind::ImageId,
                key: format!("{prefix} (no image's id starts with it)"),
            }),
            1 => Ok(found[0]),
            n => Err(StoreError::Name {
                name: prefix.to_string(),
                why: format!(
                    "ambiguous: {n} image ids start with it ({}{}); give more digits",
                    found.iter().take(4).map(|id| id.to_hex()[..16].to_string()).collect::<Vec<_>>().join(", "),
                    if n > 4 { ", ..." } else { "" }
                ),
            }),
        }
    }

    /// The error for a tag that does not exist, naming the versions its name has, or tags
    /// whose names are spelled alike.
    fn no_such_tag(&self, tag: &TagRef) -> StoreError {
        StoreError::NotFound {
            what: ObjectKind::Tag,
            key: format!("{tag}{}", self.missing_tag_hint(&tag.name, Some(&tag.version))),
        }
    }

    /// The error for a tag name none of whose versions exists (`gstore log NAME`), naming tags
    /// spelled alike.
    pub fn no_such_tag_name(&self, name: &str) -> StoreError {
        StoreError::NotFound { what: ObjectKind::TagName, key: format!("{name}{}", self.missing_tag_hint(name, None)) }
    }

    /// What to say after a missing tag `name[:version]`: the versions the name has, tags
    /// spelled alike (of the same version, if any), or where to look.
    fn missing_tag_hint(&self, name: &str, version: Option<&str>) -> String {
        let existing: Vec<TagRef> = self
            .list_tags()
            .map(|v| v.into_iter().filter_map(|r| r.ok()).map(|r| r.tag()).collect())
            .unwrap_or_default();
        let versions: Vec<String> = existing.iter().filter(|t| t.name == name).map(|t| t.to_string()).collect();
        if !versions.is_empty() {
            return format!(" ({name} has: {})", versions.join(", "));
        }
        let alike: Vec<&TagRef> =
            existing.iter().filter(|t| crate::format::tag::spelled_alike(&t.name, name)).collect();
        let same_version: Vec<String> =
            alike.iter().filter(|t| Some(t.version.as_str()) == version).map(|t| t.to_string()).collect();
        let mut near = if same_version.is_empty() {
            alike.iter().map(|t| t.name.clone()).collect::<Vec<_>>()
        } else {
            same_version
        };
        near.dedup();
        near.truncate(3);
        if !near.is_empty() {
            format!(" (did you mean {}?)", near.join(" or "))
        } else if name.len() < 8 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            " (an image id needs 8 or more hex digits; gstore ls lists the tags and ids)".to_string()
        } else {
            " (gstore ls lists the tags)".to_string()
        }
    }
}
