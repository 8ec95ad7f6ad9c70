"""A process tree with known memory for the lazy-restore tests. Usage: lazy_tree.py OUTDIR MB
The parent holds MB MiB: unique pages (each 4 KiB page its own content), one 1 MiB block
repeated 8 times (chunks repeated in the image), and a mostly untouched zero region (holes and
zero pages). Its child holds MB/4 MiB of unique pages. Each writes OUTDIR/ready-ROLE (a
checksum of its memory) once set up, then every 10 ms: if OUTDIR/go-ROLE exists it writes
OUTDIR/result-ROLE (the checksum now); the parent also forks, if OUTDIR/fork exists, a child
that writes OUTDIR/result-forked (the checksum of the memory it inherited) and exits. If
OUTDIR/touch-ROLE exists (holding a count N), ROLE rewrites N scattered pages of its memory
and writes OUTDIR/touched-ROLE (the checksum after that)."""
import hashlib
import os
import sys
import time

out, mb = sys.argv[1], int(sys.argv[2])


def unique_pages(n_mib, tag):
    buf = bytearray(n_mib << 20)
    for page in range(len(buf) >> 12):
        head = hashlib.blake2b(f"{tag}:{page}".encode(), digest_size=64).digest()
        buf[page << 12:(page + 1) << 12] = head * 64
    return buf


def put(name, text):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write(text)
    os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))


def serve(role, memory, on_tick=None):
    def checksum():
        h = hashlib.blake2b()
        for m in memory:
            h.update(m)
        return h.hexdigest()

    put("ready-" + role, checksum())
    while True:
        go = os.path.join(out, "go-" + role)
        if os.path.exists(go):
            os.remove(go)
            put("result-" + role, checksum())
        touch = os.path.join(out, "touch-" + role)
        if os.path.exists(touch):
            # Rewrites N scattered pages of its first region (N in the file), as a process
            # that updates part of its state between two checkpoints.
            n = int(open(touch).read())
            os.remove(touch)
            pages = len(memory[0]) >> 12
            for k in range(n):
                page = (k * 7919 + 13) % pages
                head = hashlib.blake2b(f"touched:{page}".encode(), digest_size=64).digest()
                memory[0][page << 12:(page + 1) << 12] = head * 64
            put("touched-" + role, checksum())
        if on_tick:
            on_tick(checksum)
        time.sleep(0.01)


if os.fork() == 0:
    serve("child", [unique_pages(max(1, mb // 4), "child")])
block = unique_pages(1, "block")
memory = [unique_pages(mb, "parent"), block * 8, bytearray(64 << 20)]
memory[2][5 << 20] = 1  # one touched page among holes


def forks(checksum):
    if os.path.exists(os.path.join(out, "fork")):
        os.remove(os.path.join(out, "fork"))
        if os.fork() == 0:
            put("result-forked", checksum())
            os._exit(0)
        os.wait()


serve("parent", memory, forks)
