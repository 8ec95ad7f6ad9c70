// Runs the lane join of src/cuda/kernels/load.cu on the host, the check of lanes others decoded
// first, then one emulated thread at a time, so CI
// (no GPU) checks the join against the float codec's lane layout (docs/FORMAT.md, codec 3):
// lane i holds byte i of every word, then the tail bytes. Prints "ok N" after N cases, or the
// first failing case and exits 1.
#include "host_cuda.h"
#include "../src/cuda/kernels/load.cu"

static unsigned long long rng = 0x9e3779b97f4a7c15ull;
static unsigned char next_byte() {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (unsigned char)rng;
}

/// Whether the job's lanes are whole; if so, joins them into `dst` with every thread's share.
static bool run(const LaneJob &job, unsigned len, unsigned char *dst) {
    if (!lanes_whole(job, len)) return false;
    for (unsigned t = 0; t < THREADS; t++) join_lanes(job, dst, t);
    return true;
}

// One case: `len` plain bytes as words of `width`, joined to `shift` bytes past a 16-byte
// boundary; `damage` 0 none, 1 a lane status, 2 a lane length. Returns whether the kernel did
// what it must (and wrote nothing outside the chunk's bytes).
static bool one(unsigned len, unsigned width, int damage, unsigned shift) {
    std::vector<unsigned char> plain(len), lanes(len), area(len + 48, 0xAB);
    unsigned char *out = area.data() + ((16 - (unsigned long long)area.data() % 16) % 16) + 16 + shift;
    for (auto &b : plain) b = next_byte();
    unsigned n = len / width;
    for (unsigned i = 0; i < n; i++)
        for (unsigned k = 0; k < width; k++) lanes[k * n + i] = plain[i * width + k];
    unsigned long long decoded[4] = {n, n, n, n};
    int status[4] = {0, 0, 0, 0};
    LaneJob job;
    memset(&job, 0, sizeof job);
    for (unsigned k = 0; k < width; k++) {
        job.lane[k] = (unsigned long long)&lanes[k * n];
        if (k % 2 == 1) {  // odd lanes stand for zstd lanes, even ones for raw lanes
            job.lane_len[k] = (unsigned long long)&decoded[k];
            job.lane_status[k] = (unsigned long long)&status[k];
        }
    }
    if (damage == 1) status[1] = -7;
    if (damage == 2) decoded[1] = n + 1;
    job.tail = (unsigned long long)&plain[n * width];
    job.words = n;
    job.width = (unsigned short)width;
    job.tail_len = (unsigned short)(len - n * width);
    bool joined = run(job, len, out);
    bool outside = out[-1] == 0xAB && out[len] == 0xAB;
    if (damage != 0) return !joined && out[0] == 0xAB && outside;
    return joined && memcmp(out, plain.data(), len) == 0 && outside;
}

int main() {
    static_assert(sizeof(LaneJob) == 160, "LaneJob is 160 bytes, as the Rust side writes it");
    const unsigned lens[] = {0, 1, 2, 3, 5, 255, 256, 257, 4097, 65535, 65536, 65537, 262147};
    unsigned cases = 0;
    for (unsigned len : lens)
        for (unsigned width : {2u, 4u})
            for (int damage = 0; damage < 3; damage++) {
                if (damage != 0 && len < width) continue;
                for (unsigned shift = 0; shift < 16; shift++) {
                    if (!one(len, width, damage, shift)) {
                        printf("FAIL len %u width %u damage %d shift %u\n", len, width, damage, shift);
                        return 1;
                    }
                }
                cases++;
            }
    printf("ok %u\n", cases);
    return 0;
}
