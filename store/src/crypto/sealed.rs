//! Sealed objects: an object's bytes encrypted and authenticated in blocks, so that a range
//! of the plain bytes can be read and checked without reading the whole object
//! (docs/FORMAT.md, "Encrypted stores").
//!
//! ```text
//! offset 0   magic "GSSEAL01" (8 bytes)
//! offset 8   salt: 32 random bytes
//! offset 40  u64 LE plain length P
//! offset 48  ceil(P / BLOCK) blocks (one when P = 0): each the AES-256-GCM ciphertext of
//!            BLOCK plain bytes (the last: the rest) followed by its 16-byte tag
//! ```
//!
//! Each object has its own AES key, the keyed BLAKE3 of its salt under the store's sealing
//! key; block `i`'s nonce is `i` (u64 LE, then four zero bytes), and its associated data the
//! 48-byte header followed by the object's key (its name in the store), so a block cannot be
//! moved within an object, between objects or to another key, and a changed length fails
//! every block.

use crate::error::{Result, StoreError};
use crate::memory::KEPT;
use crate::ObjectKind;
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use bytes::Bytes;
use std::ops::Range;

/// Plain bytes per block.
pub const BLOCK: u64 = 16 * 1024;
/// Bytes of the authentication tag after each block.
pub const TAG: u64 = 16;
/// Bytes of the header.
pub const HEADER: u64 = 48;
const MAGIC: &[u8; 8] = b"GSSEAL01";

/// A sealed object's header: what is needed to open any of its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The object's random salt.
    pub salt: [u8; 32],
    /// Its plain length.
    pub plain_len: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER as usize] {
        let mut h = [0u8; HEADER as usize];
        h[..8].copy_from_slice(MAGIC);
        h[8..40].copy_from_slice(&self.salt);
        h[40..].copy_from_slice(&self.plain_len.to_le_bytes());
        h
    }

    /// Parses the first [`HEADER`] bytes of the sealed object `key`.
    pub fn parse(bytes: &[u8], key: &str) -> Result<Header> {
        if bytes.len() < HEADER as usize || &bytes[..8] != MAGIC {
            return Err(corrupt(
                key,
                "not a sealed object (no GSSEAL01 header): was it written to an unencrypted store?",
            ));
        }
        Ok(Header {
            salt: bytes[8..40].try_into().expect("32 bytes"),
            plain_len: u64::from_le_bytes(bytes[40..48].try_into().expect("8 bytes")),
        })
    }

    /// Number of blocks.
    fn blocks(&self) -> u64 {
        self.plain_len.div_ceil(BLOCK).max(1)
    }

    /// Plain length of block `i`.
    fn block_len(&self, i: u64) -> u64 {
        (self.plain_len - (i * BLOCK).min(self.plain_len)).min(BLOCK)
    }

    /// The sealed object's length.
    pub fn sealed_len(&self) -> u64 {
        HEADER + self.plain_len + TAG * self.blocks()
    }

    /// The sealed byte range holding plain bytes `range` (which must lie within the object and
    /// not be empty), and the offset of `range.start` in the blocks read.
    pub fn sealed_range(&self, range: &Range<u64>) -> (Range<u64>, u64) {
        let first = range.start / BLOCK;
        let last = range.end.saturating_sub(1).max(range.start) / BLOCK;
        let start = HEADER + first * (BLOCK + TAG);
        let end = HEADER + last * (BLOCK + TAG) + self.block_len(last) + TAG;
        (start..end, range.start - first * BLOCK)
    }
}

/// The plain length of a sealed object that is `sealed_len` bytes long, or `None` when no
/// sealed object has that length.
pub fn plain_len(sealed_len: u64) -> Option<u64> {
    let body = sealed_len.checked_sub(HEADER)?;
    let blocks = body.div_ceil(BLOCK + TAG).max(1);
    body.checked_sub(TAG * blocks)
}

fn corrupt(key: &str, detail: &str) -> StoreError {
    StoreError::corrupt(ObjectKind::SealedObject, key, detail)
}

/// Block `i` of object `key` failed its check.
fn unauthentic(key: &str, i: u64) -> StoreError {
    corrupt(
        key,
        &format!(
            "block {i} fails its authentication: the object was changed, moved from another key, or sealed with another store's key"
        ),
    )
}

/// The store's sealing key: seals and opens objects.
pub struct Sealer {
    key: [u8; 32],
}

impl Sealer {
    /// A sealer for the 32-byte sealing key `key`.
    pub fn new(key: [u8; 32]) -> Sealer {
        Sealer { key }
    }

    fn object_key(&self, salt: &[u8; 32]) -> LessSafeKey {
        let k = blake3::keyed_hash(&self.key, salt);
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k.as_bytes()).expect("32-byte AES-256 key"))
    }

    fn aad(header: &Header, key: &str) -> Vec<u8> {
        let mut aad = header.encode().to_vec();
        aad.extend_from_slice(key.as_bytes());
        aad
    }

    fn nonce(i: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&i.to_le_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Seals the object `key`, whose plain bytes are `pieces` one after the other, under a
    /// fresh random salt (into a buffer used again once the sealed bytes are dropped).
    pub fn seal(&self, key: &str, pieces: &[impl AsRef<[u8]>]) -> Bytes {
        let mut salt = [0u8; 32];
        super::random(&mut salt);
        let plain_len = pieces.iter().map(|p| p.as_ref().len() as u64).sum();
        let header = Header { salt, plain_len };
        let k = self.object_key(&salt);
        let aad = Self::aad(&header, key);
        let mut out = KEPT.buffer(header.sealed_len() as usize);
        out.extend_from_slice(&header.encode());
        let mut rest = pieces.iter().map(|p| p.as_ref());
        let mut piece: &[u8] = &[];
        for i in 0..header.blocks() {
            let start = out.len();
            let mut need = header.block_len(i) as usize;
            while need > 0 {
                if piece.is_empty() {
                    piece = rest.next().expect("the pieces hold plain_len bytes");
                }
                let n = need.min(piece.len());
                out.extend_from_slice(&piece[..n]);
                (piece, need) = (&piece[n..], need - n);
            }
            let tag = k
                .seal_in_place_separate_tag(Self::nonce(i), Aad::from(&aad[..]), &mut out[start..])
                .expect("a block is far below AES-GCM's limit");
            out.extend_from_slice(tag.as_ref());
        }
        KEPT.shared(out)
    }

    /// Opens the whole sealed object `key`.
    pub fn open(&self, key: &str, sealed: &[u8]) -> Result<Vec<u8>> {
        let header = Header::parse(sealed, key)?;
        if sealed.len() as u64 != header.sealed_len() {
            return Err(corrupt(
                key,
                &format!(
                    "{} bytes long, but its header says {}: truncated or extended",
                    sealed.len(),
                    header.sealed_len()
                ),
            ));
        }
        let mut out = vec![0u8; header.plain_len as usize];
        self.open_blocks(key, &header, 0, &sealed[HEADER as usize..], 0, &mut out)?;
        Ok(out)
    }

    /// Opens plain bytes `range` of the sealed object `key` (with header `header`) from
    /// `sealed`, the bytes [`Header::sealed_range`] names for it, into `out` (the range's
    /// length).
    pub fn open_range(
        &self,
        key: &str,
        header: &Header,
        range: &Range<u64>,
        sealed: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        match Self::span_skip(key, header, range, sealed)? {
            None => Ok(()),
            Some(skip) => self.open_blocks(key, header, range.start / BLOCK, sealed, skip, out),
        }
    }

    /// [`Sealer::open_range`] into a new buffer: the blocks holding the range are opened from
    /// `sealed` straight into it (decryption is the only copy), and the range is a slice of
    /// their plain bytes; the buffer is used again once the bytes are dropped.
    pub fn open_range_owned(&self, key: &str, header: &Header, range: &Range<u64>, sealed: &[u8]) -> Result<Bytes> {
        let Some(skip) = Self::span_skip(key, header, range, sealed)? else { return Ok(Bytes::new()) };
        let first = range.start / BLOCK;
        let end = (range.end.div_ceil(BLOCK) * BLOCK).min(header.plain_len);
        let mut plain = KEPT.filled((end - first * BLOCK) as usize, sealed.len());
        self.open_blocks(key, header, first, sealed, 0, &mut plain)?;
        Ok(KEPT.shared(plain).slice(skip..skip + (range.end - range.start) as usize))
    }

    /// Where the range starts in its first block, after checking that `sealed` is exactly the
    /// blocks holding it; `None` for an empty range.
    fn span_skip(key: &str, header: &Header, range: &Range<u64>, sealed: &[u8]) -> Result<Option<usize>> {
        if range.end > header.plain_len {
            return Err(corrupt(
                key,
                &format!("{} plain bytes long, but bytes up to {} were asked for", header.plain_len, range.end),
            ));
        }
        if range.is_empty() {
            return Ok(None);
        }
        let (span, skip) = header.sealed_range(range);
        if sealed.len() as u64 != span.end - span.start {
            return Err(corrupt(key, "shorter than its header says: truncated"));
        }
        Ok(Some(skip as usize))
    }

    /// The blocks in `sealed` from block `first` on, each as its number, ciphertext and tag.
    fn blocks<'a>(
        key: &'a str,
        header: &'a Header,
        first: u64,
        sealed: &'a [u8],
    ) -> impl Iterator<Item = Result<(u64, &'a [u8], &'a [u8])>> + 'a {
        let mut at = 0usize;
        (first..).map_while(move |i| {
            if at >= sealed.len() {
                return None;
            }
            let len = header.block_len(i) as usize;
            let Some(bytes) = sealed.get(at..at + len + TAG as usize) else {
                at = sealed.len();
                return Some(Err(corrupt(key, "shorter than its header says: truncated")));
            };
            at += len + TAG as usize;
            let (ciphertext, tag) = bytes.split_at(len);
            Some(Ok((i, ciphertext, tag)))
        })
    }

    /// Opens every block of `sealed` (numbered from `first`: exactly the blocks holding what
    /// `out` is to receive), writing their plain bytes from offset `skip` of the first block into
    /// `out` (on an error, `out` holds anything). A block wholly wanted is opened straight into
    /// `out`; others into a scratch block. A whole empty object is one empty block, still
    /// authenticated.
    fn open_blocks(
        &self,
        key: &str,
        header: &Header,
        first: u64,
        sealed: &[u8],
        mut skip: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let opener = self.opener(header, key);
        let mut scratch = Vec::new();
        let mut filled = 0usize;
        for block in Self::blocks(key, header, first, sealed) {
            let (i, ciphertext, tag) = block?;
            let len = ciphertext.len();
            if skip == 0 && out.len() - filled >= len {
                opener.open(i, ciphertext, tag, &mut out[filled..filled + len])?;
                filled += len;
            } else {
                scratch.resize(len, 0);
                opener.open(i, ciphertext, tag, &mut scratch)?;
                let take = (len - skip.min(len)).min(out.len() - filled);
                out[filled..filled + take].copy_from_slice(&scratch[skip..skip + take]);
                filled += take;
                skip = 0;
            }
        }
        Ok(())
    }

    fn opener<'a>(&self, header: &Header, key: &'a str) -> Opener<'a> {
        Opener { k: self.object_key(&header.salt), aad: Self::aad(header, key), key }
    }
}

/// What opening the blocks of one object takes: its AES key, its associated data, its name.
struct Opener<'a> {
    k: LessSafeKey,
    aad: Vec<u8>,
    key: &'a str,
}

impl Opener<'_> {
    /// Opens block `i` (its ciphertext and tag) into `out`, which has the ciphertext's length.
    fn open(&self, i: u64, ciphertext: &[u8], tag: &[u8], out: &mut [u8]) -> Result<()> {
        self.k
            .open_separate_gather(Sealer::nonce(i), Aad::from(&self.aad[..]), ciphertext, tag, out)
            .map_err(|_| unauthentic(self.key, i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn lengths_round_trip() {
        for p in [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK, 3 * BLOCK + 5] {
            let h = Header { salt: [0; 32], plain_len: p };
            assert_eq!(plain_len(h.sealed_len()), Some(p), "plain length {p}");
        }
        assert_eq!(plain_len(HEADER + TAG - 1), None);
    }

    #[test]
    fn whole_objects_and_every_kind_of_range_open_to_the_plain_bytes() {
        let s = Sealer::new([7; 32]);
        for n in [0usize, 1, 100, BLOCK as usize, BLOCK as usize * 3 + 17] {
            let plain = data(n);
            let sealed = s.seal("packs/ab/x.pack", &[&plain]);
            assert_eq!(sealed.len() as u64, HEADER + n as u64 + TAG * (n as u64).div_ceil(BLOCK).max(1));
            assert_eq!(s.open("packs/ab/x.pack", &sealed).unwrap(), plain);
            // In pieces that do not line up with the blocks: the same plain bytes.
            let pieces = [&plain[..n / 3], &plain[n / 3..n / 3], &plain[n / 3..]];
            assert_eq!(s.open("packs/ab/x.pack", &s.seal("packs/ab/x.pack", &pieces)).unwrap(), plain);
            let header = Header::parse(&sealed, "k").unwrap();
            let ranges = [
                (0, n),
                (n / 3, n),
                (n / 2, n / 2),
                (n.saturating_sub(1), n),
                (1.min(n), (2 * BLOCK as usize + 3).min(n)),
            ];
            for (a, b) in ranges {
                let r = a as u64..b as u64;
                let (span, _) = header.sealed_range(&r);
                let owned =
                    s.open_range_owned("packs/ab/x.pack", &header, &r, &sealed[span.start as usize..span.end as usize]);
                assert_eq!(&owned.unwrap()[..], &plain[a..b], "owned open of {a}..{b} of {n}");
                let mut out = vec![0u8; b - a];
                s.open_range("packs/ab/x.pack", &header, &r, &sealed[span.start as usize..span.end as usize], &mut out)
                    .unwrap();
                assert_eq!(out, plain[a..b], "range {a}..{b} of {n}");
            }
        }
    }

    #[test]
    fn a_changed_moved_or_truncated_object_or_another_key_is_refused() {
        let s = Sealer::new([7; 32]);
        let plain = data(3 * BLOCK as usize);
        let sealed = s.seal("tags/a/latest.tag", &[&plain]);
        let mut flipped = sealed.to_vec();
        flipped[HEADER as usize + BLOCK as usize + 40] ^= 1;
        let err = s.open("tags/a/latest.tag", &flipped).unwrap_err().to_string();
        assert!(err.contains("block 1 fails its authentication"), "{err}");
        // Ranges too: the block holding them fails, whichever way they are opened.
        let header = Header::parse(&flipped, "k").unwrap();
        let r = BLOCK + 5..BLOCK + 9;
        let (span, _) = header.sealed_range(&r);
        let blocks = &flipped[span.start as usize..span.end as usize];
        let err = s.open_range_owned("tags/a/latest.tag", &header, &r, blocks).unwrap_err().to_string();
        assert!(err.contains("block 1 fails its authentication"), "{err}");
        let err = s.open_range("tags/a/latest.tag", &header, &r, blocks, &mut [0; 4]).unwrap_err().to_string();
        assert!(err.contains("block 1 fails its authentication"), "{err}");
        let err = s.open_range_owned("tags/a/latest.tag", &header, &r, &blocks[1..]).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        let err = s.open("tags/b/latest.tag", &sealed).unwrap_err().to_string();
        assert!(err.contains("block 0 fails its authentication"), "moved to another key: {err}");
        assert!(s
            .open("tags/a/latest.tag", &sealed[..sealed.len() - 1])
            .unwrap_err()
            .to_string()
            .contains("truncated"));
        // A shorter length in the header (an attempt to cut the last block off) fails block 0.
        let mut shorter = sealed[..sealed.len() - (BLOCK + TAG) as usize].to_vec();
        shorter[40..48].copy_from_slice(&(2 * BLOCK).to_le_bytes());
        assert!(s.open("tags/a/latest.tag", &shorter).unwrap_err().to_string().contains("block 0"));
        assert!(Sealer::new([8; 32]).open("tags/a/latest.tag", &sealed).is_err(), "another store's key");
        assert!(s.open("k", b"plain json").unwrap_err().to_string().contains("not a sealed object"));
        // The same plain bytes sealed twice differ (fresh salt).
        assert_ne!(s.seal("k", &[&plain]), s.seal("k", &[&plain]));
    }
}
