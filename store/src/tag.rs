//! Tags: `name[:version]` → manifest id, with the history of earlier values.

use crate::error::{Result, StoreError};
use crate::id::ObjectId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The version a tag gets when none is given.
pub const DEFAULT_VERSION: &str = "latest";
/// How many earlier values a tag remembers.
pub const HISTORY_LIMIT: usize = 100;
const MAX_PART_LEN: usize = 128;

/// A validated tag reference: name and version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TagRef {
    /// Tag name: `[A-Za-z0-9_][A-Za-z0-9._-]*`, at most 128 bytes.
    pub name: String,
    /// Tag version, same alphabet; `latest` when not given.
    pub version: String,
}

fn check_part(what: &str, s: &str, full: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= MAX_PART_LEN
        && !s.starts_with(['.', '-'])
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "invalid tag {full:?}: the {what} must be 1-{MAX_PART_LEN} characters of A-Z a-z 0-9 . _ - and not start with . or -"
        )))
    }
}

impl TagRef {
    /// Parses `name` or `name:version`.
    pub fn parse(s: &str) -> Result<TagRef> {
        let (name, version) = match s.split_once(':') {
            Some((n, v)) => (n, v),
            None => (s, DEFAULT_VERSION),
        };
        check_part("name", name, s)?;
        check_part("version", version, s)?;
        Ok(TagRef { name: name.to_string(), version: version.to_string() })
    }
}

impl fmt::Display for TagRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.version)
    }
}

/// One earlier value of a tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagHistoryItem {
    /// The manifest the tag pointed to.
    pub manifest: String,
    /// When it was set (seconds since the Unix epoch).
    pub set_unix: u64,
}

/// The stored form of a tag (JSON, see docs/FORMAT.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagRecord {
    /// Format version (1).
    pub format: u32,
    /// Tag name.
    pub name: String,
    /// Tag version.
    pub version: String,
    /// Current manifest id (hex).
    pub manifest: String,
    /// When the current value was set.
    pub set_unix: u64,
    /// Earlier values, newest first.
    #[serde(default)]
    pub history: Vec<TagHistoryItem>,
    /// Set when gc's retention removed the tag (seconds since the Unix epoch): the record is
    /// kept so that the removal was a compare-and-swap, and reads treat the tag as absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_unix: Option<u64>,
}

impl TagRecord {
    /// A record pointing `tag` at `manifest`, carrying `previous` into its history.
    pub fn new(tag: &TagRef, manifest: ObjectId, now: u64, previous: Option<TagRecord>) -> TagRecord {
        let mut history = Vec::new();
        if let Some(p) = previous {
            history.push(TagHistoryItem { manifest: p.manifest, set_unix: p.set_unix });
            history.extend(p.history);
            history.truncate(HISTORY_LIMIT);
        }
        TagRecord {
            format: 1,
            name: tag.name.clone(),
            version: tag.version.clone(),
            manifest: manifest.to_hex(),
            set_unix: now,
            history,
            removed_unix: None,
        }
    }

    /// The current manifest id.
    pub fn manifest_id(&self) -> Result<ObjectId> {
        ObjectId::from_hex(&self.manifest)
            .map_err(|_| StoreError::corrupt("tag", self.tag().to_string(), "bad manifest id"))
    }

    /// The tag this record is for.
    pub fn tag(&self) -> TagRef {
        TagRef { name: self.name.clone(), version: self.version.clone() }
    }

    /// Parses a stored record and checks it belongs to `tag`.
    pub fn from_json(bytes: &[u8], tag: &TagRef) -> Result<TagRecord> {
        let r: TagRecord =
            serde_json::from_slice(bytes).map_err(|e| StoreError::corrupt("tag", tag.to_string(), e.to_string()))?;
        if r.format != 1 || &r.tag() != tag {
            return Err(StoreError::corrupt("tag", tag.to_string(), "record names another tag or an unknown format"));
        }
        r.manifest_id()?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_good_and_refuses_tricks() {
        assert_eq!(TagRef::parse("model").unwrap().to_string(), "model:latest");
        assert_eq!(TagRef::parse("m_1.x:v2").unwrap().version, "v2");
        let long = "a".repeat(129);
        for bad in ["", ":v", "a:", "../x", "a/b", "a:b:c", ".hidden", "-x", "a\0b", "a b", long.as_str()] {
            assert!(TagRef::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn history_keeps_previous_values_newest_first() {
        let t = TagRef::parse("m:v").unwrap();
        let r1 = TagRecord::new(&t, ObjectId::of(b"1"), 1, None);
        let r2 = TagRecord::new(&t, ObjectId::of(b"2"), 2, Some(r1.clone()));
        let r3 = TagRecord::new(&t, ObjectId::of(b"3"), 3, Some(r2));
        assert_eq!(r3.history.len(), 2);
        assert_eq!(r3.history[0].manifest, ObjectId::of(b"2").to_hex());
        assert_eq!(r3.history[1].manifest, r1.manifest);
    }
}
