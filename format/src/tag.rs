//! Tags: `name[:version]` → manifest id, with the history of earlier values.

use crate::error::{FormatError, Result};
use crate::id::ObjectId;
use crate::record;
use crate::ObjectKind;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The version a tag gets when none is given.
pub const DEFAULT_VERSION: &str = "latest";
/// How many earlier values a tag remembers.
pub const HISTORY_LIMIT: usize = 100;
const MAX_PART_LEN: usize = 128;

/// Names of this many hex digits or more, and nothing else, are refused for new tags: a
/// reference without a version that is all hex names a manifest id (see [`TagRef::check_new`]).
pub const ID_LIKE_MIN_LEN: usize = 8;

/// True when two tag names are close enough to be a typo of each other: at most one edit
/// (insertion, deletion, substitution or swap of neighbours) per four characters, and at least one.
pub fn spelled_alike(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let limit = (a.len().max(b.len()) / 4).max(1);
    if a.len().abs_diff(b.len()) > limit {
        return false;
    }
    // Optimal string alignment distance.
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()] <= limit
}

/// A validated tag reference: name and version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TagRef {
    /// Tag name: `[A-Za-z0-9_][A-Za-z0-9._-]*`, at most 128 bytes. New tags' names are not
    /// all hex digits ([`TagRef::check_new`]).
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
        Err(FormatError::Name {
            name: format!("invalid tag {full:?}"),
            why: format!(
                "the {what} must be 1-{MAX_PART_LEN} characters of A-Z a-z 0-9 . _ - and not start with . or -"
            ),
        })
    }
}

impl TagRef {
    /// Parses `name` or `name:version`: any tag that may exist, for reading and removing.
    /// Tags that are written use [`TagRef::parse_new`].
    pub fn parse(s: &str) -> Result<TagRef> {
        let (name, version) = match s.split_once(':') {
            Some((n, v)) => (n, v),
            None => (s, DEFAULT_VERSION),
        };
        check_part("name", name, s)?;
        check_part("version", version, s)?;
        Ok(TagRef { name: name.to_string(), version: version.to_string() })
    }

    /// A tag from its two parts (as a tag key holds them), checked as [`TagRef::parse`] does.
    pub fn from_parts(name: &str, version: &str) -> Result<TagRef> {
        let full = format!("{name}/{version}");
        check_part("name", name, &full)?;
        check_part("version", version, &full)?;
        Ok(TagRef { name: name.to_string(), version: version.to_string() })
    }

    /// Parses a tag to write (push, checkpoint, the target of `gstore tag`): as
    /// [`TagRef::parse`], and [`TagRef::check_new`].
    pub fn parse_new(s: &str) -> Result<TagRef> {
        let tag = TagRef::parse(s)?;
        tag.check_new()?;
        Ok(tag)
    }

    /// Refuses a name of [`ID_LIKE_MIN_LEN`] or more hex digits and nothing else: without a
    /// version such a reference is read as a manifest id (or, later, an id prefix), so the tag
    /// would be shadowed. Tags an older gstore wrote with such names stay readable and
    /// removable, written `NAME:VERSION`.
    pub fn check_new(&self) -> Result<()> {
        if self.name.len() >= ID_LIKE_MIN_LEN && self.name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(FormatError::Name {
                name: format!("invalid tag {self}"),
                why: format!(
                    "a name of {ID_LIKE_MIN_LEN} or more hex digits only would read as a manifest id; add a letter \
                     outside a-f or another character"
                ),
            });
        }
        Ok(())
    }
}

impl fmt::Display for TagRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.version)
    }
}

/// When a tag value was set: seconds since the Unix epoch and nanoseconds past them. Ordered
/// by time; records written before nanoseconds were stored read as `nanos` 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetTime {
    /// Whole seconds since the Unix epoch.
    pub unix: u64,
    /// Nanoseconds past `unix` (below 1e9).
    pub nanos: u32,
}

impl SetTime {
    /// The current time.
    pub fn now() -> SetTime {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        SetTime { unix: d.as_secs(), nanos: d.subsec_nanos() }
    }

    /// One nanosecond later.
    fn next(self) -> SetTime {
        if self.nanos + 1 < 1_000_000_000 {
            SetTime { nanos: self.nanos + 1, ..self }
        } else {
            SetTime { unix: self.unix + 1, nanos: 0 }
        }
    }
}

/// One earlier value of a tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagHistoryItem {
    /// The manifest the tag pointed to.
    pub manifest: String,
    /// When it was set (seconds since the Unix epoch).
    pub set_unix: u64,
    /// Nanoseconds past `set_unix` (0 in records of older versions).
    #[serde(default)]
    pub set_nanos: u32,
}

impl TagHistoryItem {
    /// When it was set.
    pub fn set_time(&self) -> SetTime {
        SetTime { unix: self.set_unix, nanos: self.set_nanos }
    }
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
    /// When the current value was set (seconds since the Unix epoch).
    pub set_unix: u64,
    /// Nanoseconds past `set_unix` (0 in records of older versions).
    #[serde(default)]
    pub set_nanos: u32,
    /// Earlier values, newest first.
    #[serde(default)]
    pub history: Vec<TagHistoryItem>,
    /// Set when gc's retention removed the tag (seconds since the Unix epoch): the record is
    /// kept so that the removal was a compare-and-swap, and reads treat the tag as absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_unix: Option<u64>,
    /// Pinned (`gstore pin`): gc's retention never removes the tag or its current image. A
    /// pushed or moved tag stays pinned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

impl record::Versioned for TagRecord {
    const FORMAT: u32 = 1;
    fn format(&self) -> u32 {
        self.format
    }
}

impl TagRecord {
    /// A record pointing `tag` at `manifest`, set at `at`, carrying `previous` into its
    /// history. The new value is dated after the previous one even if the clock says
    /// otherwise (it stepped back), so that a record's values are in time order.
    pub fn new(tag: &TagRef, manifest: ObjectId, at: SetTime, previous: Option<TagRecord>) -> TagRecord {
        let mut history = Vec::new();
        let mut at = at;
        let pinned = previous.as_ref().is_some_and(|p| p.pinned && p.removed_unix.is_none());
        if let Some(p) = previous {
            at = at.max(p.set_time().next());
            // Set again to the image it names: no second row for one value.
            if p.manifest != manifest.to_hex() {
                history.push(TagHistoryItem { manifest: p.manifest, set_unix: p.set_unix, set_nanos: p.set_nanos });
            }
            history.extend(p.history);
            history.truncate(HISTORY_LIMIT);
        }
        TagRecord {
            format: 1,
            name: tag.name.clone(),
            version: tag.version.clone(),
            manifest: manifest.to_hex(),
            set_unix: at.unix,
            set_nanos: at.nanos,
            history,
            removed_unix: None,
            pinned,
        }
    }

    /// When the current value was set.
    pub fn set_time(&self) -> SetTime {
        SetTime { unix: self.set_unix, nanos: self.set_nanos }
    }

    /// The current manifest id.
    pub fn manifest_id(&self) -> Result<ObjectId> {
        ObjectId::from_hex(&self.manifest)
            .map_err(|_| FormatError::corrupt(ObjectKind::Tag, self.tag().to_string(), "bad manifest id"))
    }

    /// The tag this record is for.
    pub fn tag(&self) -> TagRef {
        TagRef { name: self.name.clone(), version: self.version.clone() }
    }

    /// Parses a stored record and checks it belongs to `tag`.
    pub fn from_json(bytes: &[u8], tag: &TagRef) -> Result<TagRecord> {
        let r: TagRecord = record::decode(bytes, ObjectKind::Tag, &tag.to_string())?;
        if &r.tag() != tag {
            return Err(FormatError::corrupt(
                ObjectKind::Tag,
                tag.to_string(),
                format!("the record names tag {}", r.tag()),
            ));
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
    fn names_that_read_as_ids_are_refused_for_new_tags_only() {
        let id = ObjectId::of(b"x").to_hex();
        for bad in [id.as_str(), "deadbeef", "DEADBEEF01", "0123456789:v1"] {
            let tag = TagRef::parse(bad).expect("an existing tag with this name stays readable");
            let err = TagRef::parse_new(bad).unwrap_err().to_string();
            assert!(err.contains("manifest id"), "{bad:?}: {err}");
            assert!(tag.check_new().is_err());
        }
        for good in ["deadbee", "deadbeefg", "cafe-babe01", "v1:0123456789abcdef", "model"] {
            TagRef::parse_new(good).unwrap_or_else(|e| panic!("{good:?} refused: {e}"));
        }
    }

    fn at(unix: u64, nanos: u32) -> SetTime {
        SetTime { unix, nanos }
    }

    #[test]
    fn history_keeps_previous_values_newest_first() {
        let t = TagRef::parse("m:v").unwrap();
        let r1 = TagRecord::new(&t, ObjectId::of(b"1"), at(1, 0), None);
        let r2 = TagRecord::new(&t, ObjectId::of(b"2"), at(2, 5), Some(r1.clone()));
        let r3 = TagRecord::new(&t, ObjectId::of(b"3"), at(3, 0), Some(r2));
        assert_eq!(r3.history.len(), 2);
        assert_eq!(r3.history[0].manifest, ObjectId::of(b"2").to_hex());
        assert_eq!(r3.history[0].set_time(), at(2, 5));
        assert_eq!(r3.history[1].manifest, r1.manifest);
        // Set again to the same image: dated anew, no second row.
        let r4 = TagRecord::new(&t, ObjectId::of(b"3"), at(4, 0), Some(r3.clone()));
        assert_eq!(r4.history.len(), 2);
        assert_eq!(r4.set_time(), at(4, 0));
    }

    #[test]
    fn a_new_value_is_dated_after_the_previous_one() {
        let t = TagRef::parse("m:v").unwrap();
        let r1 = TagRecord::new(&t, ObjectId::of(b"1"), at(7, 999_999_999), None);
        // The clock stepped back, or did not move on.
        let r2 = TagRecord::new(&t, ObjectId::of(b"2"), at(7, 10), Some(r1.clone()));
        assert_eq!(r2.set_time(), at(8, 0));
        let r3 = TagRecord::new(&t, ObjectId::of(b"3"), at(8, 0), Some(r2));
        assert_eq!(r3.set_time(), at(8, 1));
    }

    #[test]
    fn records_without_nanoseconds_still_parse() {
        let t = TagRef::parse("m:v").unwrap();
        let id = ObjectId::of(b"1").to_hex();
        let old = format!(
            r#"{{"format":1,"name":"m","version":"v","manifest":"{id}","set_unix":5,"history":[{{"manifest":"{id}","set_unix":4}}]}}"#
        );
        let r = TagRecord::from_json(old.as_bytes(), &t).unwrap();
        assert_eq!((r.set_time(), r.history[0].set_time()), (at(5, 0), at(4, 0)));
    }
}
