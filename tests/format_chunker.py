"""Cuts a file into chunks exactly as docs/FORMAT.md ("Chunks") describes it, with the default
store settings, and prints one plain length per line. tests/format.rs compares the lengths with
the manifest gstore wrote: the document alone must be enough to cut the same way.
Usage: format_chunker.py FILE"""
import hashlib
import math
import sys

GEAR = [int.from_bytes(hashlib.md5(bytes([i]) * 64).digest()[:8], "big") for i in range(256)]
MASK = dict(zip(range(6, 26), [
    0x1803110, 0x18035100, 0x1800035300, 0x19000353000, 0x590003530000, 0xd90003530000,
    0xd90103530000, 0xd90303530000, 0xd90313530000, 0xd90f03530000, 0xd90303537000,
    0xd90703537000, 0xd90707537000, 0xd91707537000, 0xd91747537000, 0xd91767537000,
    0xd93767537000, 0xd93777537000, 0xd93777577000, 0xdb3777577000]))
CHUNK_MIN, CHUNK_AVG, CHUNK_MAX, SEGMENT = 16384, 65536, 262144, 16777216
BITS = round(math.log2(CHUNK_AVG))
MASK_S, MASK_L = MASK[BITS + 1], MASK[BITS - 1]


def cut(b, start):
    """Length of the chunk starting at b[start]."""
    n = len(b) - start
    if n <= CHUNK_MIN:
        return n
    end = min(n, CHUNK_MAX)
    center = min(CHUNK_AVG, end)
    h = 0
    i = CHUNK_MIN
    while i < 2 * (end // 2):
        mask = MASK_S if i < 2 * (center // 2) else MASK_L
        for j in (i, i + 1):
            h = ((h << 1) + GEAR[b[start + j]]) & 0xFFFFFFFFFFFFFFFF
            if h & mask == 0:
                return j
        i += 2
    return end


data = open(sys.argv[1], "rb").read()
for s in range(0, len(data), SEGMENT):
    segment = data[s:s + SEGMENT]
    at = 0
    while at < len(segment):
        n = cut(segment, at)
        print(n)
        at += n
