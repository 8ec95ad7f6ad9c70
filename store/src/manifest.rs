//! Image manifests: the ordered entries of one image (files, directories, symlinks), each file
//! a list of chunk references. A manifest is a content-addressed object; its id (BLAKE3 of its
//! bytes) is the image's root hash. Byte layout in docs/FORMAT.md.

use crate::error::{Result, StoreError};
use crate::id::ObjectId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Magic bytes at the start of every manifest.
pub const MANIFEST_MAGIC: &[u8; 8] = b"GSMANIF1";
/// Bytes per chunk reference in the chunk table.
pub const CHUNK_REF_LEN: usize = 37;
/// Flag bit: the chunk is all zero bytes and is not stored in any pack.
pub const FLAG_ZERO: u8 = 1;

/// One chunk of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef {
    /// BLAKE3 of the plain bytes.
    pub id: ObjectId,
    /// Plain length in bytes.
    pub len: u32,
    /// All zero bytes: restored as a hole, never fetched.
    pub zero: bool,
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// A regular file with chunks.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (`target` holds where it points).
    Symlink,
}

/// One entry of an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Path relative to the image root, `/`-separated, no `.`/`..` parts.
    pub path: String,
    /// Entry type.
    pub kind: EntryKind,
    /// Unix permission bits.
    pub mode: u32,
    /// Plain size in bytes (files only; 0 otherwise).
    pub size: u64,
    /// Symlink target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Number of chunk references this entry owns in the chunk table.
    #[serde(default)]
    pub chunks: u64,
}

/// The JSON header of a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Header {
    format: u32,
    created_unix: u64,
    #[serde(default)]
    meta: BTreeMap<String, serde_json::Value>,
    entries: Vec<Entry>,
}

/// A decoded manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Seconds since the Unix epoch when the image was pushed.
    pub created_unix: u64,
    /// Free-form metadata (image kind, capture timings, versions, ...).
    pub meta: BTreeMap<String, serde_json::Value>,
    /// Entries in image order.
    pub entries: Vec<Entry>,
    /// All chunk references, entry after entry (`entries[i].chunks` of them each).
    pub chunks: Vec<ChunkRef>,
}

impl Manifest {
    /// Total plain bytes of all files.
    pub fn logical_size(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// The chunk references of each entry, in order, paired with the entry.
    pub fn files(&self) -> impl Iterator<Item = (&Entry, &[ChunkRef])> {
        let mut start = 0usize;
        self.entries.iter().map(move |e| {
            let s = start;
            start += e.chunks as usize;
            (e, &self.chunks[s..start])
        })
    }

    /// Serializes to the on-store byte form.
    pub fn encode(&self) -> Vec<u8> {
        let header = Header {
            format: 1,
            created_unix: self.created_unix,
            meta: self.meta.clone(),
            entries: self.entries.clone(),
        };
        let json = serde_json::to_vec(&header).expect("manifest header serializes");
        let mut out = Vec::with_capacity(16 + json.len() + self.chunks.len() * CHUNK_REF_LEN);
        out.extend_from_slice(MANIFEST_MAGIC);
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        for c in &self.chunks {
            out.extend_from_slice(&c.id.0);
            out.extend_from_slice(&c.len.to_le_bytes());
            out.push(if c.zero { FLAG_ZERO } else { 0 });
        }
        out
    }

    /// Parses and checks a manifest: its hash must equal `id`, and every entry must be sane.
    pub fn decode(bytes: &[u8], id: &ObjectId) -> Result<Manifest> {
        let bad = |d: String| StoreError::corrupt("manifest", id.to_hex(), d);
        if &ObjectId::of(bytes) != id {
            return Err(bad("content does not match its id (BLAKE3 mismatch)".into()));
        }
        if bytes.len() < 12 || &bytes[..8] != MANIFEST_MAGIC {
            return Err(bad("magic missing".into()));
        }
        let json_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let json = bytes.get(12..12 + json_len).ok_or_else(|| bad("header runs past the end".into()))?;
        let header: Header = serde_json::from_slice(json).map_err(|e| bad(format!("header: {e}")))?;
        if header.format != 1 {
            return Err(bad(format!("manifest format {} is not supported", header.format)));
        }
        let table = &bytes[12 + json_len..];
        let total: u64 = header.entries.iter().map(|e| e.chunks).sum();
        if table.len() as u64 != total * CHUNK_REF_LEN as u64 {
            return Err(bad(format!("chunk table holds {} bytes, entries need {total} references", table.len())));
        }
        let chunks: Vec<ChunkRef> = table
            .chunks_exact(CHUNK_REF_LEN)
            .map(|r| ChunkRef {
                id: ObjectId::from_slice(&r[..32]).unwrap(),
                len: u32::from_le_bytes(r[32..36].try_into().unwrap()),
                zero: r[36] & FLAG_ZERO != 0,
            })
            .collect();
        let m = Manifest { created_unix: header.created_unix, meta: header.meta, entries: header.entries, chunks };
        m.check().map_err(bad)?;
        Ok(m)
    }

    /// Structural checks: safe paths, no duplicates, chunk lengths add up to sizes.
    fn check(&self) -> std::result::Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for (e, chunks) in self.files() {
            check_relative_path(&e.path)?;
            if !seen.insert(e.path.as_str()) {
                return Err(format!("entry {:?} appears twice", e.path));
            }
            let sum: u64 = chunks.iter().map(|c| c.len as u64).sum();
            if e.kind == EntryKind::File && sum != e.size {
                return Err(format!("entry {:?}: chunks add up to {sum} bytes, size says {}", e.path, e.size));
            }
            if e.kind != EntryKind::File && !chunks.is_empty() {
                return Err(format!("entry {:?} is not a file but has chunks", e.path));
            }
            if e.kind == EntryKind::Symlink && e.target.is_none() {
                return Err(format!("symlink {:?} has no target", e.path));
            }
        }
        Ok(())
    }
}

/// Accepts only relative, normalized, `/`-separated paths that cannot escape a restore root.
pub fn check_relative_path(p: &str) -> std::result::Result<(), String> {
    if p.is_empty() || p.starts_with('/') || p.contains('\0') || p.contains('\\') {
        return Err(format!("unsafe entry path {p:?}"));
    }
    if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(format!("unsafe entry path {p:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let a = ChunkRef { id: ObjectId::of(b"a"), len: 1, zero: false };
        let z = ChunkRef { id: ObjectId::of(&[0u8; 4]), len: 4, zero: true };
        Manifest {
            created_unix: 1,
            meta: BTreeMap::from([("kind".to_string(), serde_json::json!("files"))]),
            entries: vec![
                Entry { path: "d".into(), kind: EntryKind::Dir, mode: 0o755, size: 0, target: None, chunks: 0 },
                Entry { path: "d/f".into(), kind: EntryKind::File, mode: 0o644, size: 5, target: None, chunks: 2 },
            ],
            chunks: vec![a, z],
        }
    }

    #[test]
    fn round_trip_and_id_check() {
        let m = sample();
        let bytes = m.encode();
        let id = ObjectId::of(&bytes);
        assert_eq!(Manifest::decode(&bytes, &id).unwrap(), m);
        let mut bad = bytes.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(Manifest::decode(&bad, &id).is_err());
    }

    #[test]
    fn escaping_paths_are_refused() {
        for p in ["../x", "/etc/passwd", "a/../../b", "a//b", "", "a/./b", "a\0b"] {
            let mut m = sample();
            m.entries[1].path = p.into();
            let bytes = m.encode();
            let err = Manifest::decode(&bytes, &ObjectId::of(&bytes)).unwrap_err().to_string();
            assert!(err.contains("unsafe entry path"), "{p:?}: {err}");
        }
    }

    #[test]
    fn size_mismatch_is_refused() {
        let mut m = sample();
        m.entries[1].size = 6;
        let bytes = m.encode();
        assert!(Manifest::decode(&bytes, &ObjectId::of(&bytes)).is_err());
    }
}
