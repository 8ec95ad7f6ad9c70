//! Restore profiles: which memory a restored process needed first, stored beside its image
//! (`profiles/<xx>/<manifest id>.profile`) so that the next lazy restore fills that memory
//! first. A profile is only a hint: a missing or unreadable one changes the fill order, never
//! what is restored. FORMAT.md describes the object.

use crate::error::{FormatError, Result};
use crate::id::ObjectId;
use crate::record;
use crate::ObjectKind;
use serde::{Deserialize, Serialize};

/// Format version of a stored profile.
pub const PROFILE_FORMAT: u32 = 1;
/// Largest profile accepted (a 2 MiB segment per entry: ~1 TiB of memory).
pub const MAX_PROFILE_BYTES: usize = 16 << 20;

/// Memory segments in the order a restored process first needed them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// [`PROFILE_FORMAT`].
    pub format: u32,
    /// The segment size the offsets refer to.
    pub segment_bytes: u64,
    /// (pid, offset in that process's pages file) of each segment, first needed first.
    pub order: Vec<(u32, u64)>,
}

impl record::Versioned for Profile {
    const FORMAT: u32 = PROFILE_FORMAT;
    fn format(&self) -> u32 {
        self.format
    }
}

impl Profile {
    /// A profile from first-need order.
    pub fn new(segment_bytes: u64, order: Vec<(u32, u64)>) -> Profile {
        Profile { format: PROFILE_FORMAT, segment_bytes, order }
    }

    /// Parses a stored profile of the image `id`.
    pub fn from_json(bytes: &[u8], id: &ObjectId) -> Result<Profile> {
        let corrupt = |detail: String| FormatError::Corrupt { what: ObjectKind::Profile, key: id.to_hex(), detail };
        if bytes.len() > MAX_PROFILE_BYTES {
            return Err(corrupt(format!("{} bytes, more than the {MAX_PROFILE_BYTES} allowed", bytes.len())));
        }
        let p: Profile = record::decode(bytes, ObjectKind::Profile, &id.to_hex())?;
        if p.segment_bytes == 0 || !p.segment_bytes.is_multiple_of(4096) {
            return Err(corrupt(format!("segment size {} is not a positive multiple of 4096", p.segment_bytes)));
        }
        Ok(p)
    }

    /// The stored form.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a profile serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_it_cannot_use() {
        let id = ObjectId::of(b"image");
        let p = Profile::new(4096, vec![(7, 8192), (8, 0)]);
        assert_eq!(Profile::from_json(&p.to_json(), &id).expect("round trip"), p);
        let bad = |json: &str| Profile::from_json(json.as_bytes(), &id).expect_err(json).to_string();
        assert!(bad("{").contains("corrupt profile"));
        assert!(bad(r#"{"format":2,"segment_bytes":4096,"order":[]}"#).contains("format 2"));
        assert!(bad(r#"{"format":1,"segment_bytes":100,"order":[[1,0]]}"#).contains("multiple of 4096"));
        assert!(bad(r#"{"format":1,"segment_bytes":0,"order":[]}"#).contains("multiple of 4096"));
        assert!(bad(r#"{"format":1,"segment_bytes":4096,"order":[],"x":1}"#).contains("unknown field"));
        let huge = vec![b' '; MAX_PROFILE_BYTES + 1];
        assert!(Profile::from_json(&huge, &id).expect_err("too big").to_string().contains("more than"));
    }
}
