#!/usr/bin/env bash
# Makes the seed corpus of every fuzz target (fuzz/corpus/TARGET) from real objects: a store
# the release `gstore` pushes two small images into (bf16-like weights, text, a link), its
# packs, manifests, tags, config and chunks (each chunk as its codec byte, plain length and
# stored bytes), a lease and a profile as FORMAT.md gives them, CRIU images of a dumped
# `sleep` (needs root and CRIU: scripts/criu.sh), and HTTP requests for the chunk server's
# routes. The corpus is kept in the repository; run this again after a format change.
#   bash scripts/fuzz-seeds.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
gstore="${CARGO_TARGET_DIR:-target}/release/gstore"
[ -x "$gstore" ] || cargo build --release -p gstore-cli
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
corpus="$PWD/fuzz/corpus"
mkdir -p "$corpus"/{pack,manifest,chunk,records,criu,server}

# A store with two images that share most chunks.
mkdir -p "$work/src/sub"
python3 - "$work/src" <<'EOF'
import random, struct, sys
root = sys.argv[1]
r = random.Random(7)
# bf16 weights: the high halves of small-magnitude float32s.
w = b"".join(struct.pack("<f", r.gauss(0, 0.02))[2:] for _ in range(120_000))
open(f"{root}/weights.bin", "wb").write(w)
open(f"{root}/notes.txt", "w").write("checkpoint notes\n" * 3000)
open(f"{root}/zeros.bin", "wb").write(bytes(70_000))
open(f"{root}/sub/tiny", "w").write("x")
EOF
ln -s sub/tiny "$work/src/link"
"$gstore" --store "$work/st" init >/dev/null
"$gstore" --store "$work/st" push "$work/src" --tag app:v1 >/dev/null
echo "more" >>"$work/src/notes.txt"
"$gstore" --store "$work/st" push "$work/src" --tag app:v2 >/dev/null
# A page image pushed twice with scattered pages rewritten: the second push's pack holds delta
# chunks (a version 2 pack).
mkdir -p "$work/proc"
page_image() {
  python3 - "$work/proc/pages-1.img" "$1" <<'EOF'
import random, struct, sys
path, changes = sys.argv[1], int(sys.argv[2])
r = random.Random(11)
page = lambda: b"".join(struct.pack("<f", r.gauss(0, 0.02))[2:] for _ in range(2048))
pages = [page() for _ in range(256)]
for _ in range(changes):
    pages[r.randrange(256)] = page()
open(path, "wb").write(b"".join(pages))
EOF
}
page_image 0
"$gstore" --store "$work/st" push "$work/proc" --tag proc:v1 >/dev/null
page_image 6
"$gstore" --store "$work/st" push "$work/proc" --tag proc:v2 >/dev/null

python3 - "$work/st" "$corpus" <<'EOF'
import glob, hashlib, json, os, struct, sys
st, corpus = sys.argv[1], sys.argv[2]

def put(target, name, data):
    with open(os.path.join(corpus, target, name), "wb") as f:
        f.write(data)

chunk_ids = []
for i, p in enumerate(sorted(glob.glob(f"{st}/packs/*/*.pack"))):
    data = open(p, "rb").read()
    put("pack", f"real-{i}", data)
    # Each chunk as the chunk target reads it: codec byte, u32 plain length, stored bytes.
    foff, n, version = struct.unpack_from("<QII", data, len(data) - 56)
    size = 113 if version == 2 else 49
    seen = set()
    for k in range(n):
        e = data[foff + size * k: foff + size * (k + 1)]
        chunk_ids.append(e[:32].hex())
        off, slen, plen, codec = struct.unpack_from("<QIIB", e, 32)
        if codec in seen and k > 8:
            continue
        seen.add(codec)
        put("chunk", f"real-{i}-{k}", bytes([codec]) + struct.pack("<I", plen) + data[off:off + slen])
for i, p in enumerate(sorted(glob.glob(f"{st}/manifests/*/*.manifest"))):
    put("manifest", f"real-{i}", open(p, "rb").read())
# records: first byte chooses tag / lease / profile / config / object key / tag name.
for i, p in enumerate(sorted(glob.glob(f"{st}/tags/*/*.tag"))):
    put("records", f"tag-{i}", b"\x00" + open(p, "rb").read())
pack = os.path.basename(sorted(glob.glob(f"{st}/packs/*/*.pack"))[0])[:-5]
manifest = os.path.basename(sorted(glob.glob(f"{st}/manifests/*/*.manifest"))[0])[:-9]
lease = {"format": 1,
         "owner": {"host": "node7", "boot_id": "0d6f3c1e-5b1a-4c4e-9d1e-2f8a7b6c5d4e",
                   "pid_ns": "pid:[4026531836]", "pid": 4242, "start_ticks": 1234567},
         "purpose": "push llama:latest", "packs": [pack], "manifests": [manifest]}
put("records", "lease", b"\x01" + json.dumps(lease, indent=2).encode())
profile = {"format": 1, "segment_bytes": 2097152, "order": [[4242, 0], [4242, 6291456], [4243, 2097152]]}
put("records", "profile", b"\x02" + json.dumps(profile).encode())
put("records", "config", b"\x03" + open(f"{st}/config.json", "rb").read())
put("records", "key-pack", b"\x04" + f"packs/{pack[:2]}/{pack}.pack".encode())
put("records", "key-manifest", b"\x04" + f"manifests/{manifest[:2]}/{manifest}.manifest".encode())
put("records", "key-tombstone", b"\x04" + f"tombstones/packs/{pack[:2]}/{pack}.pack".encode())
put("records", "name", b"\x05" + b"llama-3/8b:step-100")

# server: method byte (GET HEAD PUT DELETE POST OPTIONS), target, header lines, empty line, body.
def req(name, method, target, headers=(), body=b""):
    m = ["GET", "HEAD", "PUT", "DELETE", "POST", "OPTIONS"].index(method)
    head = "\n".join([target, *headers]).encode()
    put("server", name, bytes([m]) + head + b"\n\n" + body)
rd, wr = "Authorization: Bearer reader-token-0123456789", "Authorization: Bearer writer-token-0123456789"
pk = f"packs/{pack[:2]}/{pack}.pack"
mk = f"manifests/{manifest[:2]}/{manifest}.manifest"
tagkey = "tags/app/v1.tag"
req("get-pack-range", "GET", f"/v1/o/{pk}", [rd, "Range: bytes=24-4119"])
req("get-pack-suffix", "GET", f"/v1/o/{pk}", [rd, "Range: bytes=-56"])
req("head-pack", "HEAD", f"/v1/o/{pk}", [rd])
req("get-manifest", "GET", f"/v1/o/{mk}", [rd, 'If-None-Match: "x"'])
req("get-tag", "GET", f"/v1/o/{tagkey}", [rd])
req("list", "GET", "/v1/list?prefix=tags/", [rd])
req("put-tag", "PUT", "/v1/o/tags/ci/t1.tag", [wr, "If-None-Match: *"], open(f"{st}/{tagkey}", "rb").read())
req("put-pack", "PUT", f"/v1/o/{pk}", [wr, "Content-Type: application/octet-stream"],
    open(f"{st}/{pk}", "rb").read()[:200000])
req("delete-lease", "DELETE", "/v1/o/leases/0123456789abcdef0123456789abcdef.lease", [wr, 'If-Match: "abc"'])
req("no-token", "GET", f"/v1/o/{mk}")
req("metrics", "GET", "/metrics")
req("health", "GET", "/v1/health")
req("get-chunk", "GET", f"/v1/chunks/{chunk_ids[0]}", [rd])
req("missing", "POST", "/v1/chunks/missing", [rd, "Content-Type: application/json"],
    json.dumps(chunk_ids[:3] + ["00" * 32]).encode())
EOF

# CRIU images of a real process: pstree, mm and pagemap (first byte 0, 1, 2).
if [ "$(id -u)" = 0 ] && [ -x /opt/criu/sbin/criu ]; then
  mkdir -p "$work/dump"
  setsid sleep 600 </dev/null >/dev/null 2>&1 &
  pid=$!
  /opt/criu/sbin/criu dump -t "$pid" -D "$work/dump" --shell-job >/dev/null 2>&1 || kill -9 "$pid" 2>/dev/null || true
  { wait "$pid"; } 2>/dev/null || true
  for f in "$work/dump"/pstree.img; do [ -f "$f" ] && { printf '\x00'; cat "$f"; } >"$corpus/criu/pstree"; done
  for f in "$work/dump"/mm-*.img; do [ -f "$f" ] && { printf '\x01'; cat "$f"; } >"$corpus/criu/$(basename "$f" .img)"; done
  for f in "$work/dump"/pagemap-*.img; do [ -f "$f" ] && { printf '\x02'; cat "$f"; } >"$corpus/criu/$(basename "$f" .img)"; done
else
  echo "fuzz-seeds: not root or no CRIU in /opt/criu: CRIU seeds left as they are" >&2
fi
for t in pack manifest chunk records criu server; do
  echo "fuzz-seeds: $t: $(ls "$corpus/$t" | wc -l) inputs, $(du -sh "$corpus/$t" | cut -f1)"
done
