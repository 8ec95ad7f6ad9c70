//! Pack objects: chunks appended one after another, then a footer that lists them, then a
//! fixed-size trailer that locates and checksums the footer. Byte layout in docs/FORMAT.md.

use crate::codec::{Codec, DeltaBases};
use crate::error::{FormatError, Result};
use crate::id::ObjectId;
use crate::ObjectKind;
use bytes::Bytes;

/// Magic bytes at the start of every pack.
pub const PACK_MAGIC: &[u8; 8] = b"GSPACK01";
/// Magic bytes at the very end of every pack.
pub const TRAILER_MAGIC: &[u8; 8] = b"GSPKTAIL";
/// Bytes in one footer entry of a version 1 pack.
pub const ENTRY_LEN: usize = 49;
/// Bytes in one footer entry of a version 2 pack: a version 1 entry, then the ids of a delta
/// chunk's two bases (zeros where a chunk has none).
pub const ENTRY_LEN_V2: usize = ENTRY_LEN + 64;
/// Bytes in the trailer.
pub const TRAILER_LEN: usize = 56;
/// Pack layout version written in the trailer of packs without delta chunks (readable by
/// every gstore).
pub const PACK_VERSION: u32 = 1;
/// Pack layout version of packs holding delta chunks: footer entries name each delta's base.
pub const PACK_VERSION_DELTAS: u32 = 2;

/// Bytes in one footer entry of a pack of layout `version`.
fn entry_len(version: u32) -> usize {
    if version == PACK_VERSION_DELTAS {
        ENTRY_LEN_V2
    } else {
        ENTRY_LEN
    }
}

pub use crate::config::PackIds;

/// One chunk as listed in a pack footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackEntry {
    /// BLAKE3 of the chunk's plain bytes.
    pub id: ObjectId,
    /// Offset of the stored bytes from the start of the pack.
    pub offset: u64,
    /// Stored (possibly compressed) length.
    pub stored_len: u32,
    /// Plain (decoded) length.
    pub plain_len: u32,
    /// How the stored bytes decode.
    pub codec: Codec,
    /// For a delta chunk, the chunks it is stored against (its stored bytes name the same);
    /// `None` for every other codec.
    pub bases: Option<DeltaBases>,
}

impl PackEntry {
    fn write_to(&self, out: &mut Vec<u8>, version: u32) {
        out.extend_from_slice(&self.id.0);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.plain_len.to_le_bytes());
        out.push(self.codec as u8);
        if version == PACK_VERSION_DELTAS {
            out.extend_from_slice(&self.bases.map_or([0; 32], |b| b.first.0));
            out.extend_from_slice(&self.bases.and_then(|b| b.second).map_or([0; 32], |b| b.0));
        }
    }

    fn read_from(b: &[u8], pack: &str) -> Result<Self> {
        let bad = |why: String| FormatError::corrupt(ObjectKind::Pack, pack, why);
        let codec = Codec::from_byte(b[48]).ok_or_else(|| bad(format!("unknown codec byte {}", b[48])))?;
        let id = ObjectId::from_slice(&b[..32]).expect("32 bytes");
        // Only a version 2 entry has base fields; all zeros is none.
        let field = |at: usize| b.get(at..at + 32).and_then(ObjectId::from_slice).filter(|b| b.0 != [0; 32]);
        let (first, second) = (field(ENTRY_LEN), field(ENTRY_LEN + 32));
        let bases = match (codec, first, second) {
            (Codec::Delta, Some(first), second) if second != Some(first) => {
                let bases = DeltaBases { first, second };
                if bases.contains(&id) {
                    return Err(bad(format!("delta chunk {} names itself as its base", id.short())));
                }
                Some(bases)
            }
            (Codec::Delta, ..) => return Err(bad(format!("delta chunk {} names no base, or one twice", id.short()))),
            (_, None, None) => None,
            (c, ..) => return Err(bad(format!("{} chunk {} names a base", c.name(), id.short()))),
        };
        Ok(PackEntry {
            id,
            offset: u64::from_le_bytes(b[32..40].try_into().unwrap()),
            stored_len: u32::from_le_bytes(b[40..44].try_into().unwrap()),
            plain_len: u32::from_le_bytes(b[44..48].try_into().unwrap()),
            codec,
            bases,
        })
    }

    /// Why the lengths cannot be those of a chunk of a store with this `chunk_max`, if so: the
    /// plain length is at most `chunk_max`; raw bytes are as long as the plain ones, a zero
    /// chunk stores nothing, and zstd or float lanes are kept only when shorter than the plain bytes.
    fn bad_lengths(&self, chunk_max: u32) -> Option<String> {
        let (stored, plain) = (self.stored_len, self.plain_len);
        if plain > chunk_max {
            return Some(format!("plain length {plain} exceeds the store's chunk max {chunk_max}"));
        }
        let fits = match self.codec {
            Codec::Raw => stored == plain,
            Codec::Zero => stored == 0,
            Codec::Zstd | Codec::Floats => stored <= plain,
            // The base id and a frame, kept only when shorter than the plain bytes.
            Codec::Delta => stored as usize > 33 && stored < plain,
        };
        (!fits).then(|| format!("stored length {stored} does not fit a {} chunk of {plain} bytes", self.codec.name()))
    }
}

/// Accumulates stored chunks for one pack. The chunks are kept as they come and never copied
/// into one buffer: [`PackBuilder::finish`] names the pack ([`PackIds`]) and hands them on as
/// the pieces of the pack, which backends write one after the other. A push appends chunks on
/// one thread and finishes packs on its writers, so any hashing is spread over those.
pub struct PackBuilder {
    salt: [u8; SALT_LEN],
    /// How the finished pack is named.
    ids: PackIds,
    /// Stored chunks, in pack order.
    parts: Vec<Vec<u8>>,
    entries: Vec<PackEntry>,
    /// Bytes of the pack so far (header and chunk data).
    len: u64,
}

/// A finished pack, ready to upload.
pub struct FinishedPack {
    /// The pack id ([`PackIds`]).
    pub id: ObjectId,
    /// The pack's bytes, in pieces (the header, each chunk's stored bytes, the footer and
    /// trailer) that make up the pack one after the other.
    pub pieces: Vec<Bytes>,
    /// Its chunks, in order.
    pub entries: Vec<PackEntry>,
}

/// Length of the salt written after the magic.
pub const SALT_LEN: usize = 16;
/// Bytes of a pack's header: the magic, then the salt.
pub const HEADER_LEN: usize = PACK_MAGIC.len() + SALT_LEN;

/// Bytes no other pack starts with, so that every pack written gets a new id even when it
/// holds the same chunks as an earlier one (which gc may have tombstoned: docs/GC.md, I4).
fn salt() -> [u8; SALT_LEN] {
    ObjectId::unique().0[..SALT_LEN].try_into().expect("16 bytes")
}

impl PackBuilder {
    /// Starts an empty pack with a fresh random salt, to be named as `ids` says.
    pub fn new(ids: PackIds) -> Self {
        Self::with_salt(salt(), ids)
    }

    /// Starts an empty pack with the given salt (deterministic simulations choose their own).
    pub fn with_salt(salt: [u8; SALT_LEN], ids: PackIds) -> Self {
        PackBuilder { salt, ids, parts: Vec::new(), entries: Vec::new(), len: HEADER_LEN as u64 }
    }

    /// Appends one stored chunk (copied).
    pub fn push(&mut self, id: ObjectId, codec: Codec, stored: &[u8], plain_len: u32) {
        self.push_owned(id, codec, stored.to_vec(), plain_len);
    }

    /// Appends one stored chunk, taking its bytes without a copy.
    pub fn push_owned(&mut self, id: ObjectId, codec: Codec, stored: Vec<u8>, plain_len: u32) {
        self.append(id, codec, None, stored, plain_len);
    }

    /// Appends a delta chunk stored against `bases` (`stored` starts with them).
    pub fn push_delta(&mut self, id: ObjectId, bases: DeltaBases, stored: Vec<u8>, plain_len: u32) {
        self.append(id, Codec::Delta, Some(bases), stored, plain_len);
    }

    /// Appends a chunk as a footer entry describes it (a copy of `e`'s chunk, from another pack).
    pub fn push_entry(&mut self, e: &PackEntry, stored: &[u8]) {
        self.append(e.id, e.codec, e.bases, stored.to_vec(), e.plain_len);
    }

    fn append(&mut self, id: ObjectId, codec: Codec, bases: Option<DeltaBases>, stored: Vec<u8>, plain_len: u32) {
        let stored_len = stored.len() as u32;
        self.entries.push(PackEntry { id, offset: self.len, stored_len, plain_len, codec, bases });
        self.len += stored.len() as u64;
        self.parts.push(stored);
    }

    /// Bytes of chunk data so far (header included).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when no chunk has been added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Puts the pack together (header, chunks, footer, trailer) and names it as the store
    /// does ([`PackIds`]). A pack holding delta chunks is written in layout version 2, any
    /// other in version 1.
    pub fn finish(self) -> FinishedPack {
        let version = if self.entries.iter().any(|e| e.bases.is_some()) { PACK_VERSION_DELTAS } else { PACK_VERSION };
        let header = Bytes::from([&PACK_MAGIC[..], &self.salt].concat());
        let mut tail = Vec::with_capacity(self.entries.len() * entry_len(version) + TRAILER_LEN);
        for e in &self.entries {
            e.write_to(&mut tail, version);
        }
        let footer_hash = blake3::hash(&tail);
        tail.extend_from_slice(&self.len.to_le_bytes());
        tail.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        tail.extend_from_slice(&version.to_le_bytes());
        tail.extend_from_slice(footer_hash.as_bytes());
        tail.extend_from_slice(TRAILER_MAGIC);
        let tail = Bytes::from(tail);
        let mut hasher = blake3::Hasher::new();
        hasher.update(&header);
        if self.ids == PackIds::Whole {
            for p in &self.parts {
                hasher.update(p);
            }
        }
        hasher.update(&tail);
        let id = ObjectId(*hasher.finalize().as_bytes());
        let pieces = std::iter::once(header)
            .chain(self.parts.into_iter().map(Bytes::from))
            .chain(std::iter::once(tail))
            .collect();
        FinishedPack { id, pieces, entries: self.entries }
    }
}

impl FinishedPack {
    /// The pack's length in bytes.
    pub fn size(&self) -> u64 {
        self.pieces.iter().map(|p| p.len() as u64).sum()
    }
}

/// Where a pack's footer sits, read from its trailer.
#[derive(Debug, Clone, Copy)]
pub struct Trailer {
    /// Offset of the first footer entry.
    pub footer_offset: u64,
    /// Number of footer entries.
    pub count: u32,
    /// BLAKE3 of the footer entries.
    pub footer_hash: [u8; 32],
    /// Layout version (1, or 2 for packs with delta chunks).
    pub version: u32,
}

/// Parses the last [`TRAILER_LEN`] bytes of a pack of `pack_len` bytes.
pub fn parse_trailer(tail: &[u8], pack_len: u64, pack: &str) -> Result<Trailer> {
    let bad = |d: String| FormatError::corrupt(ObjectKind::Pack, pack, d);
    if pack_len < (PACK_MAGIC.len() + TRAILER_LEN) as u64 || tail.len() != TRAILER_LEN {
        return Err(bad(format!("only {pack_len} bytes long: truncated")));
    }
    if &tail[48..56] != TRAILER_MAGIC {
        return Err(bad("trailer magic missing: truncated or overwritten".into()));
    }
    let version = u32::from_le_bytes(tail[12..16].try_into().unwrap());
    if version != PACK_VERSION && version != PACK_VERSION_DELTAS {
        return Err(bad(format!("pack version {version} is not supported")));
    }
    let t = Trailer {
        footer_offset: u64::from_le_bytes(tail[0..8].try_into().unwrap()),
        count: u32::from_le_bytes(tail[8..12].try_into().unwrap()),
        footer_hash: tail[16..48].try_into().unwrap(),
        version,
    };
    let expect_end = t.footer_offset.checked_add(t.count as u64 * entry_len(version) as u64);
    if expect_end != Some(pack_len - TRAILER_LEN as u64) || t.footer_offset < PACK_MAGIC.len() as u64 {
        return Err(bad(format!(
            "footer at {} with {} entries does not fit a pack of {pack_len} bytes",
            t.footer_offset, t.count
        )));
    }
    Ok(t)
}

/// Parses and checks footer entries against the trailer: checksum, bounds, known codecs, and
/// lengths that fit a store whose chunks are at most `chunk_max` bytes (its config's).
pub fn parse_footer(footer: &[u8], t: &Trailer, pack: &str, chunk_max: u32) -> Result<Vec<PackEntry>> {
    if blake3::hash(footer).as_bytes() != &t.footer_hash {
        return Err(FormatError::corrupt(ObjectKind::Pack, pack, "footer checksum mismatch"));
    }
    let mut entries = Vec::with_capacity(t.count as usize);
    for raw in footer.chunks_exact(entry_len(t.version)) {
        let e = PackEntry::read_from(raw, pack)?;
        let end = e.offset + e.stored_len as u64;
        if e.offset < PACK_MAGIC.len() as u64 || end > t.footer_offset {
            return Err(FormatError::corrupt(
                ObjectKind::Pack,
                pack,
                format!("chunk {} lies outside the data area", e.id.short()),
            ));
        }
        if let Some(why) = e.bad_lengths(chunk_max) {
            return Err(FormatError::corrupt(ObjectKind::Pack, pack, format!("chunk {}: {why}", e.id.short())));
        }
        entries.push(e);
    }
    Ok(entries)
}

/// The [`PackIds::HeaderFooter`] name of a pack with this header (magic and salt) and tail
/// (footer entries, then trailer).
pub fn header_footer_id(header: &[u8], tail: &[u8]) -> ObjectId {
    let mut hasher = blake3::Hasher::new();
    hasher.update(header).update(tail);
    ObjectId(*hasher.finalize().as_bytes())
}

/// Whether `id` names the pack `bytes` (checked by [`parse_pack`]) under either [`PackIds`]
/// naming: its header and tail (footer and trailer), else all its bytes.
pub fn is_named(bytes: &[u8], id: &ObjectId) -> bool {
    let trailer =
        bytes.len().checked_sub(TRAILER_LEN).and_then(|at| parse_trailer(&bytes[at..], bytes.len() as u64, "").ok());
    if let Some(at) = trailer.map(|t| t.footer_offset as usize).filter(|&at| at >= HEADER_LEN) {
        if header_footer_id(&bytes[..HEADER_LEN], &bytes[at..]) == *id {
            return true;
        }
    }
    &ObjectId::of(bytes) == id
}

/// Parses a whole pack held in memory: header, trailer, footer (see [`parse_footer`]).
pub fn parse_pack(bytes: &[u8], pack: &str, chunk_max: u32) -> Result<Vec<PackEntry>> {
    if bytes.len() < PACK_MAGIC.len() || &bytes[..8] != PACK_MAGIC {
        return Err(FormatError::corrupt(ObjectKind::Pack, pack, "header magic missing"));
    }
    let len = bytes.len() as u64;
    let t = parse_trailer(&bytes[bytes.len().saturating_sub(TRAILER_LEN)..], len, pack)?;
    parse_footer(&bytes[t.footer_offset as usize..bytes.len() - TRAILER_LEN], &t, pack, chunk_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk max above every test chunk.
    const MAX: u32 = 1 << 20;

    /// The pack's pieces joined: the bytes a backend stores.
    fn joined(p: &FinishedPack) -> Vec<u8> {
        p.pieces.concat()
    }

    fn sample() -> FinishedPack {
        sample_named(PackIds::HeaderFooter)
    }

    fn sample_named(ids: PackIds) -> FinishedPack {
        let mut b = PackBuilder::new(ids);
        b.push(ObjectId::of(b"one"), Codec::Raw, b"one", 3);
        b.push(ObjectId::of(b"two"), Codec::Raw, b"two", 3);
        b.finish()
    }

    #[test]
    fn same_chunks_make_a_new_pack_id() {
        assert_ne!(sample().id, sample().id);
    }

    #[test]
    fn packs_are_named_by_all_their_bytes_or_by_their_header_and_tail() {
        let whole = sample_named(PackIds::Whole);
        assert_eq!(whole.id, ObjectId::of(&joined(&whole)));
        let p = sample();
        let bytes = joined(&p);
        let tail = p.size() as usize - 2 * ENTRY_LEN - TRAILER_LEN;
        assert_eq!(p.id, ObjectId::of(&[&bytes[..24], &bytes[tail..]].concat()));
        for (p, bytes) in [(&whole, joined(&whole)), (&p, bytes.clone())] {
            assert!(is_named(&bytes, &p.id));
            assert!(!is_named(&bytes, &ObjectId::of(b"other")));
        }
        // A header-and-tail name does not cover the chunks' stored bytes (each reader checks
        // those against the chunk ids the tail names); a whole name does.
        let mut changed = joined(&whole);
        changed[24] ^= 1;
        assert!(!is_named(&changed, &whole.id));
        let mut changed = bytes.clone();
        changed[24] ^= 1;
        assert!(is_named(&changed, &p.id));
        for at in (0..24).chain(tail..bytes.len()) {
            let mut changed = bytes.clone();
            changed[at] ^= 1;
            assert!(!is_named(&changed, &p.id), "a flip at {at} keeps the name");
        }
        for n in 0..bytes.len() {
            assert!(!is_named(&bytes[..n], &p.id), "cut to {n} bytes keeps the name");
        }
    }

    #[test]
    fn round_trip() {
        let p = sample();
        let entries = parse_pack(&joined(&p), "p", MAX).unwrap();
        assert_eq!(entries, p.entries);
        assert_eq!(&joined(&p)[entries[1].offset as usize..][..3], b"two");
    }

    #[test]
    fn damage_is_detected() {
        let p = sample();
        // Truncation at every length.
        for n in 0..p.size() as usize {
            assert!(parse_pack(&joined(&p)[..n], "p", MAX).is_err(), "truncated to {n} parsed");
        }
        // A flipped byte anywhere in footer or trailer.
        let footer_start = p.entries.last().map(|e| (e.offset + e.stored_len as u64) as usize).unwrap();
        for i in footer_start..p.size() as usize {
            let mut b = joined(&p);
            b[i] ^= 0x40;
            assert!(parse_pack(&b, "p", MAX).is_err(), "flip at {i} parsed");
        }
    }

    #[test]
    fn packs_with_deltas_name_their_bases_in_version_2() {
        let (base, id) = (ObjectId::of(b"base"), ObjectId::of(b"delta"));
        let bases = DeltaBases { first: base, second: Some(ObjectId::of(b"next")) };
        let mut stored = vec![2];
        stored.extend(bases.iter().flat_map(|b| b.0));
        stored.extend_from_slice(b"frame");
        let mut b = PackBuilder::new(PackIds::HeaderFooter);
        b.push(ObjectId::of(b"one"), Codec::Raw, b"one", 3);
        b.push_delta(id, bases, stored.clone(), 100);
        let p = b.finish();
        let version = |b: &[u8]| u32::from_le_bytes(b[b.len() - 44..b.len() - 40].try_into().unwrap());
        assert_eq!(version(&joined(&p)), 2);
        let entries = parse_pack(&joined(&p), "p", MAX).unwrap();
        assert_eq!(entries, p.entries);
        assert_eq!((entries[0].bases, entries[1].bases), (None, Some(bases)));
        assert_eq!(p.size() as usize, 24 + 3 + stored.len() + 2 * ENTRY_LEN_V2 + TRAILER_LEN);
        // A pack without deltas stays version 1, readable by older readers.
        assert_eq!(version(&joined(&sample())), 1);
    }

    #[test]
    fn lengths_that_no_chunk_has_are_corrupt() {
        // The 129-byte pack of issue 11: one zero chunk claiming 4 GiB.
        let mut b = PackBuilder::new(PackIds::HeaderFooter);
        b.push(ObjectId::of(b"z"), Codec::Zero, &[], u32::MAX);
        let p = b.finish();
        assert_eq!(p.size() as usize, 129);
        let err = parse_pack(&joined(&p), "p", MAX).unwrap_err().to_string();
        assert!(err.contains("corrupt pack p") && err.contains("exceeds the store's chunk max"), "{err}");
        let mut b = PackBuilder::new(PackIds::HeaderFooter);
        b.push(ObjectId::of(b"z"), Codec::Zero, &[], MAX);
        assert!(parse_pack(&joined(&b.finish()), "p", MAX).is_ok(), "a chunk of exactly the chunk max is fine");
        // Stored lengths that do not fit the codec.
        for (codec, stored, plain) in [(Codec::Raw, 3, 4), (Codec::Zero, 1, 4), (Codec::Zstd, 5, 4)] {
            let mut b = PackBuilder::new(PackIds::HeaderFooter);
            b.push(ObjectId::of(b"x"), codec, &vec![1; stored], plain);
            let err = parse_pack(&joined(&b.finish()), "p", MAX).unwrap_err().to_string();
            assert!(err.contains("does not fit"), "{codec:?}: {err}");
        }
    }
}
