// Runs the hashing code of src/cuda/kernels/load.cu (blake3.cuh) on the host, one emulated thread block
// at a time, so CI (no GPU) checks it against the BLAKE3 reference. Phases the kernel splits
// with __syncthreads run here one after the other, over every thread.
// Usage: check_kernel_host FILE KEY OFFSET:LEN... — prints the BLAKE3 hex of each slice of
// FILE, keyed with KEY (64 hex digits) or unkeyed when KEY is "-". With KEY "copy" it instead
// copies each slice as the kernel places a chunk, to every offset from a 16-byte boundary, and
// prints "copied N" after N copies that matched and wrote nothing around them.
#include "host_cuda.h"
#include "../src/cuda/kernels/load.cu"

static void hash(const unsigned char *src, unsigned len, const IdKey &key, unsigned out[8]) {
    unsigned chunks = len == 0 ? 1u : (len + CHUNK_LEN - 1) / CHUNK_LEN;
    unsigned per = 1;
    while ((chunks + per - 1) / per > THREADS) per <<= 1;
    unsigned groups = (chunks + per - 1) / per;
    static unsigned cvs[THREADS][8];
    for (unsigned t = 0; t < groups; t++) {
        unsigned first = t * per, count = chunks - first < per ? chunks - first : per;
        subtree_cv(src, len, first, count, groups == 1, key, cvs[t]);
    }
    for (unsigned n = groups; n > 1; n = (n + 1) / 2) {
        static unsigned merged[THREADS][8];
        for (unsigned t = 0; t < n / 2; t++) {
            memcpy(merged[t], cvs[2 * t], 32);
            parent_cv(merged[t], cvs[2 * t + 1], n == 2, key);
        }
        for (unsigned t = 0; t < n / 2; t++) memcpy(cvs[t], merged[t], 32);
        if (n & 1u) memcpy(cvs[n / 2], cvs[n - 1], 32);
    }
    memcpy(out, cvs[0], 32);
}

int main(int argc, char **argv) {
    static_assert(sizeof(Job) == 80, "Job is 80 bytes, as the Rust side writes it");
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    std::vector<unsigned char> data;
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
    data.resize(data.size() + 64);  // the kernel's word loads may read up to 3 bytes past a slice
    if (strcmp(argv[2], "copy") == 0) {
        unsigned copies = 0;
        for (int a = 3; a < argc; a++) {
            unsigned long off = strtoul(argv[a], nullptr, 10);
            unsigned len = (unsigned)strtoul(strchr(argv[a], ':') + 1, nullptr, 10);
            std::vector<unsigned char> area(len + 48, 0xAB);
            for (unsigned shift = 0; shift < 16; shift++) {
                std::fill(area.begin(), area.end(), 0xAB);
                unsigned char *dst = area.data() + ((16 - (unsigned long long)area.data() % 16) % 16) + 16 + shift;
                for (unsigned t = 0; t < THREADS; t++) copy_share(dst, data.data() + off, len, t);
                if (memcmp(dst, data.data() + off, len) != 0 || dst[-1] != 0xAB || dst[len] != 0xAB) {
                    printf("FAIL copy of %u bytes at %lu to %u past a boundary\n", len, off, shift);
                    return 1;
                }
                copies++;
            }
        }
        printf("copied %u\n", copies);
        return 0;
    }
    IdKey key = {};
    if (strcmp(argv[2], "-") != 0) {
        key.keyed = 1;
        for (int i = 0; i < 32; i++) {
            unsigned byte;
            sscanf(argv[2] + 2 * i, "%2x", &byte);
            key.words[i / 4] |= byte << (8 * (i % 4));
        }
    }
    for (int a = 3; a < argc; a++) {
        unsigned long off = strtoul(argv[a], nullptr, 10);
        unsigned len = (unsigned)strtoul(strchr(argv[a], ':') + 1, nullptr, 10);
        unsigned h[8];
        hash(data.data() + off, len, key, h);
        for (int i = 0; i < 8; i++)
            for (int b = 0; b < 4; b++) printf("%02x", (h[i] >> (8 * b)) & 255);
        printf("\n");
    }
    return 0;
}
