// gstore's float-codec decode on the GPU: joins the byte lanes of a float-coded chunk (store
// codec 3, docs/FORMAT.md: lane i holds byte i of every 2- or 4-byte word) back into words.
// The lanes are already in device memory: raw lanes as they arrived in the staging buffer,
// zstd lanes as nvCOMP decoded them. The joined bytes then go through `verify_chunks` like any
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

/// Joins words `first`, `first + step`, ... and tail bytes likewise: one thread's share.
__device__ __forceinline__ void join_share(const LaneJob &job, unsigned int first, unsigned int step) {
    unsigned char *dst = (unsigned char *)job.dst;
    const unsigned char *l0 = (const unsigned char *)job.lane[0];
    const unsigned char *l1 = (const unsigned char *)job.lane[1];
    unsigned int n = job.words;
    if (job.width == 2) {
        for (unsigned int i = first; i < n; i += step) {
            dst[2 * i] = l0[i];
            dst[2 * i + 1] = l1[i];
        }
    } else {
        const unsigned char *l2 = (const unsigned char *)job.lane[2];
        const unsigned char *l3 = (const unsigned char *)job.lane[3];
        for (unsigned int i = first; i < n; i += step) {
            dst[4 * i] = l0[i];
            dst[4 * i + 1] = l1[i];
            dst[4 * i + 2] = l2[i];
            dst[4 * i + 3] = l3[i];
        }
    }
    const unsigned char *tail = (const unsigned char *)job.tail;
    unsigned long long end = (unsigned long long)n * job.width;
    for (unsigned int i = first; i < job.tail_len; i += step) dst[end + i] = tail[i];
}

extern "C" __global__ void __launch_bounds__(JOIN_THREADS) join_lanes(const LaneJob *jobs) {
    __shared__ int whole;
    const LaneJob &job = jobs[blockIdx.x];
    if (threadIdx.x == 0) whole = lanes_whole(job);
    __syncthreads();
    if (whole) join_share(job, threadIdx.x, JOIN_THREADS);
    if (threadIdx.x == 0) {
        *(unsigned long long *)job.joined_len =
            whole ? (unsigned long long)job.words * job.width + job.tail_len : 0ull;
    }
}
