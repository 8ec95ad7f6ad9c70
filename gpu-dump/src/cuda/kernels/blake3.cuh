// BLAKE3 on the GPU, as gstore's chunk check uses it (the reference algorithm, 32-byte output;
// keyed with the store's chunk-id key in an encrypted store, unkeyed otherwise), and the
// block-wide copy of checked bytes. Device functions only: load.cu holds the kernel.
//
// A chunk's bytes are cut into BLAKE3's 1 KiB chunks; each thread hashes a run of 2^k
// consecutive chunks (a complete subtree of BLAKE3's tree, k as small as the block's thread
// count allows) and the block merges the subtree chaining values pairwise, which yields
// BLAKE3's left-balanced tree.

#define CHUNK_LEN 1024u
#define BLOCK_LEN 64u
#define CHUNK_START 1u
#define CHUNK_END 2u
#define PARENT 4u
#define ROOT 8u
#define KEYED_HASH 16u
#define MAX_DEPTH 32

/// How chunk ids are made: BLAKE3 keyed with `words` (as LE words) when `keyed`, else plain
/// BLAKE3. Passed to the kernel by value.
struct IdKey {
    unsigned int words[8];
    unsigned int keyed;
};

__constant__ unsigned int IV[8] = {
    0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
    0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u,
};

__device__ __forceinline__ unsigned int rotr(unsigned int x, unsigned int n) {
    return (x >> n) | (x << (32u - n));
}

#define G(a, b, c, d, x, y)                                                                    \
    a = a + b + (x); d = rotr(d ^ a, 16); c = c + d; b = rotr(b ^ c, 12);                       \
    a = a + b + (y); d = rotr(d ^ a, 8);  c = c + d; b = rotr(b ^ c, 7);

#define ROUND(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)               \
    G(s0, s4, s8, s12, m[m0], m[m1]) G(s1, s5, s9, s13, m[m2], m[m3])                           \
    G(s2, s6, s10, s14, m[m4], m[m5]) G(s3, s7, s11, s15, m[m6], m[m7])                         \
    G(s0, s5, s10, s15, m[m8], m[m9]) G(s1, s6, s11, s12, m[m10], m[m11])                       \
    G(s2, s7, s8, s13, m[m12], m[m13]) G(s3, s4, s9, s14, m[m14], m[m15])

/// BLAKE3's compression function, keeping the first 8 output words in `cv`.
__device__ __forceinline__ void compress(unsigned int cv[8], const unsigned int m[16],
                                         unsigned long long counter, unsigned int block_len,
                                         unsigned int flags) {
    unsigned int s0 = cv[0], s1 = cv[1], s2 = cv[2], s3 = cv[3];
    unsigned int s4 = cv[4], s5 = cv[5], s6 = cv[6], s7 = cv[7];
    unsigned int s8 = IV[0], s9 = IV[1], s10 = IV[2], s11 = IV[3];
    unsigned int s12 = (unsigned int)counter, s13 = (unsigned int)(counter >> 32);
    unsigned int s14 = block_len, s15 = flags;
    ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
    ROUND(2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
    ROUND(3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1)
    ROUND(10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6)
    ROUND(12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4)
    ROUND(9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7)
    ROUND(11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13)
    cv[0] = s0 ^ s8; cv[1] = s1 ^ s9; cv[2] = s2 ^ s10; cv[3] = s3 ^ s11;
    cv[4] = s4 ^ s12; cv[5] = s5 ^ s13; cv[6] = s6 ^ s14; cv[7] = s7 ^ s15;
}

/// The `N * 4` bytes at `p` (any alignment) as `N` little-endian words, read with aligned word
/// loads: an aligned word holding one of those bytes lies in the same allocation (device
/// allocations are at least 256-byte aligned and sized), so the words around them are mapped.
template <int N>
__device__ __forceinline__ void load_words(const unsigned char *p, unsigned int w[N]) {
    unsigned long long a = (unsigned long long)p;
    const unsigned int *base = (const unsigned int *)(a & ~3ull);
    unsigned int shift = (unsigned int)(a & 3ull) * 8u;
    if (shift == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = base[i];
        return;
    }
    unsigned int lo = base[0];
#pragma unroll
    for (int i = 0; i < N; i++) {
        unsigned int hi = base[i + 1];
        w[i] = (lo >> shift) | (hi << (32u - shift));
        lo = hi;
    }
}

/// Loads one message block of `len` (<= 64) bytes at `p` as little-endian words, zero padded:
/// a full block with aligned word loads, a short one byte by byte.
__device__ __forceinline__ void load_block(const unsigned char *p, unsigned int len, unsigned int m[16]) {
    if (len == BLOCK_LEN) {
        load_words<16>(p, m);
        return;
    }
#pragma unroll
    for (int i = 0; i < 16; i++) m[i] = 0;
    for (unsigned int i = 0; i < len; i++) m[i >> 2] |= (unsigned int)p[i] << ((i & 3u) * 8u);
}

/// The chaining value of BLAKE3 chunk `index` (`len` <= 1024 bytes at `p`); with `root`, the
/// root output (the whole input is this one chunk).
__device__ void chunk_cv(const unsigned char *p, unsigned int len, unsigned long long index, bool root,
                         const IdKey &key, unsigned int cv[8]) {
    unsigned int m[16], next[16];
#pragma unroll
    for (int i = 0; i < 8; i++) cv[i] = key.keyed ? key.words[i] : IV[i];
    unsigned int blocks = len == 0 ? 1u : (len + BLOCK_LEN - 1) / BLOCK_LEN;
    load_block(p, blocks == 1 ? len : BLOCK_LEN, next);
    for (unsigned int b = 0; b < blocks; b++) {
        unsigned int n = b + 1 == blocks ? len - b * BLOCK_LEN : BLOCK_LEN;
#pragma unroll
        for (int i = 0; i < 16; i++) m[i] = next[i];
        // The next block's loads are in flight while this one compresses.
        if (b + 1 < blocks) {
            unsigned int at = (b + 1) * BLOCK_LEN;
            load_block(p + at, b + 2 == blocks ? len - at : BLOCK_LEN, next);
        }
        unsigned int flags = (b == 0 ? CHUNK_START : 0u) | (b + 1 == blocks ? CHUNK_END : 0u);
        if (root && b + 1 == blocks) flags |= ROOT;
        if (key.keyed) flags |= KEYED_HASH;
        compress(cv, m, index, n, flags);
    }
}

/// `left` becomes the parent node of `left` and `right`.
__device__ __forceinline__ void parent_cv(unsigned int left[8], const unsigned int right[8], bool root,
                                          const IdKey &key) {
    unsigned int m[16];
#pragma unroll
    for (int i = 0; i < 8; i++) { m[i] = left[i]; m[i + 8] = right[i]; left[i] = key.keyed ? key.words[i] : IV[i]; }
    compress(left, m, 0, BLOCK_LEN, PARENT | (root ? ROOT : 0u) | (key.keyed ? KEYED_HASH : 0u));
}

/// The chaining value of chunks [first, first + count) of a `len`-byte input at `p`, built as
/// BLAKE3's incremental hasher does (merging complete subtrees as chunks arrive, the rest at
/// the end); with `root`, that range is the whole input and the result is its hash.
__device__ void subtree_cv(const unsigned char *p, unsigned int len, unsigned int first, unsigned int count,
                           bool root, const IdKey &key, unsigned int out[8]) {
    unsigned int stack[MAX_DEPTH][8];
    int depth = 0;
    for (unsigned int c = 0; c < count; c++) {
        unsigned int index = first + c;
        unsigned int start = index * CHUNK_LEN;
        unsigned int n = len - start < CHUNK_LEN ? len - start : CHUNK_LEN;
        bool last = c + 1 == count;
        chunk_cv(p + start, n, index, root && count == 1, key, out);
        if (last) break;
        // A complete subtree of 2^k chunks merges with its left sibling at once.
        unsigned int done = c + 1;
        while ((done & 1u) == 0) {
            depth--;
            parent_cv(stack[depth], out, false, key);
#pragma unroll
            for (int i = 0; i < 8; i++) out[i] = stack[depth][i];
            done >>= 1;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) stack[depth][i] = out[i];
        depth++;
    }
    while (depth > 0) {
        depth--;
        parent_cv(stack[depth], out, root && depth == 0, key);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = stack[depth][i];
    }
}

/// Thread `t`'s share of copying `len` bytes from `src` to `dst` (apart): the bytes before
/// `dst`'s first 16-byte boundary and after its last one byte by byte, the rest 16 bytes per
/// thread, each thread's loads in flight together and written with one aligned store.
__device__ __forceinline__ void copy_share(unsigned char *__restrict__ dst, const unsigned char *__restrict__ src,
                                           unsigned int len, unsigned int t) {
    unsigned int head = (16u - (unsigned int)((unsigned long long)dst & 15ull)) & 15u;
    if (head > len) head = len;
    unsigned int end = head + ((len - head) & ~15u);
    for (unsigned int i = head + 16 * t; i < end; i += 16 * THREADS) {
        unsigned int w[4];
        load_words<4>(src + i, w);
        uint4 v;
        v.x = w[0]; v.y = w[1]; v.z = w[2]; v.w = w[3];
        *(uint4 *)(dst + i) = v;
    }
    if (t < head) dst[t] = src[t];
    for (unsigned int i = end + t; i < len; i += THREADS) dst[i] = src[i];
}


/// The BLAKE3 hash of the `len` bytes at `src`, computed by the block's `THREADS` threads
/// through `cvs` (shared); every thread returns after the block's last barrier, and thread 0's
/// `out` holds the hash.
__device__ __forceinline__ void block_hash(const unsigned char *src, unsigned int len, const IdKey &key,
                                           unsigned int cvs[THREADS][8], unsigned int out[8]) {
    unsigned int t = threadIdx.x;
    unsigned int chunks = len == 0 ? 1u : (len + CHUNK_LEN - 1) / CHUNK_LEN;
    unsigned int per = 1;
    while ((chunks + per - 1) / per > THREADS) per <<= 1;
    unsigned int groups = (chunks + per - 1) / per;
    unsigned int cv[8];
    if (t < groups) {
        unsigned int first = t * per;
        unsigned int count = chunks - first < per ? chunks - first : per;
        subtree_cv(src, len, first, count, groups == 1, key, cv);
#pragma unroll
        for (int i = 0; i < 8; i++) cvs[t][i] = cv[i];
    }
    __syncthreads();
    for (unsigned int n = groups; n > 1; n = (n + 1) / 2) {
        bool merge = t < n / 2;
        if (merge) {
#pragma unroll
            for (int i = 0; i < 8; i++) cv[i] = cvs[2 * t][i];
            parent_cv(cv, cvs[2 * t + 1], n == 2, key);
        }
        __syncthreads();
        if (merge) {
#pragma unroll
            for (int i = 0; i < 8; i++) cvs[t][i] = cv[i];
        } else if (t == n / 2 && (n & 1u)) {
#pragma unroll
            for (int i = 0; i < 8; i++) cvs[t][i] = cvs[n - 1][i];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = cvs[0][i];
}
