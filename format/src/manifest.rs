//! Image manifests: the ordered entries of one image (files, directories, symlinks), each file
//! a list of chunk references. A manifest is a content-addressed object; its id (BLAKE3 of its
//! bytes) is the image's root hash. Byte layout in docs/FORMAT.md.

use crate::error::{FormatError, Result};
use crate::id::ObjectId;
use crate::meta::{ImageMeta, Kind};
use crate::ObjectKind;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Magic bytes at the start of every manifest.
pub const MANIFEST_MAGIC: &[u8; 8] = b"GSMANIF1";
/// Bytes per chunk reference in the chunk table.
pub const CHUNK_REF_LEN: usize = 37;
/// Flag bit: the chunk is all zero bytes and is not stored in any pack.
pub const FLAG_ZERO: u8 = 1;

/// [`Manifest::pieces`] starts each piece at a multiple of this many bytes of its file.
const PIECE_ALIGN: u64 = 4096;

/// What a manifest keeps alive ([`Manifest::references`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct References {
    /// Its chunk references.
    pub chunks: Vec<ChunkRef>,
    /// The images it needs ([`ImageMeta::uses`]).
    pub uses: Vec<ObjectId>,
    /// Why readers refuse it, if they do.
    pub refused: Option<String>,
}

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

impl EntryKind {
    /// Lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "directory",
            EntryKind::Symlink => "symlink",
        }
    }
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
    meta: ImageMeta,
    entries: Vec<Entry>,
}

/// A decoded manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Seconds since the Unix epoch when the image was pushed.
    pub created_unix: u64,
    /// What the image is and how it was made (docs/FORMAT.md, "Image metadata").
    pub meta: ImageMeta,
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

    /// The same image with only the entries `keep` accepts (and their chunk references);
    /// metadata and creation time stay.
    pub fn subset(&self, mut keep: impl FnMut(&Entry) -> bool) -> Manifest {
        let mut out = Manifest {
            created_unix: self.created_unix,
            meta: self.meta.clone(),
            entries: Vec::new(),
            chunks: Vec::new(),
        };
        for (e, chunks) in self.files() {
            if keep(e) {
                out.entries.push(e.clone());
                out.chunks.extend_from_slice(chunks);
            }
        }
        out
    }

    /// The entries below directory `dir` (a relative path), as an image of their own: their
    /// paths lose the `dir/` before them; metadata and creation time stay.
    pub fn within(&self, dir: &str) -> Manifest {
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        let mut out = self.subset(|e| e.path.starts_with(&prefix) && e.path.len() > prefix.len());
        for e in &mut out.entries {
            e.path.drain(..prefix.len());
        }
        out
    }

    /// An image of one entry per byte range of `ranges` (`(path, offset, len)`, files of this
    /// image): each entry holds the whole chunks that cover its range (after zeros up to the
    /// 4 KiB boundary of the file before them: a byte keeps its file offset's alignment), and
    /// is paired with where the range starts in it. Restoring it reads those chunks only (a chunk in two
    /// ranges once). A path that is no file here, or a range past its file's end, is refused.
    pub fn pieces(&self, ranges: &[(String, u64, u64)]) -> Result<(Manifest, Vec<u64>)> {
        let files: HashMap<&str, (&Entry, &[ChunkRef])> =
            self.files().filter(|(e, _)| e.kind == EntryKind::File).map(|(e, c)| (e.path.as_str(), (e, c))).collect();
        let mut out = Manifest {
            created_unix: self.created_unix,
            meta: ImageMeta::default(),
            entries: Vec::new(),
            chunks: Vec::new(),
        };
        let mut skips = Vec::with_capacity(ranges.len());
        for (i, (path, offset, len)) in ranges.iter().enumerate() {
            let (entry, chunks) = files
                .get(path.as_str())
                .ok_or_else(|| FormatError::NotFound { what: ObjectKind::ImageFile, key: path.clone() })?;
            let end = offset.checked_add(*len).filter(|&end| end <= entry.size).ok_or_else(|| FormatError::Entry {
                entry: path.clone(),
                why: format!("{len} bytes at {offset} run past the end of {path} ({} bytes)", entry.size),
            })?;
            let (mut at, mut first, mut picked) = (0u64, None, Vec::new());
            for c in chunks.iter() {
                let next = at + c.len as u64;
                if next > *offset && at < end {
                    first.get_or_insert(at);
                    picked.push(*c);
                }
                at = next;
            }
            // Led by zeros to the page the first chunk starts in, so that the bytes keep their
            // file offset's alignment in a page-aligned buffer.
            let mut start = first.unwrap_or(*offset);
            let lead = start % PIECE_ALIGN;
            if lead > 0 && !picked.is_empty() {
                picked
                    .insert(0, ChunkRef { id: ObjectId::of(&vec![0u8; lead as usize]), len: lead as u32, zero: true });
                start -= lead;
            }
            out.entries.push(Entry {
                path: format!("{i}"),
                kind: EntryKind::File,
                mode: 0o600,
                size: picked.iter().map(|c| c.len as u64).sum(),
                target: None,
                chunks: picked.len() as u64,
            });
            out.chunks.extend(picked);
            skips.push(offset - start);
        }
        Ok((out, skips))
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
        let m = Self::decode_unchecked(bytes, id)?;
        m.check().map_err(|d| FormatError::corrupt(ObjectKind::Manifest, id.to_hex(), d))?;
        Ok(m)
    }

    /// What a manifest references, from bytes that match `id` and whose layout parses,
    /// whether or not its entries would pass [`Manifest::decode`]'s checks: what gc keeps for
    /// a manifest no reader accepts (docs/GC.md). [`References::refused`] says why no reader
    /// accepts it.
    pub fn references(bytes: &[u8], id: &ObjectId) -> Result<References> {
        let m = Self::decode_unchecked(bytes, id)?;
        let refused = m.check().err();
        let uses = m.uses();
        Ok(References { chunks: m.chunks, uses, refused })
    }

    /// The image's kind, if its metadata says.
    pub fn kind(&self) -> Option<&Kind> {
        self.meta.kind.as_ref()
    }

    /// The images this one needs ([`ImageMeta::uses`]); ids that do not parse are left out.
    pub fn uses(&self) -> Vec<ObjectId> {
        self.meta.uses.iter().flatten().filter_map(|hex| ObjectId::from_hex(hex).ok()).collect()
    }

    /// Refuses, before anything is stored or tagged, a manifest that readers would refuse
    /// ([`Manifest::decode`]'s entry checks): every writer calls it.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(|d| FormatError::Refused(format!("the image cannot be stored: {d}")))
    }

    /// Parses the byte layout of a manifest whose hash must equal `id`, without the entry
    /// checks of [`Manifest::decode`]: for gc, which keeps the chunks of any manifest and
    /// dates images by it, never for a restore.
    pub fn decode_unchecked(bytes: &[u8], id: &ObjectId) -> Result<Manifest> {
        let bad = |d: String| FormatError::corrupt(ObjectKind::Manifest, id.to_hex(), d);
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
        // Counts come from untrusted JSON: add them up without overflow, bounded by the table.
        let held = (table.len() / CHUNK_REF_LEN) as u64;
        let total = header.entries.iter().try_fold(0u64, |sum, e| sum.checked_add(e.chunks).filter(|&t| t <= held));
        if total.map(|t| t * CHUNK_REF_LEN as u64) != Some(table.len() as u64) {
            let need = header.entries.iter().fold(0u128, |sum, e| sum + e.chunks as u128);
            return Err(bad(format!("chunk table holds {} bytes, entries need {need} references", table.len())));
        }
        let chunks: Vec<ChunkRef> = table
            .chunks_exact(CHUNK_REF_LEN)
            .map(|r| ChunkRef {
                id: ObjectId::from_slice(&r[..32]).unwrap(),
                len: u32::from_le_bytes(r[32..36].try_into().unwrap()),
                zero: r[36] & FLAG_ZERO != 0,
            })
            .collect();
        Ok(Manifest { created_unix: header.created_unix, meta: header.meta, entries: header.entries, chunks })
    }

    /// Structural checks: safe paths, no duplicates, nothing below an entry that is not a
    /// directory (a symlink or file an entry would be written through), chunk lengths add up
    /// to sizes.
    fn check(&self) -> std::result::Result<(), String> {
        let mut kinds = std::collections::HashMap::with_capacity(self.entries.len());
        for e in &self.entries {
            check_relative_path(&e.path)?;
            if kinds.insert(e.path.as_str(), e.kind).is_some() {
                return Err(format!("entry {:?} appears twice", e.path));
            }
        }
        for e in &self.entries {
            for (i, _) in e.path.match_indices('/') {
                let parent = &e.path[..i];
                match kinds.get(parent) {
                    Some(EntryKind::Dir) | None => {}
                    Some(kind) => {
                        return Err(format!(
                            "entry {:?} lies below {parent:?}, which is a {} and not a directory",
                            e.path,
                            kind.name()
                        ))
                    }
                }
            }
        }
        for (e, chunks) in self.files() {
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

    #[test]
    fn pieces_hold_the_chunks_covering_each_range() {
        let chunk = |n: u8, len: u32| ChunkRef { id: ObjectId::of(&[n]), len, zero: false };
        let file = |path: &str, size: u64, chunks: u64| Entry {
            path: path.into(),
            kind: EntryKind::File,
            mode: 0o644,
            size,
            target: None,
            chunks,
        };
        let m = Manifest {
            created_unix: 1,
            meta: ImageMeta::default(),
            entries: vec![file("a", 60, 3), file("b", 5, 1)],
            chunks: vec![chunk(1, 10), chunk(2, 20), chunk(3, 30), chunk(4, 5)],
        };
        let ranges =
            [("a".to_string(), 12, 10), ("a".to_string(), 5, 30), ("a".to_string(), 60, 0), ("b".to_string(), 0, 5)];
        let (p, skips) = m.pieces(&ranges).unwrap();
        let ids = |i: usize| {
            p.files().nth(i).unwrap().1.iter().map(|c| if c.zero { None } else { Some(c.id) }).collect::<Vec<_>>()
        };
        // The first piece starts at byte 0 of its file: zeros up to the chunk it needs.
        assert_eq!(ids(0), vec![None, Some(ObjectId::of(&[2]))]);
        assert_eq!(ids(1), vec![Some(ObjectId::of(&[1])), Some(ObjectId::of(&[2])), Some(ObjectId::of(&[3]))]);
        assert!(ids(2).is_empty());
        assert_eq!(ids(3), vec![Some(ObjectId::of(&[4]))]);
        assert_eq!(skips, vec![12, 5, 0, 0]);
        assert_eq!(p.entries.iter().map(|e| e.size).collect::<Vec<_>>(), vec![30, 60, 0, 5]);
        assert!(m.pieces(&[("a".to_string(), 50, 11)]).unwrap_err().to_string().contains("run past the end of a"));
        assert!(matches!(m.pieces(&[("c".to_string(), 0, 1)]), Err(FormatError::NotFound { .. })));
    }

    use super::*;

    fn sample() -> Manifest {
        let a = ChunkRef { id: ObjectId::of(b"a"), len: 1, zero: false };
        let z = ChunkRef { id: ObjectId::of(&[0u8; 4]), len: 4, zero: true };
        Manifest {
            created_unix: 1,
            meta: ImageMeta::of_kind(Kind::Other("files".into())),
            entries: vec![
                Entry { path: "d".into(), kind: EntryKind::Dir, mode: 0o755, size: 0, target: None, chunks: 0 },
                Entry { path: "d/f".into(), kind: EntryKind::File, mode: 0o644, size: 5, target: None, chunks: 2 },
            ],
            chunks: vec![a, z],
        }
    }

    #[test]
    fn the_entries_within_a_directory_lose_its_name_and_keep_their_chunks() {
        let m = sample();
        let w = m.within("d");
        assert_eq!(w.entries.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), vec!["f"]);
        assert_eq!(w.chunks, m.chunks);
        assert_eq!(m.within("d/").entries.len(), 1);
        assert!(m.within("f").entries.is_empty() && m.within("f").chunks.is_empty());
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

    fn entry(path: &str, kind: EntryKind, target: Option<&str>) -> Entry {
        Entry { path: path.into(), kind, mode: 0o755, size: 0, target: target.map(Into::into), chunks: 0 }
    }

    fn decode_err(m: &Manifest) -> String {
        let bytes = m.encode();
        Manifest::decode(&bytes, &ObjectId::of(&bytes)).unwrap_err().to_string()
    }

    #[test]
    fn entries_below_a_symlink_or_file_are_refused() {
        let mut m = sample();
        m.entries = vec![
            entry("a", EntryKind::Symlink, Some("/some/outside/dir")),
            entry("a/victim.txt", EntryKind::Symlink, Some("/x")),
        ];
        m.chunks.clear();
        let err = decode_err(&m);
        assert!(err.contains("lies below \"a\", which is a symlink"), "{err}");
        // Order does not matter, nor depth, nor the kind of the entry below.
        m.entries = vec![
            entry("a/b/c", EntryKind::Dir, None),
            entry("a", EntryKind::Dir, None),
            entry("a/b", EntryKind::Symlink, Some("..")),
        ];
        assert!(decode_err(&m).contains("lies below \"a/b\""));
        let mut f = sample();
        f.entries.push(entry("d/f/g", EntryKind::Dir, None));
        assert!(decode_err(&f).contains("which is a file"));
        // A symlink beside a directory of a similar name is fine.
        let mut ok = sample();
        ok.entries.push(entry("dd", EntryKind::Symlink, Some("d")));
        ok.entries.push(entry("d/g", EntryKind::Symlink, Some("f")));
        let bytes = ok.encode();
        assert_eq!(Manifest::decode(&bytes, &ObjectId::of(&bytes)).unwrap(), ok);
    }

    #[test]
    fn writers_refuse_what_readers_refuse_and_gc_still_sees_the_chunks() {
        let mut m = sample();
        m.entries.push(entry("link", EntryKind::Symlink, Some("/tmp")));
        m.entries.push(entry("link/f", EntryKind::Dir, None));
        let err = m.validate().unwrap_err();
        assert!(matches!(err, crate::FormatError::Refused(_)), "{err}");
        assert!(err.to_string().contains("lies below \"link\""), "{err}");
        let bytes = m.encode();
        let id = ObjectId::of(&bytes);
        let refs = Manifest::references(&bytes, &id).unwrap();
        assert_eq!(refs.chunks, m.chunks);
        assert!(refs.uses.is_empty());
        assert!(refs.refused.unwrap().contains("lies below"));
        assert!(sample().validate().is_ok());
        assert!(Manifest::references(&bytes, &ObjectId::of(b"other")).is_err());
    }

    #[test]
    fn chunk_counts_that_overflow_are_refused() {
        let mut m = sample();
        m.chunks.clear();
        m.entries = vec![entry("x", EntryKind::File, None), entry("y", EntryKind::File, None)];
        for e in &mut m.entries {
            e.chunks = 1 << 63;
        }
        let err = decode_err(&m);
        assert!(err.contains("chunk table holds 0 bytes, entries need 18446744073709551616 references"), "{err}");
        m.entries[0].chunks = u64::MAX;
        m.entries[1].chunks = 1;
        assert!(decode_err(&m).contains("chunk table holds 0 bytes"));
    }

    #[test]
    fn size_mismatch_is_refused() {
        let mut m = sample();
        m.entries[1].size = 6;
        let bytes = m.encode();
        assert!(Manifest::decode(&bytes, &ObjectId::of(&bytes)).is_err());
    }
}
