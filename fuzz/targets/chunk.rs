//! A stored chunk decoded by each codec (zstd, float lanes, ...): first byte the codec,
//! next four the plain length; never more than the plain length comes out, and nothing
//! panics on damaged lanes or frames.
use gstore_format::codec::{Codec, Decoder};
use gstore_format::ObjectId;

const CHUNK_MAX: u32 = 1 << 20;

/// Runs one input; panics on a bug.
pub fn run(data: &[u8]) {
    if data.len() < 5 {
        return;
    }
    let Some(codec) = Codec::from_byte(data[0] % 4) else { return };
    let plain_len = (u32::from_le_bytes(data[1..5].try_into().unwrap()) % (CHUNK_MAX + 2)) as usize;
    let stored = &data[5..];
    let id = ObjectId::of(stored);
    let mut d = Decoder::new(CHUNK_MAX);
    let mut out = vec![7u8; 3];
    match d.decode_append(codec, stored, plain_len, &id, &mut out) {
        Ok(()) => assert_eq!(out.len(), 3 + plain_len),
        Err(_) => assert_eq!(out, [7, 7, 7], "a failed decode left bytes behind"),
    }
}
