//! 32-byte BLAKE3 object ids (chunks, packs, manifests) and their hex form.

use crate::error::{FormatError, Result};
use std::fmt;

/// A BLAKE3-256 digest naming a chunk, pack or manifest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 32]);

impl ObjectId {
    /// Hashes `bytes` with BLAKE3.
    pub fn of(bytes: &[u8]) -> Self {
        ObjectId(*blake3::hash(bytes).as_bytes())
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex characters.
    pub fn from_hex(s: &str) -> Result<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out)
            .map_err(|_| FormatError::Name { name: format!("{s:?}"), why: "not a 64-hex-digit object id".into() })?;
        Ok(ObjectId(out))
    }

    /// Builds an id from a 32-byte slice (e.g. read from a footer).
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(ObjectId)
    }

    /// An id no other call returns, in this process or any other, here or on another
    /// machine: a hash of the time, the process, a process-wide counter and random bits the
    /// standard library takes from the OS. Unpredictable enough for names and salts; not a
    /// secret.
    pub fn unique() -> ObjectId {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let mut h = blake3::Hasher::new();
        h.update(&nanos.to_le_bytes()).update(&std::process::id().to_le_bytes()).update(&n.to_le_bytes());
        // The standard library seeds each RandomState from the OS: bits no other process has.
        h.update(&std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), n).to_le_bytes());
        ObjectId(*h.finalize().as_bytes())
    }

    /// The first 12 hex digits, for messages.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

/// How a store names chunks: the BLAKE3 of their plain bytes, or (an encrypted store) their
/// keyed BLAKE3 under a key derived from the store's master key, so that an id says nothing
/// about the content to anyone without the key.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub enum ChunkIds {
    /// `BLAKE3(plain)`.
    #[default]
    Plain,
    /// `BLAKE3-keyed(key, plain)`.
    Keyed([u8; 32]),
}

impl ChunkIds {
    /// The id of a chunk of plain bytes `plain`.
    pub fn id(&self, plain: &[u8]) -> ObjectId {
        match self {
            ChunkIds::Plain => ObjectId::of(plain),
            ChunkIds::Keyed(k) => ObjectId(*blake3::keyed_hash(k, plain).as_bytes()),
        }
    }

    /// The key of keyed ids.
    pub fn key(&self) -> Option<&[u8; 32]> {
        match self {
            ChunkIds::Plain => None,
            ChunkIds::Keyed(k) => Some(k),
        }
    }
}

impl fmt::Debug for ChunkIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.key().is_some() { "ChunkIds::Keyed(..)" } else { "ChunkIds::Plain" })
    }
}

/// In reports (JSON), an id is its 64-digit lowercase hex.
impl serde::Serialize for ObjectId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for ObjectId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let hex = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        ObjectId::from_hex(&hex).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.short())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_rejects_garbage() {
        let id = ObjectId::of(b"hello");
        assert_eq!(ObjectId::from_hex(&id.to_hex()).unwrap(), id);
        assert!(ObjectId::from_hex("zz").is_err());
        assert!(ObjectId::from_hex(&"a".repeat(63)).is_err());
    }
}
