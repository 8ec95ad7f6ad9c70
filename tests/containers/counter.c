/* The container counter of tests/containers.rs: holds MIB MiB of known memory, changes one
 * page of it every tick (50 ms) and counts the ticks, checks one page per tick and the whole
 * of it every 20 ticks, and writes "COUNT" (or "BAD ..." and exits 3 if any page is wrong) to
 * /state/count. Static, so the container needs nothing else. Usage: counter MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define WORDS (PAGE / 8)

static uint64_t *mem;
static uint32_t *version;
static size_t pages;

static uint64_t word(size_t page, uint32_t v, size_t i) {
    uint64_t x = (page * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)v << 32) ^ (i * 0xBF58476D1CE4E5B9ULL);
    x ^= x >> 31; x *= 0x94D049BB133111EBULL; x ^= x >> 29;
    /* Small-magnitude float-like words: the high bits repeat, as memory does. */
    return (x & 0x000FFFFFFFFFULL) | 0x3F00000000000000ULL;
}

static void fill(size_t p) {
    for (size_t i = 0; i < WORDS; i++) mem[p * WORDS + i] = word(p, version[p], i);
}

static int check(size_t p) {
    for (size_t i = 0; i < WORDS; i++)
        if (mem[p * WORDS + i] != word(p, version[p], i)) return 0;
    return 1;
}

static void report(const char *text) {
    FILE *f = fopen("/state/count.tmp", "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    rename("/state/count.tmp", "/state/count");
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 256;
    pages = mib * 256;
    mem = malloc(pages * PAGE);
    version = calloc(pages, sizeof *version);
    if (!mem || !version) return 2;
    for (size_t p = 0; p < pages; p++) fill(p);
    char text[64];
    for (uint64_t tick = 1;; tick++) {
        size_t changed = (tick * 7919) % pages;
        version[changed]++;
        fill(changed);
        size_t probe = (tick * 104729) % pages;
        int ok = check(probe);
        if (ok && tick % 20 == 0)
            for (size_t p = 0; p < pages && ok; p++) ok = check(p);
        if (!ok) {
            snprintf(text, sizeof text, "BAD at tick %llu", (unsigned long long)tick);
            report(text);
            return 3;
        }
        snprintf(text, sizeof text, "%llu", (unsigned long long)tick);
        report(text);
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, 0);
    }
}
