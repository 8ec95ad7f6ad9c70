// gstore's float-codec decode on the GPU (store codec 3, docs/FORMAT.md: lane i holds byte i
// of every 2- or 4-byte word): Huffman-coded lanes (lane codec 2) decoded, and a chunk's
// lanes joined back into words. Device functions only: load.cu holds the kernel.

// ---- Joining lanes ----

/// Byte `b` of a chunk's plain bytes: byte `b % W` of word `b / W`, or a tail byte.
template <unsigned int W>
__device__ __forceinline__ unsigned char joined_byte(const unsigned char *const lanes[4], const unsigned char *tail,
                                                     unsigned int words, unsigned int b) {
    return b < words * W ? lanes[b % W][b / W] : tail[b - words * W];
}

/// Joins the 16-byte units at `i`, `i + 16 * step`, ... below `end` (each unit's first byte is
/// byte `R` of a word): each unit's 16 bytes gathered from the lanes, all loads in flight
/// together, and written with one aligned store.
template <unsigned int W, unsigned int R>
__device__ __forceinline__ void join_units(unsigned char *dst, const unsigned char *const lanes[4], unsigned int i,
                                           unsigned int end, unsigned int step) {
    for (; i < end; i += 16 * step) {
        unsigned int q = (i - R) / W;
        unsigned int w[4] = {0, 0, 0, 0};
#pragma unroll
        for (unsigned int k = 0; k < 16; k++) {
            w[k / 4] |= (unsigned int)lanes[(R + k) % W][q + (R + k) / W] << (8 * (k % 4));
        }
        uint4 v;
        v.x = w[0]; v.y = w[1]; v.z = w[2]; v.w = w[3];
        *(uint4 *)(dst + i) = v;
    }
}

/// Thread `first`'s share (of `step` threads) of joining `words` words of `W` bytes from
/// `lanes`, then `tail_len` tail bytes, into `dst`: the bytes before `dst`'s first 16-byte
/// boundary and after the last one within whole words one by one, the units between them by
/// [`join_units`].
template <unsigned int W>
__device__ __forceinline__ void join_share(unsigned char *dst, const unsigned char *const lanes[4],
                                           const unsigned char *tail, unsigned int words, unsigned int tail_len,
                                           unsigned int first, unsigned int step) {
    unsigned int n = words, whole = n * W, len = whole + tail_len;
    unsigned int head = (16u - (unsigned int)((unsigned long long)dst & 15ull)) & 15u;
    if (head > whole) head = whole;
    unsigned int end = head + ((whole - head) & ~15u), at = head + 16 * first;
    // Every unit starts at the same byte of a word (16 is a multiple of W): one branch per chunk.
    switch (head % W) {
    case 0: join_units<W, 0>(dst, lanes, at, end, step); break;
    case 1: join_units<W, 1 % W>(dst, lanes, at, end, step); break;
    case 2: join_units<W, 2 % W>(dst, lanes, at, end, step); break;
    default: join_units<W, 3 % W>(dst, lanes, at, end, step); break;
    }
    for (unsigned int i = first; i < head; i += step) dst[i] = joined_byte<W>(lanes, tail, n, i);
    for (unsigned int i = end + first; i < len; i += step) dst[i] = joined_byte<W>(lanes, tail, n, i);
}

// ---- Huffman lanes (lane codec 2) ----
//
// Stored form (docs/FORMAT.md): k - 1 (one byte), k pairs (symbol, code length) in canonical
// order (a lane of one byte value: one pair of length 0, no bits), one u32 LE end offset per
// substream of 1024 symbols, then the substreams' bits, codes most significant bit first, each
// substream starting on a byte boundary and padded with zero bits. A block decodes a lane:
// thread 0 reads the code, the block fills a table of every 11-bit prefix (its symbol and
// code length, or no code), then each thread decodes whole substreams on its own. Every read
// stays inside the lane's stored bytes and every write inside its `words` output bytes,
// whatever the input: damaged input makes the lane fail, and the chunk with it.

#define HUFF_SUBSTREAM 1024
#define HUFF_MAX_LEN 11
#define HUFF_TABLE (1u << HUFF_MAX_LEN)

/// The canonical code of one lane, as read from its header: per code length, the first code,
/// the number of codes and the index (in the header's list) of the first symbol.
struct HuffCode {
    unsigned int first[HUFF_MAX_LEN + 1];
    unsigned int count[HUFF_MAX_LEN + 1];
    unsigned int index[HUFF_MAX_LEN + 1];
};

/// Reads the code table of the `k` pairs at `pairs`; false when it is out of canonical order
/// or over-subscribed.
__device__ __forceinline__ bool huff_read_code(const unsigned char *pairs, unsigned int k, HuffCode &c) {
    for (unsigned int l = 0; l <= HUFF_MAX_LEN; l++) c.first[l] = c.count[l] = c.index[l] = 0;
    unsigned int code = 0, prev = 0, prev_sym = 0;
    for (unsigned int i = 0; i < k; i++) {
        unsigned int sym = pairs[2 * i], l = pairs[2 * i + 1];
        // A length of 0 is the code of no bits of a lane holding one byte value.
        if ((l == 0 && k != 1) || l > HUFF_MAX_LEN || l < prev || (i > 0 && l == prev && sym <= prev_sym)) return false;
        if (i > 0) code = (code + 1) << (l - prev);
        if (code >= (1u << l)) return false;
        if (c.count[l] == 0) {
            c.first[l] = code;
            c.index[l] = i;
        }
        c.count[l]++;
        prev = l;
        prev_sym = sym;
    }
    return true;
}

/// The table entry of the 11-bit prefix `v`: the symbol of the code it starts with in the low
/// byte and that code's length above it, or 0 when it starts no code.
__device__ __forceinline__ unsigned short huff_entry(const HuffCode &c, const unsigned char *pairs, unsigned int v) {
#pragma unroll
    for (unsigned int l = 1; l <= HUFF_MAX_LEN; l++) {
        unsigned int d = (v >> (HUFF_MAX_LEN - l)) - c.first[l];
        if (d < c.count[l]) return (unsigned short)(pairs[2 * (c.index[l] + d)] | l << 8);
    }
    return 0;
}

/// The little-endian word `w` read big-endian: its first byte in memory on top.
__device__ __forceinline__ unsigned int huff_big_endian(unsigned int w) {
    return (w >> 24) | ((w >> 8) & 0xff00u) | ((w << 8) & 0xff0000u) | (w << 24);
}

/// Decodes one substream of `symbols` symbols, its bits at `bits[start..end)`, into `out`
/// through `table`; false when its bits start no code, run past its end, or hold more than
/// its codes and padding. Four symbols are written at once where `out` allows. The bits are
/// read a word at a time, the next word loaded while the symbols before it decode: the
/// aligned word holding the next byte (it lies in the lane's allocation, as `load_words` in
/// blake3.cuh argues), its bytes before `start` and from `end` on masked off and never
/// counted, so what is accepted is exactly what a byte-by-byte reader accepts.
__device__ __forceinline__ bool huff_substream(const unsigned short *table, const unsigned char *bits,
                                               unsigned int start, unsigned int end, unsigned char *out,
                                               unsigned int symbols) {
    unsigned long long buf = 0;  // bits read ahead, at the top
    unsigned int held = 0, pos = start, word = 0;
    const unsigned long long base = (unsigned long long)bits;
    unsigned int next = pos < end ? *(const unsigned int *)((base + pos) & ~3ull) : 0;
    bool aligned = ((unsigned long long)out & 3ull) == 0;
    for (unsigned int i = 0;; i++) {
        while (held <= 32 && pos < end) {
            unsigned int off = (unsigned int)((base + pos) & 3ull), n = 4 - off;
            if (n > end - pos) n = end - pos;
            unsigned int w = huff_big_endian(next) << (8 * off);
            if (n < 4) w &= ~(0xffffffffu >> (8 * n));
            buf |= (unsigned long long)w << (32 - held);
            held += 8 * n;
            pos += n;
            if (pos < end) next = *(const unsigned int *)((base + pos) & ~3ull);
        }
        if (i == symbols) break;
        unsigned int e = table[buf >> (64 - HUFF_MAX_LEN)], len = e >> 8;
        if (len == 0 || len > held) return false;
        buf <<= len;
        held -= len;
        word |= (e & 0xffu) << (8 * (i & 3u));
        if ((i & 3u) == 3u && aligned) {
            *(unsigned int *)(out + i - 3) = word;
            word = 0;
        } else if (!aligned) {
            out[i] = (unsigned char)(e & 0xffu);
        }
    }
    if (aligned) {
        for (unsigned int i = symbols & ~3u; i < symbols; i++) out[i] = (unsigned char)(word >> (8 * (i & 3u)));
    }
    return pos == end && held < 8 && buf == 0;
}

/// Reads the u32 LE at `p`.
__device__ __forceinline__ unsigned int huff_u32(const unsigned char *p) {
    return p[0] | (unsigned int)p[1] << 8 | (unsigned int)p[2] << 16 | (unsigned int)p[3] << 24;
}

/// Where a Huffman lane's parts lie, as read from its stored bytes.
struct HuffLane {
    unsigned int words, subs;
    unsigned long long header, bits_at;
};

/// Thread 0's part of decoding the Huffman lane stored in `len` bytes at `s` into `words`
/// bytes: reads its code into `code` and its layout into `lane`; false when its header is
/// damaged or its substream ends cannot fit.
__device__ __forceinline__ bool huff_begin(const unsigned char *s, unsigned int len, unsigned int words, HuffCode &code,
                                           HuffLane &lane) {
    lane.words = words;
    lane.subs = (words + HUFF_SUBSTREAM - 1) / HUFF_SUBSTREAM;
    unsigned int k = len > 0 ? s[0] + 1u : 0;
    lane.header = 1 + 2ull * k;
    lane.bits_at = lane.header + 4ull * lane.subs;
    // With no substream (an empty lane) nothing may follow the ends.
    return len > 0 && lane.bits_at <= len && (lane.subs > 0 || lane.bits_at == len) && huff_read_code(s + 1, k, code);
}

/// Thread `t`'s share (of `THREADS`) of filling `table` from `code` (a lane of one byte value
/// needs none).
__device__ __forceinline__ void huff_fill(const HuffCode &code, const unsigned char *s,
                                          unsigned short table[HUFF_TABLE], unsigned int t) {
    if (code.count[0] != 0) return;
    for (unsigned int v = t; v < HUFF_TABLE; v += THREADS) table[v] = huff_entry(code, s + 1, v);
}

/// Thread `t`'s share (of `THREADS`) of decoding the lane's substreams into `out`; false when
/// one of them does not decode whole.
__device__ __forceinline__ bool huff_decode_share(const unsigned char *s, unsigned int len, const HuffCode &code,
                                                  const HuffLane &lane, const unsigned short *table,
                                                  unsigned char *out, unsigned int t) {
    const unsigned char *pairs = s + 1;
    bool single = code.count[0] != 0;  // one byte value, codes of no bits
    unsigned long long bits_len = len - lane.bits_at;
    bool good = true;
    for (unsigned int j = t; j < lane.subs; j += THREADS) {
        unsigned int start = j == 0 ? 0 : huff_u32(s + lane.header + 4 * (j - 1));
        unsigned int end = huff_u32(s + lane.header + 4 * j);
        unsigned int first = j * HUFF_SUBSTREAM;
        unsigned int symbols = lane.words - first < HUFF_SUBSTREAM ? lane.words - first : HUFF_SUBSTREAM;
        bool whole = start <= end && end <= bits_len && (j + 1 < lane.subs || end == bits_len);
        if (whole && single) {
            for (unsigned int i = 0; i < symbols; i++) out[first + i] = pairs[0];
            whole = start == end;
        } else if (whole) {
            whole = huff_substream(table, s + lane.bits_at, start, end, out + first, symbols);
        }
        good &= whole;
    }
    return good;
}

/// The most bytes a lane's code takes at its start: k - 1 and k (symbol, length) pairs.
#define HUFF_HEAD (1u + 2u * 256u)

/// The block's `THREADS` threads decode the Huffman lane stored in `len` bytes at `s` into
/// `words` bytes at `out`, through `head`, `code`, `lane`, `table` and `ok` (shared); false
/// (for every thread) when it does not decode to exactly that. The lane's first bytes (its
/// code) are copied into `head` by the whole block first, so that thread 0 reads the code and
/// every thread fills the table from shared memory, not one global load after another.
/// Starts and ends with a barrier.
__device__ bool huff_lane(const unsigned char *s, unsigned int len, unsigned int words, unsigned char *out,
                          unsigned char head[HUFF_HEAD], HuffCode &code, HuffLane &lane,
                          unsigned short table[HUFF_TABLE], int &ok) {
    __syncthreads();  // the previous lane's header, table and flag are no longer read
    for (unsigned int i = threadIdx.x; i < len && i < HUFF_HEAD; i += THREADS) head[i] = s[i];
    __syncthreads();
    // The code lies in the first HUFF_HEAD bytes: huff_begin reads its pairs only once the
    // lane is long enough to hold them.
    if (threadIdx.x == 0) ok = huff_begin(head, len, words, code, lane);
    __syncthreads();
    if (!ok) return false;
    huff_fill(code, head, table, threadIdx.x);
    __syncthreads();
    if (!huff_decode_share(s, len, code, lane, table, out, threadIdx.x)) ok = 0;
    __syncthreads();
    return ok;
}
