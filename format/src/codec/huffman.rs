//! The Huffman lane codec (float-codec lane codec 2, docs/FORMAT.md): a canonical Huffman code
//! of at most [`MAX_LEN`] bits per byte, and the lane's bytes cut into substreams of
//! [`SUBSTREAM`] symbols, each starting on a byte boundary, whose ends the header lists. A GPU
//! decodes every substream on its own thread (gpu-dump's `decode_huffman` kernel), so a lane
//! crosses PCIe compressed and is decoded at memory speed; the host codes four substreams and
//! decodes two side by side. The exponent lanes of trained weights hold a few dozen byte values
//! with ~2.7 bits of entropy: Huffman coding keeps them at ~0.34 of their size (zstd level 1:
//! ~0.38).
//!
//! Stored form: `k - 1` (u8), then `k` pairs (symbol u8, code length u8) in canonical order
//! (lengths non-decreasing, symbols increasing within a length; a lane of one byte value has
//! one pair of length 0, and its substreams no bits), then one u32 LE end offset per
//! substream (relative to the start of the bits), then the bits. Codes are assigned in list
//! order: the first is all zeros; each next is one more than the previous, shifted left by the
//! growth in length. Codes are written most significant bit first, from the top bit of each
//! byte; a substream's last byte is padded with zero bits.

/// Symbols per substream.
pub const SUBSTREAM: usize = 1024;
/// The longest code.
pub const MAX_LEN: u32 = 11;

/// Code lengths (at most [`MAX_LEN`]) of a Huffman code for byte counts `counts`; 0 for bytes
/// that do not occur. One occurring byte gets a 1-bit code. Counts are halved (keeping every
/// occurring byte) until the longest code fits.
fn code_lengths(counts: &[u64; 256]) -> [u8; 256] {
    let mut counts = *counts;
    loop {
        let lengths = unlimited_lengths(&counts);
        if lengths.iter().all(|&l| l as u32 <= MAX_LEN) {
            return lengths;
        }
        for c in counts.iter_mut().filter(|c| **c > 0) {
            *c = (*c >> 1).max(1);
        }
    }
}

/// Optimal Huffman code lengths for `counts`, without a length limit. The leaves sorted by
/// count, and the internal nodes in the order they are made (their weights never decrease),
/// are two queues whose fronts are always the two lightest nodes: no heap is needed (a binary
/// heap made this ~3 % of a push of process images). Ties go to the leaf, then to the lower
/// byte value, then to the earlier node.
fn unlimited_lengths(counts: &[u64; 256]) -> [u8; 256] {
    let mut lengths = [0u8; 256];
    let mut leaves: Vec<(u64, u8)> =
        counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(s, &c)| (c, s as u8)).collect();
    let n = leaves.len();
    match n {
        0 => return lengths,
        1 => {
            lengths[leaves[0].1 as usize] = 1;
            return lengths;
        }
        _ => {}
    }
    leaves.sort_unstable();
    let mut node_weight: Vec<u64> = Vec::with_capacity(n - 1);
    let mut node_parent = vec![0usize; n - 1];
    let mut leaf_parent = vec![0usize; n];
    let (mut next_leaf, mut next_node) = (0, 0);
    for node in 0..n - 1 {
        let mut weight = 0;
        for _ in 0..2 {
            // Nodes made but not yet joined are `next_node..node`.
            if next_leaf < n && (next_node == node || leaves[next_leaf].0 <= node_weight[next_node]) {
                weight += leaves[next_leaf].0;
                leaf_parent[next_leaf] = node;
                next_leaf += 1;
            } else {
                weight += node_weight[next_node];
                node_parent[next_node] = node;
                next_node += 1;
            }
        }
        node_weight.push(weight);
    }
    // Depths from the root (the last node made) down: every node's parent was made after it.
    let mut depth = vec![0u8; n - 1];
    for node in (0..n - 2).rev() {
        depth[node] = depth[node_parent[node]] + 1;
    }
    for (leaf, &(_, s)) in leaves.iter().enumerate() {
        lengths[s as usize] = depth[leaf_parent[leaf]] + 1;
    }
    lengths
}

/// The canonical code: (symbol, length) in canonical order, and each symbol's code.
fn canonical(lengths: &[u8; 256]) -> (Vec<(u8, u8)>, [u16; 256]) {
    let mut order: Vec<(u8, u8)> = (0..256).filter(|&s| lengths[s] > 0).map(|s| (s as u8, lengths[s])).collect();
    order.sort_by_key(|&(s, l)| (l, s));
    let mut codes = [0u16; 256];
    let mut code = 0u32;
    let mut prev = order.first().map_or(0, |&(_, l)| l);
    for (k, &(s, l)) in order.iter().enumerate() {
        if k > 0 {
            code = (code + 1) << (l - prev);
        }
        prev = l;
        codes[s as usize] = code as u16;
    }
    (order, codes)
}

/// Counts of each byte value in `bytes`, four counters apart so runs do not serialise.
pub fn counts(bytes: &[u8]) -> [u64; 256] {
    let mut c = [[0u32; 256]; 4];
    let mut quads = bytes.chunks_exact(4);
    for q in &mut quads {
        c[0][q[0] as usize] += 1;
        c[1][q[1] as usize] += 1;
        c[2][q[2] as usize] += 1;
        c[3][q[3] as usize] += 1;
    }
    for &b in quads.remainder() {
        c[0][b as usize] += 1;
    }
    std::array::from_fn(|i| c.iter().map(|l| l[i] as u64).sum())
}

/// A Huffman code for one lane: each byte's code length (0 for bytes that do not occur), or
/// the one byte value a lane holds throughout (codes of no bits).
pub struct Code {
    lengths: [u8; 256],
    constant: Option<u8>,
}

impl Code {
    /// The code for byte counts `counts`: a code of no bits when one byte value (or none)
    /// occurs.
    pub fn for_counts(counts: &[u64; 256]) -> Code {
        let mut present = (0..256).filter(|&s| counts[s] > 0);
        match (present.next(), present.next()) {
            (first, None) => Code { lengths: [0; 256], constant: Some(first.unwrap_or(0) as u8) },
            _ => Code { lengths: code_lengths(counts), constant: None },
        }
    }

    /// The stored size [`Code::encode`] gives `n` symbols with byte counts `counts`.
    pub fn encoded_len(&self, counts: &[u64; 256], n: usize) -> usize {
        let bits: u64 = (0..256).map(|s| counts[s] * self.lengths[s] as u64).sum();
        let symbols = self.lengths.iter().filter(|&&l| l > 0).count().max(1);
        let substreams = n.div_ceil(SUBSTREAM);
        // Each substream's padding is under a byte: half a byte on average.
        1 + 2 * symbols + 4 * substreams + (bits as usize).div_ceil(8) + substreams / 2
    }

    /// Appends `symbols` (each of which must have a code) to `out`, header first.
    pub fn encode(&self, symbols: &[u8], out: &mut Vec<u8>) {
        let (order, codes) = match self.constant {
            Some(s) => (vec![(s, 0)], [0; 256]),
            None => canonical(&self.lengths),
        };
        out.push((order.len() - 1) as u8);
        for &(s, l) in &order {
            out.extend_from_slice(&[s, l]);
        }
        let substreams = symbols.len().div_ceil(SUBSTREAM);
        let ends_at = out.len();
        out.resize(ends_at + 4 * substreams, 0);
        let bits_at = out.len();
        // Code and length of each byte in one table entry.
        let table: [u32; 256] = std::array::from_fn(|s| (codes[s] as u32) << 8 | self.lengths[s] as u32);
        // Substreams are coded side by side (their bit chains are independent), each into a
        // buffer of its own, then appended in order.
        let mut bufs = [[0u8; WRITER_ROOM]; CODED_SIDE_BY_SIDE];
        for (g, group) in symbols.chunks(CODED_SIDE_BY_SIDE * SUBSTREAM).enumerate() {
            let mut writers: [BitWriter; CODED_SIDE_BY_SIDE] = Default::default();
            let parts: Vec<&[u8]> = group.chunks(SUBSTREAM).collect();
            if let ([a, b, c, d], true) = (&parts[..], group.len() == CODED_SIDE_BY_SIDE * SUBSTREAM) {
                let [wa, wb, wc, wd] = &mut writers;
                let [ba, bb, bc, bd] = &mut bufs;
                for j in (0..SUBSTREAM).step_by(4) {
                    wa.put4(&table, &a[j..j + 4], ba);
                    wb.put4(&table, &b[j..j + 4], bb);
                    wc.put4(&table, &c[j..j + 4], bc);
                    wd.put4(&table, &d[j..j + 4], bd);
                }
            } else {
                for ((w, part), buf) in writers.iter_mut().zip(&parts).zip(&mut bufs) {
                    for quad in part.chunks(4) {
                        w.put4(&table, quad, buf);
                    }
                }
            }
            for (i, (w, buf)) in writers.iter_mut().zip(&mut bufs).take(parts.len()).enumerate() {
                let n = w.finish(buf);
                out.extend_from_slice(&buf[..n]);
                let end = (out.len() - bits_at) as u32;
                out[ends_at + 4 * (g * CODED_SIDE_BY_SIDE + i)..][..4].copy_from_slice(&end.to_le_bytes());
            }
        }
    }
}

/// The length a decode table gives bits that start no code: longer than any code, so a
/// substream that holds such bits reads past its end.
const NO_CODE: u16 = 32;

/// Bytes one substream's codes can take, and room for a writer's 8-byte stores past them.
const WRITER_ROOM: usize = SUBSTREAM * MAX_LEN as usize / 8 + 16;

/// Codes of one substream being written into a buffer of [`WRITER_ROOM`] bytes.
#[derive(Default)]
struct BitWriter {
    /// Bits not yet stored, the latest lowest (`held` of them).
    acc: u64,
    held: u32,
    /// Bytes stored.
    pos: usize,
}

impl BitWriter {
    /// Appends the codes of up to four symbols (at most 44 bits, on top of fewer than 8 held
    /// back), then stores the whole bytes.
    #[inline(always)]
    fn put4(&mut self, table: &[u32; 256], symbols: &[u8], buf: &mut [u8; WRITER_ROOM]) {
        for &s in symbols {
            let e = table[s as usize];
            let len = e & 0xff;
            self.acc = self.acc << len | (e >> 8) as u64;
            self.held += len;
        }
        if self.held > 0 {
            let top = self.acc << (64 - self.held);
            buf[self.pos..self.pos + 8].copy_from_slice(&top.to_be_bytes());
        }
        self.pos += (self.held / 8) as usize;
        self.held %= 8;
    }

    /// Stores the last bits, zero-padded to a byte; returns the bytes written.
    fn finish(&mut self, buf: &mut [u8; WRITER_ROOM]) -> usize {
        if self.held > 0 {
            buf[self.pos] = (self.acc << (8 - self.held)) as u8;
            self.pos += 1;
        }
        let n = self.pos;
        *self = BitWriter::default();
        n
    }
}

/// A decode table: entry `v` (the next [`MAX_LEN`] bits) holds the symbol in its low byte and
/// the code's length above it ([`NO_CODE`] for bits that start no code).
struct Table {
    entries: Box<[u16; 1 << MAX_LEN]>,
    /// Entry `v` decodes one to three whole codes from the next [`MAX_LEN`] bits: their
    /// symbols (bits 0-23), their total length (bits 24-29) and how many (bits 30-31).
    runs: Box<[u32; 1 << MAX_LEN]>,
}

impl Table {
    /// Reads the header of `stored`: the table and where the substream ends start.
    fn read(stored: &[u8]) -> Result<(Table, usize), String> {
        let k = *stored.first().ok_or("empty")? as usize + 1;
        let pairs = stored.get(1..1 + 2 * k).ok_or("the code table is cut short")?;
        let mut entries = Box::new([NO_CODE << 8; 1 << MAX_LEN]);
        // (symbol, length, code) in canonical order: lengths never decrease.
        let mut codes = Vec::with_capacity(k);
        let (mut code, mut prev) = (0u32, 0u32);
        for (i, p) in pairs.chunks_exact(2).enumerate() {
            let (s, l) = (p[0], p[1] as u32);
            // A length of 0 is the code of no bits of a lane holding one byte value.
            if (l == 0 && k != 1) || l > MAX_LEN || l < prev || (l == prev && i > 0 && s <= pairs[2 * i - 2]) {
                return Err(format!("code table entry {i} (symbol {s}, length {l}) is out of canonical order"));
            }
            if i > 0 {
                code = (code + 1) << (l - prev);
            }
            if code >= 1 << l {
                return Err("the code lengths over-subscribe the code space".into());
            }
            prev = l;
            let span = 1usize << (MAX_LEN - l);
            let first = (code as usize) << (MAX_LEN - l);
            entries[first..first + span].fill((l as u16) << 8 | s as u16);
            codes.push((s as u32, l, code as usize));
        }
        // Each run of whole codes fills the entries its bits begin: a first code's range, then
        // within it each second code that fits, then each third. Bits that start no code
        // decode as one symbol of the poison length.
        let mut runs = Box::new([(NO_CODE as u32) << 24 | 1 << 30; 1 << MAX_LEN]);
        for &(s1, l1, c1) in &codes {
            let (at1, room1) = (c1 << (MAX_LEN - l1), MAX_LEN - l1);
            runs[at1..at1 + (1 << room1)].fill(s1 | l1 << 24 | 1 << 30);
            for &(s2, l2, c2) in codes.iter().take_while(|c| c.1 <= room1) {
                let (at2, room2) = (at1 + (c2 << (room1 - l2)), room1 - l2);
                runs[at2..at2 + (1 << room2)].fill(s1 | s2 << 8 | (l1 + l2) << 24 | 2 << 30);
                for &(s3, l3, c3) in codes.iter().take_while(|c| c.1 <= room2) {
                    let at3 = at2 + (c3 << (room2 - l3));
                    runs[at3..at3 + (1 << (room2 - l3))].fill(s1 | s2 << 8 | s3 << 16 | (l1 + l2 + l3) << 24 | 3 << 30);
                }
            }
        }
        Ok((Table { entries, runs }, 1 + 2 * k))
    }

    /// Decodes `out.len()` (at most 4) symbols of `bytes` from bit `*bit` on, advancing it.
    #[inline(always)]
    fn decode(&self, bytes: &[u8], bit: &mut usize, out: &mut [u8]) {
        let mut w = window(bytes, *bit);
        let mut used = 0usize;
        for o in out {
            let e = self.entries[(w >> (64 - MAX_LEN)) as usize];
            let len = (e >> 8) as u32;
            *o = e as u8;
            w <<= len;
            used += len as usize;
        }
        *bit += used;
    }

    /// Decodes one to three symbols at a time, four times, into `out` from `*at` on (which
    /// must leave [`RUN_ROOM`] bytes), advancing `*at` and `*bit`.
    #[inline(always)]
    fn decode_runs(&self, bytes: &[u8], bit: &mut usize, out: &mut [u8], at: &mut usize) {
        let mut w = window(bytes, *bit);
        let mut used = 0usize;
        for _ in 0..4 {
            let e = self.runs[(w >> (64 - MAX_LEN)) as usize];
            let len = (e >> 24) & 0x3f;
            out[*at..*at + 4].copy_from_slice(&e.to_le_bytes());
            *at += (e >> 30) as usize;
            w <<= len;
            used += len as usize;
        }
        *bit += used;
    }
}

/// Output bytes [`Table::decode_runs`] needs free: up to twelve symbols, and the last 4-byte
/// store reaching one past them.
const RUN_ROOM: usize = 13;

/// The 57 or more bits of `bytes` from bit `bit` on, at the top of a word (zeros past the end).
#[inline(always)]
fn window(bytes: &[u8], bit: usize) -> u64 {
    let at = bit / 8;
    let word = match bytes.get(at..at + 8) {
        Some(b) => u64::from_be_bytes(b.try_into().expect("8 bytes")),
        None => {
            let mut b = [0u8; 8];
            let rest = bytes.get(at..).unwrap_or(&[]);
            b[..rest.len()].copy_from_slice(rest);
            u64::from_be_bytes(b)
        }
    };
    word << (bit % 8)
}

/// Checks that a substream of `bytes`, decoded up to bit `bit`, ended in its last byte and
/// holds only zero padding past its codes.
fn finished(bytes: &[u8], bit: usize) -> Result<(), &'static str> {
    let total = 8 * bytes.len();
    if bit > total {
        Err("bits that start no code, or codes that run past its end")
    } else if total - bit >= 8 || window(bytes, bit) != 0 {
        Err("it holds more than its symbols")
    } else {
        Ok(())
    }
}

/// Substreams decoded side by side on one thread: their decode chains are independent (two
/// keep every stream's state in registers).
const SIDE_BY_SIDE: usize = 2;
/// Substreams coded side by side on one thread.
const CODED_SIDE_BY_SIDE: usize = 4;

/// Decodes `stored` (all of a lane's stored bytes) into `out`, which receives exactly
/// `out.len()` symbols. Anything inconsistent — a table out of canonical order or
/// over-subscribed, ends out of order or past the bits, bits that start no code, a substream
/// that ends early or holds more than its symbols and padding — is an error naming it.
pub fn decode(stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    let (table, at) = Table::read(stored)?;
    let substreams = out.len().div_ceil(SUBSTREAM);
    let ends = stored.get(at..at + 4 * substreams).ok_or("the substream ends are cut short")?;
    let bits = &stored[at + 4 * substreams..];
    let mut start = 0usize;
    let mut streams = Vec::with_capacity(substreams);
    for (k, e) in ends.chunks_exact(4).enumerate() {
        let end = u32::from_le_bytes(e.try_into().expect("4 bytes")) as usize;
        if end < start || end > bits.len() {
            return Err(format!("substream {k} ends at {end}, outside {start}..{}", bits.len()));
        }
        streams.push(&bits[start..end]);
        start = end;
    }
    if start != bits.len() {
        return Err(format!("{} bytes follow the last substream", bits.len() - start));
    }
    let bad = |k: usize, why: &str| format!("substream {k}: {why}");
    for (g, (ss, os)) in streams.chunks(SIDE_BY_SIDE).zip(out.chunks_mut(SIDE_BY_SIDE * SUBSTREAM)).enumerate() {
        let mut bits = [0usize; SIDE_BY_SIDE];
        let mut outs: Vec<&mut [u8]> = os.chunks_mut(SUBSTREAM).collect();
        let mut ats = [0usize; SIDE_BY_SIDE];
        if let ([sa, sb], [a, b]) = (ss, &mut outs[..]) {
            (bits, ats) = decode_two(&table.runs, [sa, sb], [a, b]);
        }
        for (((s, o), bit), at) in ss.iter().zip(outs).zip(&mut bits).zip(ats) {
            decode_rest(&table, s, o, bit, at);
        }
        for (i, (s, bit)) in ss.iter().zip(bits).enumerate() {
            finished(s, bit).map_err(|why| bad(g * SIDE_BY_SIDE + i, why))?;
        }
    }
    Ok(())
}

/// Decodes two substreams side by side, several symbols a lookup, while both have a whole
/// window of bits and [`RUN_ROOM`] bytes of output left: their decode chains overlap. Returns
/// the bits read and the bytes written of each.
fn decode_two(runs: &[u32; 1 << MAX_LEN], [sa, sb]: [&[u8]; 2], [a, b]: [&mut [u8]; 2]) -> ([usize; 2], [usize; 2]) {
    let (mut pa, mut pb, mut oa, mut ob) = (0usize, 0usize, 0usize, 0usize);
    if sa.len() < 8 || sb.len() < 8 {
        return ([0; 2], [0; 2]);
    }
    // A window is eight whole bytes from the byte holding the next bit.
    let (ea, eb) = (sa.len() - 8, sb.len() - 8);
    while pa / 8 <= ea && pb / 8 <= eb && oa + RUN_ROOM <= a.len() && ob + RUN_ROOM <= b.len() {
        let mut wa = u64::from_be_bytes(sa[pa / 8..pa / 8 + 8].try_into().expect("8 bytes")) << (pa % 8);
        let mut wb = u64::from_be_bytes(sb[pb / 8..pb / 8 + 8].try_into().expect("8 bytes")) << (pb % 8);
        // Four lookups take at most 44 of the window's 57 or more bits, and write at most
        // twelve symbols (a 4-byte store at most 9 bytes in).
        let (da, db): (&mut [u8; RUN_ROOM], &mut [u8; RUN_ROOM]) = (
            (&mut a[oa..oa + RUN_ROOM]).try_into().expect("room"),
            (&mut b[ob..ob + RUN_ROOM]).try_into().expect("room"),
        );
        let (mut ka, mut kb) = (0usize, 0usize);
        for _ in 0..4 {
            let (x, y) = (runs[(wa >> (64 - MAX_LEN)) as usize], runs[(wb >> (64 - MAX_LEN)) as usize]);
            da[ka..ka + 4].copy_from_slice(&x.to_le_bytes());
            db[kb..kb + 4].copy_from_slice(&y.to_le_bytes());
            ka += (x >> 30) as usize;
            kb += (y >> 30) as usize;
            let (lx, ly) = ((x >> 24) & 0x3f, (y >> 24) & 0x3f);
            wa <<= lx;
            wb <<= ly;
            pa += lx as usize;
            pb += ly as usize;
        }
        oa += ka;
        ob += kb;
    }
    ([pa, pb], [oa, ob])
}

/// Decodes the symbols of substream `s` from output byte `at` and bit `*bit` on into `o`:
/// several symbols a lookup while there is room, then one at a time.
fn decode_rest(table: &Table, s: &[u8], o: &mut [u8], bit: &mut usize, mut at: usize) {
    while at + RUN_ROOM <= o.len() {
        table.decode_runs(s, bit, o, &mut at);
    }
    for piece in o[at..].chunks_mut(4) {
        table.decode(s, bit, piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(symbols: &[u8]) -> Vec<u8> {
        let mut stored = Vec::new();
        Code::for_counts(&counts(symbols)).encode(symbols, &mut stored);
        let mut back = vec![0u8; symbols.len()];
        decode(&stored, &mut back).unwrap();
        assert_eq!(back, symbols);
        stored
    }

    /// Exponent-like bytes: a few values, geometric-ish frequencies.
    fn skewed(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                0x3c - (x.trailing_zeros().min(20) as u8) + ((x >> 40) as u8 & 0x80)
            })
            .collect()
    }

    #[test]
    fn skewed_bytes_shrink_and_round_trip_at_every_length() {
        for n in [0, 1, 2, 1023, 1024, 1025, 4095, 4096, 4097, 5000, 32768, 131072] {
            let s = skewed(n, n as u64 + 3);
            let stored = round_trip(&s);
            let c = counts(&s);
            let estimate = Code::for_counts(&c).encoded_len(&c, n);
            assert!(
                stored.len().abs_diff(estimate) <= n.div_ceil(SUBSTREAM) / 2 + 1,
                "{n}: {} vs {estimate}",
                stored.len()
            );
            if n >= 4096 {
                assert!(stored.len() < n / 2, "{n} skewed bytes stored in {}", stored.len());
            }
        }
    }

    #[test]
    fn one_symbol_and_all_256_symbols_round_trip() {
        // One byte value: a code of no bits, so the substreams are empty.
        assert_eq!(round_trip(&[7u8; 3000]), [0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let all: Vec<u8> = (0..10_000u32).map(|i| (i * 7919 % 256) as u8).collect();
        let stored = round_trip(&all);
        assert!(stored.len() > all.len(), "uniform bytes cannot shrink");
    }

    /// Huffman's construction with a heap: the lightest two nodes joined until one is left,
    /// ties to the lower index (leaves are byte values, then internal nodes as made).
    fn heap_lengths(counts: &[u64; 256]) -> [u8; 256] {
        use std::cmp::Reverse;
        let mut heap: std::collections::BinaryHeap<Reverse<(u64, usize)>> =
            counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(s, &c)| Reverse((c, s))).collect();
        let mut parent = vec![usize::MAX; 256];
        let mut lengths = [0u8; 256];
        if heap.len() == 1 {
            lengths[heap.pop().unwrap().0 .1] = 1;
        }
        while heap.len() > 1 {
            let (Reverse((a, i)), Reverse((b, j))) = (heap.pop().unwrap(), heap.pop().unwrap());
            parent.push(usize::MAX);
            parent[i] = parent.len() - 1;
            parent[j] = parent.len() - 1;
            heap.push(Reverse((a + b, parent.len() - 1)));
        }
        for s in (0..256).filter(|&s| counts[s] > 0 && parent[s] != usize::MAX) {
            let mut n = s;
            while parent[n] != usize::MAX {
                lengths[s] += 1;
                n = parent[n];
            }
        }
        lengths
    }

    /// Entry `v` of the runs table, found by decoding one code at a time from the entries.
    fn run_by_entries(entries: &[u16; 1 << MAX_LEN], v: usize) -> u32 {
        let mask = (1usize << MAX_LEN) - 1;
        let (mut symbols, mut len, mut count) = (0u32, 0u32, 0u32);
        while count < 3 {
            let e = entries[(v << len) & mask] as u32;
            let l = e >> 8;
            if count > 0 && len + l > MAX_LEN {
                break;
            }
            symbols |= (e & 0xff) << (8 * count);
            len += l;
            count += 1;
            if len > MAX_LEN {
                break;
            }
        }
        symbols | len << 24 | count << 30
    }

    #[test]
    fn the_runs_table_holds_what_decoding_one_code_at_a_time_gives() {
        let mut lanes = vec![vec![7u8; 100], vec![1, 2], (0..=255).collect::<Vec<u8>>()];
        lanes.extend((1..20).map(|seed| skewed(5000, seed)));
        for lane in lanes {
            let mut stored = Vec::new();
            Code::for_counts(&counts(&lane)).encode(&lane, &mut stored);
            let (table, _) = Table::read(&stored).unwrap();
            for v in 0..1 << MAX_LEN {
                assert_eq!(table.runs[v], run_by_entries(&table.entries, v), "entry {v}");
            }
        }
        // An incomplete code (one symbol of length 2): bits that start no code are poison.
        let (table, _) = Table::read(&[0, 9, 2]).unwrap();
        for v in 0..1 << MAX_LEN {
            assert_eq!(table.runs[v], run_by_entries(&table.entries, v), "entry {v}");
        }
    }

    #[test]
    fn long_codes_are_limited() {
        // Fibonacci-like counts would need codes far longer than 11 bits.
        let mut symbols = Vec::new();
        let (mut a, mut b) = (1usize, 1usize);
        for s in 0..24u8 {
            symbols.extend(std::iter::repeat_n(s, a));
            (a, b) = (b, a + b);
        }
        let lengths = code_lengths(&counts(&symbols));
        assert!(lengths.iter().all(|&l| l as u32 <= MAX_LEN));
        round_trip(&symbols);
    }

    #[test]
    fn damage_is_refused_never_decoded_past_the_output() {
        let s = skewed(9000, 11);
        let mut stored = Vec::new();
        Code::for_counts(&counts(&s)).encode(&s, &mut stored);
        let mut out = vec![0u8; s.len()];
        // Cut anywhere: refused.
        for cut in [0, 1, 5, 40, stored.len() / 2, stored.len() - 1] {
            assert!(decode(&stored[..cut], &mut out).is_err(), "cut at {cut}");
        }
        // A table out of order, and one over-subscribed.
        let mut bad = stored.clone();
        bad.swap(1, 3);
        bad.swap(2, 4);
        assert!(decode(&bad, &mut out).is_err());
        let mut bad = stored.clone();
        bad[2] = 1;
        bad[4] = 1;
        assert!(decode(&bad, &mut out).is_err());
        // One more byte in a substream: refused.
        let mut longer = stored.clone();
        longer.push(0);
        assert!(decode(&longer, &mut out).is_err());
        // A flipped bit: an error or other bytes (which the chunk's hash then refuses).
        for at in [stored.len() - 100, stored.len() - 1] {
            let mut bad = stored.clone();
            bad[at] ^= 0x10;
            let mut got = vec![0u8; s.len()];
            if decode(&bad, &mut got).is_ok() {
                assert_ne!(got, s);
            }
        }
    }

    proptest! {
        #[test]
        fn code_lengths_are_those_of_huffmans_construction(
            counts in proptest::collection::vec(prop_oneof![Just(0u64), 1u64..4, 1u64..100_000], 256)
        ) {
            let counts: [u64; 256] = counts.try_into().unwrap();
            prop_assert_eq!(unlimited_lengths(&counts), heap_lengths(&counts));
        }

        #[test]
        fn any_bytes_round_trip(data in proptest::collection::vec(any::<u8>(), 0..9000), narrow in any::<bool>()) {
            let data: Vec<u8> = if narrow { data.iter().map(|b| b % 5).collect() } else { data };
            round_trip(&data);
        }
    }
}
