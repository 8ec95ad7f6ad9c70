//! Where one stored chunk is: its pack, offset, lengths, codec and delta bases, as the index
//! keeps it for each chunk entry and a recorded plan for each chunk of an image.

use crate::codec::{Codec, DeltaBases};
use crate::format::id::ObjectId;
use crate::format::pack::PackEntry;

/// Where one chunk's stored bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLocation {
    /// The pack holding it.
    pub pack: ObjectId,
    /// Offset of the stored bytes in the pack.
    pub offset: u64,
    /// Stored length.
    pub stored_len: u32,
    /// Plain length.
    pub plain_len: u32,
    /// Codec of the stored bytes.
    pub codec: Codec,
    /// For a delta chunk, the chunks it is stored against.
    pub bases: Option<DeltaBases>,
}

impl ChunkLocation {
    /// Where the chunk of footer entry `e` of pack `pack` is.
    pub fn in_pack(pack: ObjectId, e: &PackEntry) -> ChunkLocation {
        ChunkLocation {
            pack,
            offset: e.offset,
            stored_len: e.stored_len,
            plain_len: e.plain_len,
            codec: e.codec,
            bases: e.bases,
        }
    }

    /// Value of a chunk entry (the pack id is in its key): 17 bytes, and a delta's base ids.
    pub(crate) fn encode_value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(81);
        v.extend_from_slice(&self.offset.to_le_bytes());
        v.extend_from_slice(&self.stored_len.to_le_bytes());
        v.extend_from_slice(&self.plain_len.to_le_bytes());
        v.push(self.codec as u8);
        for b in self.bases.iter().flat_map(DeltaBases::iter) {
            v.extend_from_slice(&b.0);
        }
        v
    }

    pub(crate) fn decode(key: &[u8], v: &[u8]) -> Option<Self> {
        if key.len() != 64 || ![17, 49, 81].contains(&v.len()) {
            return None;
        }
        let codec = Codec::from_byte(v[16])?;
        let bases = v
            .get(17..49)
            .and_then(ObjectId::from_slice)
            .map(|first| DeltaBases { first, second: v.get(49..81).and_then(ObjectId::from_slice) });
        if (codec == Codec::Delta) != bases.is_some() {
            return None;
        }
        Some(ChunkLocation {
            pack: ObjectId::from_slice(&key[32..])?,
            offset: u64::from_le_bytes(v[..8].try_into().ok()?),
            stored_len: u32::from_le_bytes(v[8..12].try_into().ok()?),
            plain_len: u32::from_le_bytes(v[12..16].try_into().ok()?),
            codec,
            bases,
        })
    }

    /// The byte range of the stored chunk inside its pack.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.stored_len as u64
    }
}
