//! Per-chunk codecs: how a chunk's plain bytes are kept in a pack.

pub mod floats;
pub mod huffman;
pub(crate) mod prefix_zstd;

pub use crate::codec::floats::{
    layout as float_layout, Lane as FloatLane, LaneCodec as FloatLaneCodec, LaneCoding, Layout as FloatLayout,
};
use crate::codec::prefix_zstd::PrefixCompressor;
use crate::error::{FormatError, Result};
use crate::id::{ChunkIds, ObjectId};
use crate::ObjectKind;

/// How a chunk is stored. The numeric value is the codec byte in pack footers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Codec {
    /// Plain bytes, stored as they are.
    Raw = 0,
    /// A zstd frame.
    Zstd = 1,
    /// All zero bytes: nothing is stored, only the length.
    Zero = 2,
    /// Byte-grouped floats: lanes of 2- or 4-byte words, each zstd or raw ([`crate::codec::floats`]).
    Floats = 3,
    /// A difference from one or two other stored chunks (its bases): their count and ids, then
    /// a zstd frame compressed with their plain bytes as its prefix ([`Encoder::encode_delta`]).
    Delta = 4,
}

impl Codec {
    /// Decodes a codec byte, refusing unknown values.
    pub fn from_byte(b: u8) -> Option<Codec> {
        match b {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::Zero),
            3 => Some(Codec::Floats),
            4 => Some(Codec::Delta),
            _ => None,
        }
    }

    /// Lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::Zero => "zero",
            Codec::Floats => "floats",
            Codec::Delta => "delta",
        }
    }
}

/// The first byte of an XOR frame in a delta chunk ([`Encoder::encode_xor_delta`]); a zstd
/// frame, the other kind, starts with 0x28.
const XOR_FRAME: u8 = 0x01;

/// XORs `src` into `dst` (the same length), eight bytes at a time.
fn xor_into(dst: &mut [u8], src: &[u8]) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (a, b) in (&mut d).zip(&mut s) {
        let x = u64::from_ne_bytes(a.try_into().expect("8")) ^ u64::from_ne_bytes(b.try_into().expect("8"));
        a.copy_from_slice(&x.to_ne_bytes());
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a ^= b;
    }
}

/// True when every byte of `data` is zero (word-at-a-time).
pub fn is_all_zero(data: &[u8]) -> bool {
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

/// Encodes chunks, reusing one zstd context (keep one per thread).
pub struct Encoder {
    zstd: zstd::bulk::Compressor<'static>,
    /// Whether chunks that look like floats are tried with the float codec.
    floats: bool,
    /// zstd for float lanes: same level, but matches of at least 7 bytes, a 256-entry hash
    /// table and a match finder that skips ahead fast where it finds none (target length 64),
    /// with literals still Huffman-coded (zstd would turn that off for a fast match finder on
    /// its own): a lane's gain is its Huffman-coded literals, not its matches. On bf16
    /// exponent lanes this is ~2x faster than plain zstd-1 and stores them smaller; the skip
    /// ahead made it ~1.4x faster again at the same size (docs/BENCHMARKS.md, issue #15). The
    /// frames are plain zstd frames: any zstd decoder reads them.
    lanes: zstd::bulk::Compressor<'static>,
    /// How float lanes worth compressing are coded.
    coding: LaneCoding,
    scratch: floats::Scratch,
    /// The zstd level, for delta frames.
    level: i32,
    /// The context for delta frames, made when the first is.
    deltas: Option<PrefixCompressor>,
    /// The percentage of its bytes an encoding must save to be kept.
    min_saving: u8,
}

impl Encoder {
    /// An encoder compressing at zstd `level`, trying the float codec on chunks that look like
    /// 2- or 4-byte floats when `floats` is set.
    pub fn new(level: i32, floats: bool) -> Result<Encoder> {
        let bad = |e: std::io::Error| FormatError::Setting { name: format!("zstd level {level}"), why: e.to_string() };
        let zstd = zstd::bulk::Compressor::new(level).map_err(bad)?;
        let mut lanes = zstd::bulk::Compressor::new(level).map_err(bad)?;
        lanes.set_parameter(zstd::zstd_safe::CParameter::MinMatch(7)).map_err(bad)?;
        lanes.set_parameter(zstd::zstd_safe::CParameter::HashLog(8)).map_err(bad)?;
        lanes.set_parameter(zstd::zstd_safe::CParameter::TargetLength(64)).map_err(bad)?;
        lanes
            .set_parameter(zstd::zstd_safe::CParameter::LiteralCompressionMode(zstd::zstd_safe::ParamSwitch::Enable))
            .map_err(bad)?;
        Ok(Encoder {
            zstd,
            floats,
            lanes,
            coding: LaneCoding::Huffman,
            scratch: floats::Scratch::default(),
            level,
            deltas: None,
            min_saving: crate::config::MIN_SAVING_DEFAULT,
        })
    }

    /// An encoder for the store `cfg` describes: its zstd level, float codec, lane coding and
    /// the saving a chunk's encoding must reach.
    pub fn for_config(cfg: &crate::StoreConfig) -> Result<Encoder> {
        let coding = if cfg.huffman_lanes { LaneCoding::Huffman } else { LaneCoding::Zstd };
        Ok(Encoder {
            min_saving: cfg.min_saving.min(100),
            ..Encoder::new(cfg.zstd_level, cfg.float_codec)?.lane_coding(coding)
        })
    }

    /// This encoder, coding float lanes worth compressing as `coding` says (Huffman unless
    /// set).
    pub fn lane_coding(mut self, coding: LaneCoding) -> Encoder {
        self.coding = coding;
        self
    }

    /// Chooses a codec for a non-zero chunk and returns its stored bytes: the float codec for
    /// a chunk whose sample looks like floats, else zstd, each only when it saves at least the
    /// store's `min_saving` (3 % unless set); raw otherwise, and at once for a chunk whose
    /// sample looks random.
    pub fn encode(&mut self, plain: &[u8]) -> (Codec, Vec<u8>) {
        let limit = plain.len() * (100 - self.min_saving as usize) / 100;
        match floats::survey(plain) {
            floats::Survey::Random => return (Codec::Raw, plain.to_vec()),
            floats::Survey::Floats(plan) if self.floats => {
                let mut out = Vec::with_capacity(plain.len() + 32);
                floats::encode(plain, plan, self.coding, &mut self.lanes, &mut self.scratch, &mut out);
                if out.len() < limit {
                    return (Codec::Floats, out);
                }
            }
            _ => {}
        }
        // Output larger than `limit` does not fit the buffer, which means "not worth it".
        let mut out = Vec::with_capacity(limit);
        match self.zstd.compress_to_buffer(plain, &mut out) {
            Ok(n) if n < limit => (Codec::Zstd, out),
            _ => (Codec::Raw, plain.to_vec()),
        }
    }

    /// Encodes `plain` as a delta against `bases`, whose plain bytes one after the other are
    /// `prefix`: the bases' count and ids, then one zstd frame compressed with `prefix` as its
    /// prefix (zstd's `refPrefix`), so the frame holds little more than the bytes where they
    /// differ. `None` when the result is not below `limit` bytes.
    pub fn encode_delta(&mut self, plain: &[u8], bases: &DeltaBases, prefix: &[u8], limit: usize) -> Option<Vec<u8>> {
        let head = bases.header_len();
        let room = limit.checked_sub(head)?;
        // A window that reaches from the end of the chunk back to the start of the prefix, so
        // that every part of it can be matched (zstd would size it for the chunk alone).
        let window = (plain.len() + prefix.len()).next_power_of_two().trailing_zeros().max(10);
        // A hash table with a slot per four bytes of the window (zstd-1 enters every third
        // position of a prefix): at the level's own size, later positions push the prefix's
        // start out of the table and its matches are not found. A slot per byte stored the
        // same deltas at a third more of the time; a slot per 16 bytes, 2 % more bytes on
        // CRIU images, per 32, 59 % more (docs/BENCHMARKS.md, issue #15).
        let hash = window.min(20) - 2;
        if self.deltas.is_none() {
            self.deltas = PrefixCompressor::new();
        }
        let mut out = Vec::with_capacity(limit);
        out.push(bases.count() as u8);
        for b in bases.iter() {
            out.extend_from_slice(&b.0);
        }
        // A frame that does not fit `room` fails: not worth it.
        if !self.deltas.as_mut()?.compress(plain, prefix, self.level, window, hash, &mut out, room) {
            return None;
        }
        (out.len() < limit).then_some(out)
    }
}

impl Encoder {
    /// Encodes `plain` as a delta against `base`, a chunk of the same length whose plain bytes
    /// are `base_plain` (the same place of the same file in the previous image): the base's
    /// count and id, then an XOR frame: [`XOR_FRAME`], a codec byte, and `plain` XOR
    /// `base_plain` encoded by that codec (floats or zstd, as [`Encoder::encode`] chooses).
    /// Floats a few training steps apart keep their sign, exponent and high mantissa bits, so
    /// the XOR's high byte lanes are mostly zero. `None` when the lengths differ, the XOR does
    /// not compress, or the result is not below `limit` bytes.
    pub fn encode_xor_delta(
        &mut self,
        plain: &[u8],
        base: ObjectId,
        base_plain: &[u8],
        limit: usize,
    ) -> Option<Vec<u8>> {
        if plain.len() != base_plain.len() {
            return None;
        }
        let mut xored = plain.to_vec();
        xor_into(&mut xored, base_plain);
        let (codec, inner) = self.encode(&xored);
        if codec == Codec::Raw {
            return None;
        }
        let bases = DeltaBases::one(base);
        let mut out = Vec::with_capacity(bases.header_len() + 2 + inner.len());
        out.push(1);
        out.extend_from_slice(&base.0);
        out.push(XOR_FRAME);
        out.push(codec as u8);
        out.extend_from_slice(&inner);
        (out.len() < limit).then_some(out)
    }
}

/// The chunks a delta chunk is stored against: one, or two whose plain bytes one after the
/// other make the prefix (a chunk whose changed page moved a boundary spans two old chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeltaBases {
    /// The first base.
    pub first: ObjectId,
    /// The second base, if any.
    pub second: Option<ObjectId>,
}

impl DeltaBases {
    /// One base.
    pub fn one(first: ObjectId) -> DeltaBases {
        DeltaBases { first, second: None }
    }

    /// The bases in prefix order.
    pub fn iter(&self) -> impl Iterator<Item = ObjectId> {
        std::iter::once(self.first).chain(self.second)
    }

    /// How many (1 or 2).
    pub fn count(&self) -> usize {
        1 + usize::from(self.second.is_some())
    }

    /// Bytes of the count and ids at the start of the stored bytes.
    pub fn header_len(&self) -> usize {
        1 + 32 * self.count()
    }

    /// True when `id` is one of them.
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.iter().any(|b| b == *id)
    }
}

/// The bases a delta chunk's stored bytes start with, and its zstd frame; `None` for bytes
/// that do not start with a count of 1 or 2 and as many distinct ids.
pub fn split_delta(stored: &[u8]) -> Option<(DeltaBases, &[u8])> {
    let (&n, rest) = stored.split_first()?;
    let id = |i: usize| rest.get(i * 32..(i + 1) * 32).and_then(ObjectId::from_slice);
    let bases = match n {
        1 => DeltaBases::one(id(0)?),
        2 => DeltaBases { first: id(0)?, second: Some(id(1)?).filter(|s| Some(*s) != id(0)) },
        _ => return None,
    };
    if bases.count() != n as usize {
        return None;
    }
    Some((bases, &rest[32 * bases.count()..]))
}

/// Decodes and checks a chunk read as a delta base (its codec, stored bytes, plain length
/// and id, in a store whose chunks are at most `chunk_max` bytes and named by `ids`): a base stored as a delta is
/// refused as corrupt, since chains are one step long.
pub fn decode_base(
    codec: Codec,
    stored: &[u8],
    plain_len: usize,
    id: &ObjectId,
    chunk_max: u32,
    ids: ChunkIds,
) -> Result<Vec<u8>> {
    if codec == Codec::Delta {
        return Err(FormatError::corrupt(ObjectKind::Chunk, id.to_hex(), "a delta base is itself stored as a delta"));
    }
    thread_local! {
        /// One decoder per thread for bases (a zstd context is costly to make per chunk).
        static BASES: std::cell::RefCell<Option<Decoder<'static>>> = const { std::cell::RefCell::new(None) };
    }
    let mut plain = Vec::with_capacity(plain_len);
    BASES.with(|held| {
        let mut held = held.borrow_mut();
        let decoder = match held.as_mut() {
            Some(d) if d.chunk_max == chunk_max && d.ids == ids => d,
            _ => held.insert(Decoder::new(chunk_max).with_ids(ids)),
        };
        decoder.decode_append(codec, stored, plain_len, id, &mut plain)
    })?;
    Ok(plain)
}

/// Where a decoder finds the plain bytes of the chunks that delta chunks are stored against.
pub trait BaseSource: Sync {
    /// The plain bytes of chunk `id`, checked against its id. A base is never itself a delta
    /// (chains are one step long): such a base is refused as corrupt.
    fn base_plain(&self, id: &ObjectId) -> Result<std::sync::Arc<Vec<u8>>>;
}

/// Plain bytes of delta bases a reader has at hand, by id: fetched itself (over HTTP, or
/// earlier in the same upload), or read ahead from a store for a reader that goes on without
/// its index (`gstore hold`, [`crate::IndexedStore::known_bases`]).
#[derive(Default)]
pub struct KnownBases(std::collections::HashMap<ObjectId, std::sync::Arc<Vec<u8>>>);

impl KnownBases {
    /// Adds base `id`.
    pub fn insert(&mut self, id: ObjectId, plain: std::sync::Arc<Vec<u8>>) {
        self.0.insert(id, plain);
    }

    /// Whether base `id` is at hand.
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.0.contains_key(id)
    }

    /// Plain bytes held.
    pub fn bytes(&self) -> u64 {
        self.0.values().map(|b| b.len() as u64).sum()
    }
}

impl FromIterator<(ObjectId, std::sync::Arc<Vec<u8>>)> for KnownBases {
    fn from_iter<I: IntoIterator<Item = (ObjectId, std::sync::Arc<Vec<u8>>)>>(bases: I) -> Self {
        KnownBases(bases.into_iter().collect())
    }
}

impl Extend<(ObjectId, std::sync::Arc<Vec<u8>>)> for KnownBases {
    fn extend<I: IntoIterator<Item = (ObjectId, std::sync::Arc<Vec<u8>>)>>(&mut self, bases: I) {
        self.0.extend(bases);
    }
}

impl IntoIterator for KnownBases {
    type Item = (ObjectId, std::sync::Arc<Vec<u8>>);
    type IntoIter = std::collections::hash_map::IntoIter<ObjectId, std::sync::Arc<Vec<u8>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl BaseSource for KnownBases {
    fn base_plain(&self, id: &ObjectId) -> Result<std::sync::Arc<Vec<u8>>> {
        self.0.get(id).cloned().ok_or_else(|| FormatError::NotFound {
            what: ObjectKind::DeltaBase,
            key: format!("{} (not among the bases read ahead)", id.to_hex()),
        })
    }
}

/// Decodes and verifies chunks, reusing one zstd context (keep one per thread).
pub struct Decoder<'s> {
    zstd: zstd::bulk::Decompressor<'static>,
    scratch: floats::Scratch,
    /// The longest chunk it decodes: the store's `chunk_max`.
    chunk_max: u32,
    /// Where delta chunks' bases come from; without it delta chunks are refused.
    bases: Option<&'s dyn BaseSource>,
    /// The zstd context for delta chunks (made when the first comes).
    delta: Option<zstd::zstd_safe::DCtx<'static>>,
    /// How decoded chunks are named (checked against their ids).
    ids: ChunkIds,
}

/// The first bytes of a zstd dictionary (`ZSTD_MAGIC_DICTIONARY`, little-endian).
const ZSTD_DICT_MAGIC: [u8; 4] = 0xEC30_A437u32.to_le_bytes();

/// Checks `plain` against the chunk id (in a store naming chunks by `ids`) and expected length.
pub fn verify(plain: &[u8], plain_len: usize, id: &ObjectId, ids: &ChunkIds) -> Result<()> {
    if plain.len() != plain_len {
        return Err(FormatError::corrupt(
            ObjectKind::Chunk,
            id.to_hex(),
            format!("decoded to {} bytes, expected {plain_len}", plain.len()),
        ));
    }
    let got = ids.id(plain);
    if &got != id {
        return Err(FormatError::corrupt(
            ObjectKind::Chunk,
            id.to_hex(),
            format!("BLAKE3 mismatch: content hashes to {}", got.short()),
        ));
    }
    Ok(())
}

/// Checks, without decoding, that `frame` is one whole zstd frame that declares exactly
/// `plain_len` bytes of content: its header and every block header are walked. For decoders
/// that must not be handed a damaged frame (nvCOMP on the GPU), so that a damaged chunk is
/// reported as corrupt chunk `id` before anything decodes it.
pub fn check_zstd_frame(frame: &[u8], plain_len: usize, id: &ObjectId) -> Result<()> {
    let declared = zstd::zstd_safe::get_frame_content_size(frame);
    let walked = zstd::zstd_safe::find_frame_compressed_size(frame);
    match (declared, walked) {
        (Ok(Some(n)), Ok(len)) if n == plain_len as u64 && len == frame.len() => Ok(()),
        (declared, walked) => Err(FormatError::corrupt(
            ObjectKind::Chunk,
            id.to_hex(),
            format!(
                "its zstd frame of {} bytes is damaged (declares {declared:?} bytes of content for {plain_len}, \
                 its blocks span {walked:?})",
                frame.len()
            ),
        )),
    }
}

impl Decoder<'static> {
    /// A decoder for a store whose chunks are at most `chunk_max` bytes (its config's): a
    /// longer `plain_len` is refused as corrupt before anything is allocated. It cannot look
    /// up delta bases: delta chunks are refused (see [`Decoder::with_bases`]).
    pub fn new(chunk_max: u32) -> Decoder<'static> {
        Decoder {
            zstd: zstd::bulk::Decompressor::new().expect("zstd decompression context"),
            scratch: floats::Scratch::default(),
            chunk_max,
            bases: None,
            delta: None,
            ids: ChunkIds::Plain,
        }
    }
}

impl<'s> Decoder<'s> {
    /// [`Decoder::new`] that decodes delta chunks too, reading their bases from `bases`.
    pub fn with_bases(chunk_max: u32, bases: &'s dyn BaseSource) -> Decoder<'s> {
        Decoder { bases: Some(bases), ..Decoder::new(chunk_max) }
    }

    /// This decoder for a store that names chunks by `ids` (plain BLAKE3 unless set).
    pub fn with_ids(self, ids: ChunkIds) -> Decoder<'s> {
        Decoder { ids, ..self }
    }

    /// Decodes a delta chunk into `out` (its plain length): looks up its bases, then decodes
    /// the frame with their plain bytes as its prefix. Returns the decoded length.
    fn expand_delta(&mut self, stored: &[u8], id: &ObjectId, out: &mut [u8]) -> Result<usize> {
        let corrupt = |why: String| FormatError::corrupt(ObjectKind::Chunk, id.to_hex(), why);
        let (bases, frame) =
            split_delta(stored).ok_or_else(|| corrupt(format!("a delta of {} bytes names no bases", stored.len())))?;
        if bases.contains(id) {
            return Err(corrupt("a delta names itself as its base".into()));
        }
        let source = self.bases.ok_or_else(|| {
            FormatError::NoBases(format!(
                "chunk {} is stored as a delta against chunk {}, and this reader cannot look up bases",
                id.short(),
                bases.first.short()
            ))
        })?;
        let first = source.base_plain(&bases.first)?;
        if frame.first() == Some(&XOR_FRAME) {
            let inner = match frame.get(1).and_then(|&b| Codec::from_byte(b)) {
                Some(c @ (Codec::Zstd | Codec::Floats)) => c,
                _ => return Err(corrupt("an XOR delta frame with an unknown codec".into())),
            };
            if bases.second.is_some() || first.len() != out.len() {
                return Err(corrupt("an XOR delta names two bases, or one of another length".into()));
            }
            let n = self.expand_into(inner, &frame[2..], id, out)?;
            if n == out.len() {
                xor_into(out, &first);
            }
            return Ok(n);
        }
        let joined;
        let prefix: &[u8] = match bases.second {
            None => &first,
            Some(second) => {
                joined = [&first[..], &source.base_plain(&second)?[..]].concat();
                &joined
            }
        };
        let named = |code: usize| corrupt(format!("delta: zstd: {}", zstd::zstd_safe::get_error_name(code)));
        // zstd reads a dictionary that starts with its dictionary magic as a structured one,
        // not as the plain bytes the encoder's prefix was: such a prefix is referenced as one.
        if prefix.get(..4) == Some(&ZSTD_DICT_MAGIC) {
            let mut dctx = zstd::zstd_safe::DCtx::create();
            dctx.ref_prefix(prefix).map_err(named)?;
            return dctx.decompress(out, frame).map_err(named);
        }
        let dctx = self.delta.get_or_insert_with(zstd::zstd_safe::DCtx::create);
        dctx.decompress_using_dict(out, frame, prefix).map_err(named)
    }

    /// Decodes `stored`, appends the plain bytes to `out` and checks them against `id`. On
    /// error `out` is left as it was.
    pub fn decode_append(
        &mut self,
        codec: Codec,
        stored: &[u8],
        plain_len: usize,
        id: &ObjectId,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        if plain_len > self.chunk_max as usize {
            return Err(FormatError::corrupt(
                ObjectKind::Chunk,
                id.to_hex(),
                format!("plain length {plain_len} exceeds the store's chunk max {}", self.chunk_max),
            ));
        }
        let start = out.len();
        let r = match codec {
            Codec::Raw => {
                out.extend_from_slice(stored);
                Ok(())
            }
            Codec::Zero => {
                out.resize(start + plain_len, 0);
                Ok(())
            }
            Codec::Floats => {
                out.resize(start + plain_len, 0);
                floats::decode(stored, &mut out[start..], &mut self.zstd, &mut self.scratch, id)
            }
            Codec::Delta => {
                out.resize(start + plain_len, 0);
                self.expand_delta(stored, id, &mut out[start..]).map(|n| out.truncate(start + n))
            }
            Codec::Zstd => {
                // A little room past plain_len lets an oversized frame show as "too long".
                out.resize(start + plain_len + 1, 0);
                match self.zstd.decompress_to_buffer(stored, &mut out[start..]) {
                    Ok(n) => {
                        out.truncate(start + n);
                        Ok(())
                    }
                    Err(e) => Err(FormatError::corrupt(ObjectKind::Chunk, id.to_hex(), format!("zstd: {e}"))),
                }
            }
        };
        let checked = r.and_then(|()| verify(&out[start..], plain_len, id, &self.ids));
        if checked.is_err() {
            out.truncate(start);
        }
        checked
    }
}

impl Decoder<'_> {
    /// Decodes `stored` into `out`, which must be exactly the chunk's plain length, and checks
    /// the bytes against `id`. On error `out` holds unspecified bytes.
    pub fn decode_into(&mut self, codec: Codec, stored: &[u8], id: &ObjectId, out: &mut [u8]) -> Result<()> {
        let n = self.expand_into(codec, stored, id, out)?;
        verify(&out[..n.min(out.len())], out.len(), id, &self.ids)
    }

    /// Decodes `stored` into `out` (the chunk's plain length) without hashing the result, for
    /// callers that check the bytes elsewhere (a GPU kernel): returns the decoded length, which
    /// differs from `out.len()` only for a damaged chunk (`id` names it in errors).
    pub fn expand_into(&mut self, codec: Codec, stored: &[u8], id: &ObjectId, out: &mut [u8]) -> Result<usize> {
        let plain_len = out.len();
        if plain_len > self.chunk_max as usize {
            return Err(FormatError::corrupt(
                ObjectKind::Chunk,
                id.to_hex(),
                format!("plain length {plain_len} exceeds the store's chunk max {}", self.chunk_max),
            ));
        }
        Ok(match codec {
            Codec::Raw if stored.len() == plain_len => {
                out.copy_from_slice(stored);
                plain_len
            }
            Codec::Raw => stored.len(),
            Codec::Zero => {
                out.fill(0);
                plain_len
            }
            Codec::Floats => {
                floats::decode(stored, out, &mut self.zstd, &mut self.scratch, id)?;
                plain_len
            }
            Codec::Delta => self.expand_delta(stored, id, out)?,
            Codec::Zstd => self
                .zstd
                .decompress_to_buffer(stored, out)
                .map_err(|e| FormatError::corrupt(ObjectKind::Chunk, id.to_hex(), format!("zstd: {e}")))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A chunk max above every test chunk.
    const MAX: u32 = 1 << 20;

    #[test]
    fn zstd_frames_are_checked_before_a_gpu_decodes_them() {
        // Seven bits a byte: the sample does not look random, so zstd is tried (and keeps it).
        let data: Vec<u8> = (0..100_000u32).map(|i| ((i % 251) as u8 ^ (i / 4096) as u8) & 0x7f).collect();
        let id = ObjectId::of(&data);
        let (codec, stored) = Encoder::new(1, false).unwrap().encode(&data);
        assert_eq!(codec, Codec::Zstd);
        check_zstd_frame(&stored, data.len(), &id).unwrap();
        assert!(check_zstd_frame(&stored, data.len() + 1, &id).is_err(), "wrong length");
        assert!(check_zstd_frame(&stored[..stored.len() - 1], data.len(), &id).is_err(), "cut short");
        for at in [4, 5, 6, 7, 8, 9] {
            let mut bad = stored.clone();
            bad[at] ^= 0x5a;
            assert!(check_zstd_frame(&bad, data.len(), &id).is_err(), "header byte {at} damaged");
        }
        // The zstd lanes of float-coded chunks declare their length too.
        let floats: Vec<u8> =
            (0..65_536u32).flat_map(|i| half_float_bits((i as f32 * 0.37).sin() * 0.02).to_le_bytes()).collect();
        let (codec, stored) = Encoder::new(1, true).unwrap().lane_coding(LaneCoding::Zstd).encode(&floats);
        assert_eq!(codec, Codec::Floats);
        let f = float_layout(&stored, floats.len(), &id).unwrap();
        let zstd_lanes: Vec<_> = f.lanes.iter().filter(|l| l.codec == FloatLaneCodec::Zstd).collect();
        assert!(!zstd_lanes.is_empty());
        for lane in zstd_lanes {
            check_zstd_frame(&stored[lane.stored.clone()], f.words, &id).unwrap();
        }
    }

    #[test]
    fn xor_deltas_store_float_drift_small_and_decode_exactly() {
        // fp32 weights N(0, 0.02)-like, then the same after small updates (~1e-4 each).
        let w: Vec<f32> = (0..16_384u32).map(|i| ((i as f32 * 0.61).sin() + (i as f32 * 0.13).cos()) * 0.014).collect();
        let moved: Vec<f32> = w.iter().enumerate().map(|(i, x)| x + ((i as f32 * 1.7).sin() * 1e-4)).collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (base, plain) = (bytes(&w), bytes(&moved));
        let (bid, id) = (ObjectId::of(&base), ObjectId::of(&plain));
        let mut enc = Encoder::new(1, true).unwrap();
        let (_, whole) = enc.encode(&plain);
        let stored = enc.encode_xor_delta(&plain, bid, &base, whole.len()).unwrap();
        // (0.67 of the plain bytes here, against 0.83 for the float codec alone.)
        assert!(stored.len() * 100 < whole.len() * 85, "XOR delta {} vs own encoding {}", stored.len(), whole.len());
        let known = KnownBases::from_iter(vec![(bid, std::sync::Arc::new(base.clone()))]);
        let mut out = vec![0; plain.len()];
        Decoder::with_bases(MAX, &known).decode_into(Codec::Delta, &stored, &id, &mut out).unwrap();
        assert_eq!(out, plain);
        // Damage anywhere, or another base under the base's id: refused, never wrong bytes.
        for at in [33, 34, 40, stored.len() / 2, stored.len() - 1] {
            let mut bad = stored.clone();
            bad[at] ^= 0x08;
            assert!(Decoder::with_bases(MAX, &known).decode_into(Codec::Delta, &bad, &id, &mut out).is_err(), "{at}");
        }
        let other = KnownBases::from_iter(vec![(bid, std::sync::Arc::new(plain.clone()))]);
        assert!(Decoder::with_bases(MAX, &other).decode_into(Codec::Delta, &stored, &id, &mut out).is_err());
        // Another length, or no gain: no delta.
        assert!(enc.encode_xor_delta(&plain[..100], bid, &base, usize::MAX).is_none());
        assert!(enc.encode_xor_delta(&plain, bid, &base, 40).is_none());
    }

    #[test]
    fn deltas_decode_against_their_base_and_nothing_else() {
        let base: Vec<u8> = (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let mut plain = base.clone();
        for (i, b) in plain[8192..12_288].iter_mut().enumerate() {
            *b = (i as u32).wrapping_mul(40_503).to_le_bytes()[1];
        }
        let (bid, id) = (ObjectId::of(&base), ObjectId::of(&plain));
        let mut enc = Encoder::new(1, false).unwrap();
        let one = DeltaBases::one(bid);
        let stored = enc.encode_delta(&plain, &one, &base, plain.len()).unwrap();
        assert!(stored.len() < 6000, "one changed page of 16 stored in {} bytes", stored.len());
        assert_eq!(split_delta(&stored).unwrap().0, one);
        let known = KnownBases::from_iter(vec![(bid, std::sync::Arc::new(base.clone()))]);
        let mut out = vec![0; plain.len()];
        Decoder::with_bases(MAX, &known).decode_into(Codec::Delta, &stored, &id, &mut out).unwrap();
        assert_eq!(out, plain);
        let mut appended = vec![1, 2];
        Decoder::with_bases(MAX, &known).decode_append(Codec::Delta, &stored, plain.len(), &id, &mut appended).unwrap();
        assert_eq!(&appended[2..], &plain[..]);
        // A reader that cannot look up bases says so.
        let e = Decoder::new(MAX).decode_into(Codec::Delta, &stored, &id, &mut out).unwrap_err();
        assert!(e.to_string().contains("cannot look up bases"), "{e}");
        // Other bytes under the base's id, a flipped byte anywhere, a wrong length: refused.
        let wrong = KnownBases::from_iter(vec![(bid, std::sync::Arc::new(vec![7; 65_536]))]);
        assert!(Decoder::with_bases(MAX, &wrong).decode_into(Codec::Delta, &stored, &id, &mut out).is_err());
        for at in [0, 1, 32, 33, 40, stored.len() / 2, stored.len() - 1] {
            let mut bad = stored.clone();
            bad[at] ^= 0x10;
            let r = Decoder::with_bases(MAX, &known).decode_into(Codec::Delta, &bad, &id, &mut out);
            assert!(r.is_err(), "flip at {at} decoded");
        }
        let mut short = vec![0; plain.len() - 1];
        assert!(Decoder::with_bases(MAX, &known).decode_into(Codec::Delta, &stored, &id, &mut short).is_err());
        // A delta no smaller than the limit is not made.
        assert!(enc.encode_delta(&plain, &one, &base, 100).is_none());
        // A chunk that spans the end of one base and the start of another is stored against both.
        let next: Vec<u8> = (0..65_536u32).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
        let spanning = [&plain[32_768..], &next[..32_768]].concat();
        let two = DeltaBases { first: id, second: Some(ObjectId::of(&next)) };
        let both = [&plain[..], &next[..]].concat();
        let stored = enc.encode_delta(&spanning, &two, &both, spanning.len()).unwrap();
        assert!(stored.len() < 1000, "a chunk made of two bases' halves stored in {} bytes", stored.len());
        let known = KnownBases::from_iter(vec![
            (id, std::sync::Arc::new(plain.clone())),
            (ObjectId::of(&next), std::sync::Arc::new(next)),
        ]);
        let mut out = vec![0; spanning.len()];
        Decoder::with_bases(MAX, &known)
            .decode_into(Codec::Delta, &stored, &ObjectId::of(&spanning), &mut out)
            .unwrap();
        assert_eq!(out, spanning);
        // Counts other than 1 and 2, or a base named twice, are not deltas.
        for bad in [vec![0u8; 40], vec![3u8; 200], [&[2u8][..], &[9u8; 64][..], b"frame"].concat()] {
            assert!(split_delta(&bad).is_none());
        }
    }

    #[test]
    fn one_decoder_decodes_deltas_in_a_row_whatever_their_bases_start_with() {
        let mut enc = Encoder::new(1, false).unwrap();
        let mut known = Vec::new();
        let mut deltas = Vec::new();
        for k in 0..4u32 {
            let mut base: Vec<u8> = (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761 + k) >> 11) as u8).collect();
            if k % 2 == 1 {
                // Bytes that zstd would take for a structured dictionary of its own.
                base[..4].copy_from_slice(&ZSTD_DICT_MAGIC);
            }
            let mut plain = base.clone();
            plain[20_000..24_096].fill(k as u8);
            let bases = DeltaBases::one(ObjectId::of(&base));
            let stored = enc.encode_delta(&plain, &bases, &base, plain.len()).unwrap();
            known.push((ObjectId::of(&base), std::sync::Arc::new(base)));
            deltas.push((stored, plain));
        }
        let known = KnownBases::from_iter(known);
        let mut decoder = Decoder::with_bases(MAX, &known);
        for (stored, plain) in deltas.iter().chain(&deltas) {
            let mut out = vec![0; plain.len()];
            decoder.decode_into(Codec::Delta, stored, &ObjectId::of(plain), &mut out).unwrap();
            assert!(out == *plain);
        }
    }

    /// The bf16 bits of `x` (truncated).
    fn half_float_bits(x: f32) -> u16 {
        (x.to_bits() >> 16) as u16
    }

    fn round_trip(data: &[u8]) -> Codec {
        let id = ObjectId::of(data);
        let (codec, stored) = Encoder::new(1, true).unwrap().encode(data);
        let mut out = b"prefix".to_vec();
        Decoder::new(MAX).decode_append(codec, &stored, data.len(), &id, &mut out).unwrap();
        assert_eq!(&out[..6], b"prefix");
        assert_eq!(&out[6..], data);
        codec
    }

    #[test]
    fn decode_into_fills_an_exact_buffer_and_refuses_wrong_bytes() {
        for data in [b"abcd".repeat(10_000), (0..40_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()]
        {
            let id = ObjectId::of(&data);
            let (codec, stored) = Encoder::new(1, true).unwrap().encode(&data);
            let mut out = vec![7u8; data.len()];
            Decoder::new(MAX).decode_into(codec, &stored, &id, &mut out).unwrap();
            assert_eq!(out, data);
            let mut short = vec![0u8; data.len() - 1];
            assert!(Decoder::new(MAX).decode_into(codec, &stored, &id, &mut short).is_err());
            let mut bad = stored.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            let err = Decoder::new(MAX).decode_into(codec, &bad, &id, &mut out).unwrap_err();
            assert!(matches!(err, FormatError::Corrupt { .. }), "{err}");
        }
    }

    #[test]
    fn compressible_uses_zstd_and_random_stays_raw() {
        assert_eq!(round_trip(&b"abcd".repeat(10_000)), Codec::Zstd);
        let mut noise = vec![0u8; 65536];
        blake3::Hasher::new().update(b"seed").finalize_xof().fill(&mut noise);
        assert_eq!(round_trip(&noise), Codec::Raw);
    }

    #[test]
    fn flipped_byte_is_caught() {
        let data = b"hello world".repeat(1000);
        let id = ObjectId::of(&data);
        for codec_bytes in [Encoder::new(1, true).unwrap().encode(&data), (Codec::Raw, data.clone())] {
            let (codec, mut stored) = codec_bytes;
            let mid = stored.len() / 2;
            stored[mid] ^= 1;
            let mut out = b"keep".to_vec();
            assert!(Decoder::new(MAX).decode_append(codec, &stored, data.len(), &id, &mut out).is_err());
            assert_eq!(out, b"keep", "a failed decode leaves the buffer as it was");
        }
    }

    #[test]
    fn lengths_over_the_chunk_max_are_refused_before_allocating() {
        // A zero chunk of 4 GiB would be allocated and filled if the length were trusted.
        let id = ObjectId::of(b"");
        for codec in [Codec::Zero, Codec::Zstd, Codec::Raw] {
            let mut out = b"keep".to_vec();
            let err = Decoder::new(MAX).decode_append(codec, &[], u32::MAX as usize, &id, &mut out).unwrap_err();
            assert!(err.to_string().contains("exceeds the store's chunk max"), "{err}");
            assert_eq!(out, b"keep");
            assert!(out.capacity() < 1 << 20, "{} bytes allocated", out.capacity());
        }
        let zeros = vec![0u8; 4096];
        let mut out = Vec::new();
        Decoder::new(4096).decode_append(Codec::Zero, &[], 4096, &ObjectId::of(&zeros), &mut out).unwrap();
        assert_eq!(out, zeros, "a chunk of exactly the chunk max decodes");
    }

    #[test]
    fn zero_detection() {
        assert!(is_all_zero(&[0u8; 1000]));
        let mut v = vec![0u8; 1001];
        v[1000] = 1;
        assert!(!is_all_zero(&v));
        assert!(!is_all_zero(&v[1..]));
    }

    proptest! {
        #[test]
        fn any_bytes_round_trip(data in proptest::collection::vec(any::<u8>(), 0..5000)) {
            round_trip(&data);
        }
    }
}
