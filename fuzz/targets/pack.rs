//! A pack read from a store: its trailer and footer parsed, every entry checked to lie
//! inside the pack (parse_pack), and the tail alone as a remote reader parses it.
use gstore_format::pack;

/// Runs one input; panics on a bug.
pub fn run(data: &[u8]) {
    let chunk_max = 1 << 20;
    if let Ok(entries) = pack::parse_pack(data, "fuzz", chunk_max) {
        for e in entries {
            assert!(e.offset + e.stored_len as u64 <= data.len() as u64, "an entry past the pack's end was accepted");
        }
    }
    let tail = &data[data.len().saturating_sub(4096)..];
    if let Ok(t) = pack::parse_trailer(tail, data.len() as u64, "fuzz") {
        let _ = pack::parse_footer(tail, &t, "fuzz", chunk_max);
    }
}
