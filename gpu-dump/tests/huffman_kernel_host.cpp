// Runs the Huffman lane decode of src/cuda/kernels/load.cu (floats.cuh) on the host, its phases
// one after the other as the kernel's barriers order them (thread 0 reads the code, every
// thread fills its share of the table, every thread decodes its substreams), over the cases in the file named by argv[1], which the Rust test
// wrote with gstore's own Huffman coder: per case a u32 LE stored length, a u32 LE word count,
// one byte saying whether the host decoder accepted the stored bytes, the stored bytes, and (when
// accepted) the decoded bytes. The kernel must agree: accept exactly what the host accepts,
// decode it to the same bytes, and never write past the lane's output. Prints "ok N" after N
// cases, or the first failing case and exits 1.
#include "host_cuda.h"
#include "../src/cuda/kernels/load.cu"

static unsigned u32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (unsigned)p[3] << 24; }

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    std::vector<unsigned char> all;
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) all.insert(all.end(), buf, buf + got);
    fclose(f);
    size_t at = 0;
    unsigned cases = 0;
    while (at < all.size()) {
        unsigned len = u32(&all[at]), words = u32(&all[at + 4]);
        bool accepted = all[at + 8] != 0;
        at += 9;
        // The stored bytes in a buffer of their own size, so a read past them is a heap overrun
        // the sanitizer-free build may miss but the canary below cannot.
        std::vector<unsigned char> stored(all.begin() + at, all.begin() + at + len);
        at += len;
        std::vector<unsigned char> out(words + 1, 0xAB);
        static HuffCode code;
        static HuffLane lane;
        static unsigned short table[HUFF_TABLE];
        bool decoded = huff_begin(stored.data(), len, words, code, lane);
        if (decoded) {
            for (unsigned t = 0; t < THREADS; t++) huff_fill(code, stored.data(), table, t);
            for (unsigned t = 0; t < THREADS; t++)
                decoded &= huff_decode_share(stored.data(), len, code, lane, table, out.data(), t);
        }
        bool ok = out[words] == 0xAB && decoded == accepted;
        if (accepted) {
            ok = ok && memcmp(out.data(), &all[at], words) == 0;
            at += words;
        }
        if (!ok) {
            printf("case %u: %u stored bytes, %u words, host %s, kernel %s, canary %s\n", cases, len, words,
                   accepted ? "accepted" : "refused", decoded ? "accepted" : "refused",
                   out[words] == 0xAB ? "intact" : "overwritten");
            return 1;
        }
        cases++;
    }
    printf("ok %u\n", cases);
    return 0;
}
