// gstore's float-codec decode on the GPU: decodes Huffman-coded lanes (lane codec 2) and joins
// the byte lanes of a float-coded chunk (store codec 3, docs/FORMAT.md: lane i holds byte i of
// every 2- or 4-byte word) back into words. The lanes are already in device memory: raw lanes
// as they arrived in the staging buffer, Huffman lanes as `decode_huffman` decoded them, zstd
// lanes as nvCOMP decoded them. The joined bytes then go through `verify_chunks` like any
// decoded chunk, so a wrong join can never be placed unnoticed.
//
// One thread block per job. Thread 0 first checks that every zstd lane decoded without error
// to exactly `words` bytes; a job whose lanes did not writes 0 as its joined length (which
// `verify_chunks` then reports as a decode of the wrong length) and joins nothing.
//
// Built to PTX with scripts/build-ptx.sh (nvcc), embedded in the binary like verify.cu's.

#define JOIN_THREADS 256

/// One float-coded chunk to join. 128 bytes, laid out as gstore's Rust side writes it.
struct LaneJob {
    unsigned long long lane[4];        // device address of each lane's `words` bytes
    unsigned long long lane_len[4];    // device address of a zstd lane's u64 decoded length (0: raw lane)
    unsigned long long lane_status[4]; // device address of a zstd lane's i32 status, 0 = good (0: raw)
    unsigned long long tail;           // device address of the `tail_len` bytes past the last word
    unsigned long long dst;            // where the joined plain bytes go
    unsigned long long joined_len;     // device address of a u64 written here: the plain length, or 0
    unsigned int words;                // words per lane
    unsigned short width;              // 2 or 4
    unsigned short tail_len;           // plain length mod width
};

/// Whether every zstd lane of `job` decoded without error to exactly `words` bytes.
__device__ __forceinline__ bool lanes_whole(const LaneJob &job) {
    if (job.width != 2 && job.width != 4) return false;
    for (unsigned int i = 0; i < job.width; i++) {
        if (job.lane_status[i] != 0 && *(const int *)job.lane_status[i] != 0) return false;
        if (job.lane_len[i] != 0 && *(const unsigned long long *)job.lane_len[i] != job.words) return false;
    }
    return true;
}

/// Byte `b` of a job's plain bytes: byte `b % W` of word `b / W`, or a tail byte.
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

/// Thread `first`'s share (of `step` threads) of joining a job's words of `W` bytes: the bytes
/// before `dst`'s first 16-byte boundary and after the last one within whole words one by one,
/// the units between them by [`join_units`].
template <unsigned int W>
__device__ __forceinline__ void join_share(const LaneJob &job, unsigned int first, unsigned int step) {
    unsigned char *dst = (unsigned char *)job.dst;
    const unsigned char *const lanes[4] = {(const unsigned char *)job.lane[0], (const unsigned char *)job.lane[1],
                                           (const unsigned char *)job.lane[2], (const unsigned char *)job.lane[3]};
    const unsigned char *tail = (const unsigned char *)job.tail;
    unsigned int n = job.words, whole = n * W, len = whole + job.tail_len;
    unsigned int head = (16u - (unsigned int)((unsigned long long)dst & 15ull)) & 15u;
    if (head > whole) head = whole;
    unsigned int end = head + ((whole - head) & ~15u), at = head + 16 * first;
    // Every unit starts at the same byte of a word (16 is a multiple of W): one branch per job.
    switch (head % W) {
    case 0: join_units<W, 0>(dst, lanes, at, end, step); break;
    case 1: join_units<W, 1 % W>(dst, lanes, at, end, step); break;
    case 2: join_units<W, 2 % W>(dst, lanes, at, end, step); break;
    default: join_units<W, 3 % W>(dst, lanes, at, end, step); break;
    }
    for (unsigned int i = first; i < head; i += step) dst[i] = joined_byte<W>(lanes, tail, n, i);
    for (unsigned int i = end + first; i < len; i += step) dst[i] = joined_byte<W>(lanes, tail, n, i);
}

extern "C" __global__ void __launch_bounds__(JOIN_THREADS) join_lanes(const LaneJob *jobs) {
    __shared__ int whole;
    const LaneJob &job = jobs[blockIdx.x];
    if (threadIdx.x == 0) whole = lanes_whole(job);
    __syncthreads();
    if (whole && job.width == 2) join_share<2>(job, threadIdx.x, JOIN_THREADS);
    if (whole && job.width == 4) join_share<4>(job, threadIdx.x, JOIN_THREADS);
    if (threadIdx.x == 0) {
        *(unsigned long long *)job.joined_len =
            whole ? (unsigned long long)job.words * job.width + job.tail_len : 0ull;
    }
}

// ---- Huffman lanes (lane codec 2) ----
//
// Stored form (docs/FORMAT.md): k - 1 (one byte), k pairs (symbol, code length) in canonical
// order (a lane of one byte value: one pair of length 0, no bits), one u32 LE end offset per
// substream of 1024 symbols, then the substreams' bits, codes
// most significant bit first, each substream starting on a byte boundary and padded with zero
// bits. One thread block per lane; each thread decodes whole substreams on its own, reading
// the code table from the stored bytes (no shared state, so nothing to synchronise). Every
// read stays inside the lane's stored bytes and every write inside its `words` output bytes,
// whatever the input: damaged input sets the job's status, which makes the join refuse the
// chunk (and the chunk check then names it).

#define HUFF_THREADS 128
#define HUFF_SUBSTREAM 1024
#define HUFF_MAX_LEN 11

/// One Huffman-coded lane to decode. 32 bytes, laid out as gstore's Rust side writes it.
struct HuffJob {
    unsigned long long src;    // device address of the lane's stored bytes
    unsigned long long out;    // where its `words` decoded bytes go
    unsigned long long words;  // bytes it decodes to; the join reads it as the lane's decoded length
    unsigned int stored_len;   // stored bytes
    int status;                // 0 on arrival; the kernel sets 1 when the lane does not decode
};

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

/// Decodes substream `j` (of `symbols` symbols, its bits at `bits[start..end)`) into `out`;
/// false when its bits start no code, run past its end, or hold more than its codes and padding.
__device__ __forceinline__ bool huff_substream(const HuffCode &c, const unsigned char *pairs,
                                               const unsigned char *bits, unsigned int start,
                                               unsigned int end, unsigned char *out,
                                               unsigned int symbols) {
    if (c.count[0] != 0) {  // one byte value, codes of no bits
        for (unsigned int i = 0; i < symbols; i++) out[i] = pairs[0];
        return start == end;
    }
    unsigned long long buf = 0;  // bits read ahead, at the top
    unsigned int held = 0, pos = start;
    for (unsigned int i = 0; i < symbols; i++) {
        while (held <= 56 && pos < end) {
            buf |= (unsigned long long)bits[pos++] << (56 - held);
            held += 8;
        }
        unsigned int v = (unsigned int)(buf >> (64 - HUFF_MAX_LEN));
        unsigned int len = 0, index = 0;
#pragma unroll
        for (unsigned int l = 1; l <= HUFF_MAX_LEN; l++) {
            unsigned int d = (v >> (HUFF_MAX_LEN - l)) - c.first[l];
            if (len == 0 && d < c.count[l]) {
                len = l;
                index = c.index[l] + d;
            }
        }
        if (len == 0 || len > held) return false;
        out[i] = pairs[2 * index];
        buf <<= len;
        held -= len;
    }
    return pos == end && held < 8 && buf == 0;
}

/// Reads the u32 LE at `p`.
__device__ __forceinline__ unsigned int huff_u32(const unsigned char *p) {
    return p[0] | (unsigned int)p[1] << 8 | (unsigned int)p[2] << 16 | (unsigned int)p[3] << 24;
}

extern "C" __global__ void __launch_bounds__(HUFF_THREADS) decode_huffman(HuffJob *jobs) {
    HuffJob *job = &jobs[blockIdx.x];
    const unsigned char *s = (const unsigned char *)job->src;
    unsigned long long len = job->stored_len, n = job->words;
    unsigned long long subs = (n + HUFF_SUBSTREAM - 1) / HUFF_SUBSTREAM;
    unsigned int k = len > 0 ? s[0] + 1u : 0;
    unsigned long long header = 1 + 2ull * k, bits_at = header + 4 * subs;
    HuffCode c;
    // With no substream (an empty lane) nothing may follow the ends.
    if (len == 0 || bits_at > len || (subs == 0 && bits_at != len) || !huff_read_code(s + 1, k, c)) {
        if (threadIdx.x == 0) job->status = 1;
        return;
    }
    unsigned long long bits_len = len - bits_at;
    for (unsigned long long j = threadIdx.x; j < subs; j += HUFF_THREADS) {
        unsigned int start = j == 0 ? 0 : huff_u32(s + header + 4 * (j - 1));
        unsigned int end = huff_u32(s + header + 4 * j);
        unsigned long long first = j * HUFF_SUBSTREAM;
        unsigned int symbols = (unsigned int)(n - first < HUFF_SUBSTREAM ? n - first : HUFF_SUBSTREAM);
        bool whole = start <= end && end <= bits_len && (j + 1 < subs || end == bits_len) &&
                     huff_substream(c, s + 1, s + bits_at, start, end,
                                    (unsigned char *)job->out + first, symbols);
        if (!whole) job->status = 1;
    }
}
