// gstore's load kernel: every chunk a load places in device memory is decoded (float-coded
// chunks: Huffman lanes decoded, lanes joined into words), checked against its id with BLAKE3
// and copied to where it goes, in one launch per range read. One thread block per chunk.
// Stored bytes arrive in a staging area by DMA; zstd (whole chunks, or lanes of float-coded
// ones) is decoded before this kernel by nvCOMP, or on the host.
//
// A mismatch (or a decode that reported an error or a wrong length) lowers `*failed` to the
// job's tag with atomicMin; the host reads it back once the load's streams are done, and the
// load fails naming the chunk, so nothing unchecked is returned.
//
// Built to PTX with scripts/build-ptx.sh (nvcc); the PTX is embedded in the binary and
// compiled by the driver when a load starts, so a machine needs no CUDA toolkit.

#define THREADS 128

#include "blake3.cuh"
#include "floats.cuh"

/// Hash the job's bytes and compare with `expect`.
#define JOB_HASH 1u

/// One chunk to check and place. 80 bytes, laid out as gstore's Rust side writes it.
struct Job {
    unsigned long long src;        // device address of the bytes to hash (a float-coded chunk's lanes join here)
    unsigned long long dst;        // where to copy them (0: nowhere)
    unsigned long long actual_len; // device address of a u64 decoded length to check (0: none)
    unsigned long long status;     // device address of an i32 decode status, 0 = good (0: none)
    unsigned int len;              // plain length in bytes
    unsigned int tag;              // reported through `failed` on a mismatch
    unsigned int flags;            // JOB_*
    unsigned int lanes;            // 1 + the index of its lane job (a float-coded chunk), or 0
    unsigned int expect[8];        // the chunk id: BLAKE3 of the plain bytes, as LE words
};

/// The lanes of one float-coded chunk. 160 bytes, laid out as gstore's Rust side writes it.
struct LaneJob {
    unsigned long long lane[4];        // device address of each lane's `words` decoded bytes
    unsigned long long lane_len[4];    // a zstd lane: device address of its u64 decoded length (else 0)
    unsigned long long lane_status[4]; // a zstd lane: device address of its i32 status, 0 = good (else 0)
    unsigned long long huff[4];        // a Huffman lane: device address of its stored bytes (else 0)
    unsigned int huff_len[4];          // a Huffman lane: its stored length
    unsigned long long tail;           // device address of the `tail_len` bytes past the last word
    unsigned int words;                // words per lane
    unsigned short width;              // 2 or 4
    unsigned short tail_len;           // plain length mod width
};

/// Whether the lanes of `job` that others decoded (zstd lanes, by nvCOMP) decoded without
/// error to exactly `words` bytes each, and its shape matches the chunk's `len` bytes.
__device__ __forceinline__ bool lanes_whole(const LaneJob &job, unsigned int len) {
    unsigned int w = job.width;
    if ((w != 2 && w != 4) || (unsigned long long)job.words * w + job.tail_len != len) return false;
    for (unsigned int i = 0; i < w; i++) {
        if (job.lane_status[i] != 0 && *(const int *)job.lane_status[i] != 0) return false;
        if (job.lane_len[i] != 0 && *(const unsigned long long *)job.lane_len[i] != job.words) return false;
    }
    return true;
}

/// Thread `t`'s share (of `THREADS`) of joining the lanes of `job` into `dst`.
__device__ __forceinline__ void join_lanes(const LaneJob &job, unsigned char *dst, unsigned int t) {
    const unsigned char *const lanes[4] = {(const unsigned char *)job.lane[0], (const unsigned char *)job.lane[1],
                                           (const unsigned char *)job.lane[2], (const unsigned char *)job.lane[3]};
    const unsigned char *tail = (const unsigned char *)job.tail;
    if (job.width == 2) join_share<2>(dst, lanes, tail, job.words, job.tail_len, t, THREADS);
    else join_share<4>(dst, lanes, tail, job.words, job.tail_len, t, THREADS);
}

/// Decodes the Huffman lanes of `job` and joins its lanes into the `len` bytes at `dst`;
/// false (for every thread) when a lane did not decode to exactly `words` bytes.
__device__ bool decode_and_join(const LaneJob &job, unsigned char *dst, unsigned int len, unsigned char head[HUFF_HEAD],
                                HuffCode &code, HuffLane &lane, unsigned short table[HUFF_TABLE], int &ok) {
    if (!lanes_whole(job, len)) return false;
    for (unsigned int i = 0; i < job.width; i++) {
        if (job.huff[i] != 0 && !huff_lane((const unsigned char *)job.huff[i], job.huff_len[i], job.words,
                                           (unsigned char *)job.lane[i], head, code, lane, table, ok)) {
            return false;
        }
    }
    join_lanes(job, dst, threadIdx.x);
    __syncthreads();
    return true;
}

extern "C" __global__ void __launch_bounds__(THREADS) load_chunks(const Job *jobs, const LaneJob *lane_jobs,
                                                                  unsigned int *failed, const IdKey key) {
    __shared__ unsigned int cvs[THREADS][8];
    __shared__ unsigned short table[HUFF_TABLE];
    __shared__ unsigned char head[HUFF_HEAD];
    __shared__ HuffCode code;
    __shared__ HuffLane lane;
    __shared__ int ok;
    const Job &job = jobs[blockIdx.x];
    const unsigned char *src = (const unsigned char *)job.src;
    unsigned int len = job.len;
    if (job.lanes != 0 && !decode_and_join(lane_jobs[job.lanes - 1], (unsigned char *)job.src, len, head, code, lane, table, ok)) {
        if (threadIdx.x == 0) atomicMin(failed, job.tag);
        return;
    }
    if (job.flags & JOB_HASH) {
        unsigned int hash[8];
        block_hash(src, len, key, cvs, hash);
        if (threadIdx.x == 0) {
            bool bad = false;
#pragma unroll
            for (int i = 0; i < 8; i++) bad |= hash[i] != job.expect[i];
            if (job.actual_len) bad |= *(const unsigned long long *)job.actual_len != len;
            if (job.status) bad |= *(const int *)job.status != 0;
            if (bad) atomicMin(failed, job.tag);
        }
    }
    if (job.dst) copy_share((unsigned char *)job.dst, src, len, threadIdx.x);
}
