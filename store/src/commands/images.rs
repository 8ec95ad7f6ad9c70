//! What the everyday commands show about images: the tag list with each image's size and
//! time (`gstore ls`), and one image described entry by entry (`gstore show`). Library
//! functions, so the binary and the Python package print the same facts.

use crate::error::Result;
use crate::format::id::ObjectId;
use crate::format::manifest::EntryKind;
use crate::format::meta::ImageMeta;
use crate::format::tag::{TagRecord, TagRef};
use crate::repo::indexed::IndexedStore;
use crate::repo::store::Store;
use serde::Serialize;
use std::collections::BTreeMap;

/// One tag as `ls` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct ImageRow {
    /// `name:version`, or `?` for a tag object that cannot be read.
    pub tag: String,
    /// The manifest id (64 hex), empty when the tag cannot be read.
    pub manifest: String,
    /// When the image was created (unix seconds), if its manifest could be read.
    pub created_unix: Option<u64>,
    /// The same time in RFC 3339 (UTC).
    pub created: Option<String>,
    /// Its plain size in bytes, if its manifest could be read.
    pub logical_bytes: Option<u64>,
    /// Why the tag or its manifest could not be read.
    pub error: Option<String>,
    /// Older images the tag's history keeps alive (gc keeps them until retention trims the
    /// history; `gstore log` lists them).
    pub history: usize,
    /// Whether the tag is pinned (`gstore pin`): retention never removes it.
    pub pinned: bool,
}

/// Every tag, with what its manifest says; unreadable tags and manifests are rows with an
/// error, not a failure of the listing.
pub fn list(store: &Store) -> Result<Vec<ImageRow>> {
    let mut rows = Vec::new();
    for t in store.list_tags()? {
        rows.push(match t {
            Ok(rec) => {
                let m = rec.manifest_id().map_err(crate::StoreError::from).and_then(|id| store.get_manifest(&id));
                ImageRow {
                    tag: rec.tag().to_string(),
                    manifest: rec.manifest.clone(),
                    created_unix: m.as_ref().ok().map(|m| m.created_unix),
                    created: m.as_ref().ok().map(|m| rfc3339(m.created_unix)),
                    logical_bytes: m.as_ref().ok().map(|m| m.logical_size()),
                    error: m.err().map(|e| e.to_string()),
                    history: rec.history.iter().filter(|h| h.manifest != rec.manifest).count(),
                    pinned: rec.pinned,
                }
            }
            Err(e) => ImageRow {
                tag: "?".into(),
                manifest: String::new(),
                created_unix: None,
                created: None,
                logical_bytes: None,
                error: Some(e.to_string()),
                history: 0,
                pinned: false,
            },
        });
    }
    Ok(rows)
}

/// One entry of an image as `show` describes it.
#[derive(Debug, Clone, Serialize)]
pub struct EntryInfo {
    /// Path in the image.
    pub path: String,
    /// File, directory or symlink.
    pub kind: EntryKind,
    /// Permission bits, octal.
    pub mode: String,
    /// Size in bytes (files).
    pub size: u64,
    /// Chunks of the file.
    pub chunks: u64,
    /// Of those, all-zero chunks (stored as markers).
    pub zero_chunks: usize,
    /// A symlink's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// One image, described.
#[derive(Debug, Clone, Serialize)]
pub struct ImageInfo {
    /// Its manifest id.
    pub manifest: ObjectId,
    /// When it was created (unix seconds).
    pub created_unix: u64,
    /// The same time in RFC 3339 (UTC).
    pub created: String,
    /// Its plain size in bytes.
    pub logical_bytes: u64,
    /// Chunk references in the image.
    pub chunks: usize,
    /// The metadata it was pushed with.
    pub meta: ImageMeta,
    /// Its entries, in manifest order.
    pub entries: Vec<EntryInfo>,
}

/// The image `reference` names (`NAME[:VERSION]` or a manifest id), described.
pub fn show(store: &Store, reference: &str) -> Result<ImageInfo> {
    let id: ObjectId = store.resolve(reference)?;
    let m = store.get_manifest(&id)?;
    let entries = m
        .files()
        .map(|(e, chunks)| EntryInfo {
            path: e.path.clone(),
            kind: e.kind,
            mode: format!("{:o}", e.mode),
            size: e.size,
            chunks: e.chunks,
            zero_chunks: chunks.iter().filter(|c| c.zero).count(),
            target: e.target.clone(),
        })
        .collect();
    Ok(ImageInfo {
        manifest: id,
        created_unix: m.created_unix,
        created: rfc3339(m.created_unix),
        logical_bytes: m.logical_size(),
        chunks: m.chunks.len(),
        meta: m.meta.clone(),
        entries,
    })
}

/// A time (unix seconds) in RFC 3339, UTC.
pub fn rfc3339(unix: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix)).to_string()
}

/// One value a tag had, as `gstore log` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    /// The tag (`name:version`).
    pub tag: String,
    /// The manifest id it pointed at (64 hex).
    pub manifest: String,
    /// When the value was set (unix seconds) ...
    pub set_unix: u64,
    /// ... in RFC 3339, UTC.
    pub set: String,
    /// Whether this is the tag's value now.
    pub current: bool,
}

/// Every value the tags of `reference` had, newest first: all versions of a `NAME`, or one
/// `NAME:VERSION`. Tags gstore's retention removed are not listed.
pub fn log(store: &Store, reference: &str) -> Result<Vec<LogEntry>> {
    let records: Vec<TagRecord> = match reference.split_once(':') {
        Some(_) => {
            let tag = TagRef::parse(reference)?;
            store.resolve(reference)?;
            store.get_tag(&tag)?.into_iter().collect()
        }
        None => {
            let all: Vec<TagRecord> =
                store.list_tags()?.into_iter().filter_map(|r| r.ok()).filter(|r| r.name == reference).collect();
            if all.is_empty() {
                TagRef::parse(reference)?;
                return Err(store.no_such_tag_name(reference));
            }
            all
        }
    };
    let mut out = Vec::new();
    for r in &records {
        let tag = r.tag().to_string();
        out.push(entry(&tag, &r.manifest, r.set_unix, r.set_nanos, true));
        for h in &r.history {
            out.push(entry(&tag, &h.manifest, h.set_unix, h.set_nanos, false));
        }
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.1));
    Ok(out.into_iter().map(|(e, _)| e).collect())
}

fn entry(tag: &str, manifest: &str, unix: u64, nanos: u32, current: bool) -> (LogEntry, (u64, u32)) {
    let e =
        LogEntry { tag: tag.to_string(), manifest: manifest.to_string(), set_unix: unix, set: rfc3339(unix), current };
    (e, (unix, nanos))
}

/// How a path differs between two images (serialized in lowercase: `added`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Only in the second image.
    Added,
    /// Only in the first image.
    Removed,
    /// In both, with other contents.
    Changed,
    /// A file in one, a directory or symlink in the other.
    Kind,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Changed => "changed",
            Change::Kind => "kind",
        })
    }
}

/// How one path differs between two images.
#[derive(Debug, Clone, Serialize)]
pub struct FileChange {
    /// Path in the images.
    pub path: String,
    /// How it differs.
    pub change: Change,
    /// Its size in the first image (files), if there.
    pub size_a: Option<u64>,
    /// Its size in the second image (files), if there.
    pub size_b: Option<u64>,
    /// Plain bytes of its chunks in the second image that the first image holds nowhere.
    pub new_bytes: u64,
}

/// What changed from image `a` to image `b` (`gstore diff`).
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    /// The first image's manifest id.
    pub a: String,
    /// The second image's manifest id.
    pub b: String,
    /// Paths that differ, in path order (entries equal in both are left out).
    pub changes: Vec<FileChange>,
    /// Plain bytes of distinct chunks only the first image holds (what it alone adds).
    pub only_in_a_bytes: u64,
    /// Plain bytes of distinct chunks only the second image holds (what it adds to the first).
    pub only_in_b_bytes: u64,
}

/// Compares the images `a` and `b` name, from their manifests alone (no chunk is read).
pub fn diff(store: &Store, a: &str, b: &str) -> Result<Diff> {
    use crate::format::manifest::Manifest;
    use std::collections::HashMap;
    let (ida, idb) = (store.resolve(a)?, store.resolve(b)?);
    let (ma, mb) = (store.get_manifest(&ida)?, store.get_manifest(&idb)?);
    let chunks = |m: &Manifest| -> HashMap<ObjectId, u32> {
        m.chunks.iter().filter(|c| !c.zero).map(|c| (c.id, c.len)).collect()
    };
    let (ca, cb) = (chunks(&ma), chunks(&mb));
    let only = |x: &HashMap<ObjectId, u32>, y: &HashMap<ObjectId, u32>| -> u64 {
        x.iter().filter(|(id, _)| !y.contains_key(id)).map(|(_, &len)| len as u64).sum()
    };
    type Facts = (EntryKind, u64, Vec<ObjectId>, Option<String>);
    let index = |m: &Manifest| -> BTreeMap<String, Facts> {
        m.files()
            .map(|(e, c)| (e.path.clone(), (e.kind, e.size, c.iter().map(|c| c.id).collect(), e.target.clone())))
            .collect()
    };
    let (ea, eb) = (index(&ma), index(&mb));
    let new_bytes = |path: &str| -> u64 {
        mb.files()
            .find(|(e, _)| e.path == path)
            .map(|(_, c)| c.iter().filter(|c| !c.zero && !ca.contains_key(&c.id)).map(|c| c.len as u64).sum())
            .unwrap_or(0)
    };
    let size = |kind: EntryKind, size: u64| (kind == EntryKind::File).then_some(size);
    let mut changes = Vec::new();
    let mut paths: Vec<&String> = ea.keys().chain(eb.keys()).collect();
    paths.sort();
    paths.dedup();
    for path in paths {
        let change = match (ea.get(path), eb.get(path)) {
            (Some(x), Some(y)) if x == y => continue,
            (Some(x), Some(y)) if x.0 != y.0 => Change::Kind,
            (Some(_), Some(_)) => Change::Changed,
            (Some(_), None) => Change::Removed,
            (None, Some(_)) => Change::Added,
            (None, None) => continue,
        };
        changes.push(FileChange {
            path: path.clone(),
            change,
            size_a: ea.get(path).and_then(|x| size(x.0, x.1)),
            size_b: eb.get(path).and_then(|y| size(y.0, y.1)),
            new_bytes: new_bytes(path),
        });
    }
    Ok(Diff {
        a: ida.to_hex(),
        b: idb.to_hex(),
        changes,
        only_in_a_bytes: only(&ca, &cb),
        only_in_b_bytes: only(&cb, &ca),
    })
}

/// Points the new tag `target` (`NAME:VERSION`, which must not exist) at the image `source`
/// names, after checking its manifest reads (`gstore tag`, `Store.tag` in Python).
pub fn tag(store: &IndexedStore, source: &str, target: &str) -> Result<TagRecord> {
    let target = TagRef::parse_new(target)?;
    let id = store.resolve(source)?;
    store.get_manifest(&id)?;
    store.tag_existing(&target, id)
}

/// Removes the tags `names` (`gstore rm`, `Store.rm` in Python), each checked before any is
/// removed; returns them. A name that looks like an image id (hex digits) is refused unless a
/// tag is so named (older versions allowed such names): rm removes tags, not images.
pub fn remove_tags(store: &Store, names: &[&str]) -> Result<Vec<RemovedTag>> {
    let mut tags = Vec::with_capacity(names.len());
    for name in names {
        let tag = TagRef::parse(name)?;
        let record = store.get_tag(&tag)?;
        let id_like = name.len() >= crate::format::tag::ID_LIKE_MIN_LEN && name.bytes().all(|b| b.is_ascii_hexdigit());
        if id_like && record.is_none() {
            return Err(crate::StoreError::Refused(format!(
                "{name} is an image id: rm removes tags (NAME[:VERSION]); `gstore ls` shows the tags pointing at it"
            )));
        }
        store.resolve(&tag.to_string())?;
        tags.push(RemovedTag { pinned: record.is_some_and(|r| r.pinned), tag });
    }
    for t in &tags {
        store.delete_tag(&t.tag)?;
    }
    Ok(tags)
}

/// A tag [`remove_tags`] removed.
#[derive(Debug, Clone)]
pub struct RemovedTag {
    /// The tag.
    pub tag: TagRef,
    /// It was pinned (`gstore pin`): removing it dropped the pin too.
    pub pinned: bool,
}
