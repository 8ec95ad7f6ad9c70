#!/usr/bin/env bash
# A PyTorch container holding a model in VRAM, checkpointed and restored through gstore and runc
# (no podman, no cuda-checkpoint binary), against the raw path (runc checkpoint/restore with the
# driver API by hand, tests/gpu/raw_cr.py) in the same run. For a GPU machine with an NVIDIA
# driver >= 570, PyTorch, root and no container runtime: runc, CRIU and gstore are carried in
# CARRY_DIR:
#   CARRY_DIR/gstore      the stripped release binary
#   CARRY_DIR/runc        Debian's runc (`apt-get download runc`, dpkg -x, usr/sbin/runc)
#   CARRY_DIR/lib/        libseccomp.so.2, which that runc links
#   CARRY_DIR/criu/       scripts/criu-bundle.sh's CRIU 4.2.1 bundle
#
# The container: an OCI bundle whose rootfs is a read-only bind of the host's / (so the host's
# Python, PyTorch and driver libraries are there as they are), every other real filesystem
# mounted on the host bound read-only at its own path, /dev/nvidia* as devices, a tmpfs /tmp,
# the state directory bound read-write, and the host's network (no network namespace: nothing
# of the network to dump). Its standard streams are /dev/null (CRIU dumps only files it can
# reach from inside the container). It runs serve.py (SIZE: medium, large or qwen8b), whose
# answer to a request is a greedy generation that must equal the one computed before any
# checkpoint; or with SIZE pair:P:C (default pair = pair:28:11) holder.py as two processes that
# both hold CUDA state and compute, a parent with P GiB and its child with C GiB of fp16
# N(0, 0.02), whose answer is both processes' checksums. CRIU's images (raw) and gstore's
# staging go to the same filesystem ($CTR_WORK).
#
# Steps: a probe container (torch sees the GPU); the model container; raw path (lock+checkpoint
# via the driver, runc checkpoint, runc restore, restore+unlock via the driver, answer); gstore
# (checkpoint --container --runtime runc, restore --container (lazy), answer; the same restore
# with --no-lazy, answer, unless CTR_NO_EAGER=1); a second gstore
# checkpoint --leave-running (what it adds, the pause), against raw's pause (driver lock+checkpoint,
# runc checkpoint --leave-running, driver restore+unlock). Prints the times and ratios, exits
# non-zero if a check fails.
# Usage: tests/gpu/container.sh [CARRY_DIR] [SIZE]
set -uo pipefail
cd "$(dirname "$0")/../.."
C=$(realpath "${1:-.devcarry}")
SIZE=${2:-large}
HERE=$(realpath tests/gpu)
W=${CTR_WORK:-/var/tmp/gstore-gpu-ctr}
ID=gstore-gpu-ctr
OUTFILE=${OUT:-/tmp}/container.txt
: >"$OUTFILE"
say() { echo "$*" | tee -a "$OUTFILE"; }
fails=0
check() { if eval "$2"; then say "PASS  $1"; else say "FAIL  $1"; fails=$((fails+1)); fi; }
now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }'; }
js() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }
wait_file() { for _ in $(seq "${2:-1200}"); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }

# A clean start: a container and a bind left by an earlier run go first.
runc_bin() { LD_LIBRARY_PATH="$C/lib" "$C/runc" "$@"; }
runc_bin delete -f "$ID" >/dev/null 2>&1
runc_bin delete -f "$ID-probe" >/dev/null 2>&1
umount "$W/bundle/rootfs" 2>/dev/null
rm -rf "$W"; mkdir -p "$W/bin" "$W/state"; : >"$W/raw-suspend.txt"; : >"$W/raw-resume.txt"
cat >"$W/bin/criu" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH=$C/criu/usr/lib/x86_64-linux-gnu exec $C/criu/usr/sbin/criu "\$@"
WRAP
cat >"$W/bin/runc" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH=$C/lib exec $C/runc "\$@"
WRAP
chmod +x "$W/bin/criu" "$W/bin/runc"
export PATH="$W/bin:$PATH"
G="$C/gstore"
say "$(runc --version | head -1); criu $(criu --version | head -1); $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "kernel $(uname -r); cgroups: $(stat -fc %T /sys/fs/cgroup); $(nproc) CPUs; python3 $(command -v python3)"
export GSTORE_STORE="$W/store"
"$G" -q init >/dev/null

# The bundle. The rootfs: / bound read-only (not recursively: each other filesystem is bound on
# its own below, so runc hands CRIU every mount as an external one).
B="$W/bundle"
mkdir -p "$B/rootfs"
mount --bind / "$B/rootfs" && mount -o remount,bind,ro "$B/rootfs" || { say "FAIL  cannot bind / read-only"; exit 1; }
cp "${CTR_SERVE:-$HERE/serve.py}" "$W/state/serve.py"; cp "$HERE/holder.py" "$W/state/holder.py"
mkdir -p "$W/tmp"; export TMPDIR="$W/tmp"
say "$(df -h --output=target,size,avail "$W" | tail -1); $(free -g | awk '/Mem:/ {print $2 " GiB memory"}')"
runc spec --bundle "$B" || exit 1
python3 - "$B" "$W" "$(python3 -c 'import sys; print(sys.executable)')" "$SIZE" <<'PY' | tee -a "$OUTFILE"
import json, os, stat, sys
bundle, work, python, size = sys.argv[1:]
c = json.load(open(os.path.join(bundle, "config.json")))
skip_types = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "tmpfs", "devtmpfs", "debugfs", "tracefs",
              "securityfs", "bpf", "fusectl", "configfs", "binfmt_misc", "hugetlbfs", "nsfs", "autofs", "pstore",
              "efivarfs", "rpc_pipefs", "nfsd", "ramfs"}
extra = []
for line in open("/proc/self/mountinfo"):
    left, right = line.split(" - ", 1)
    mp = left.split()[4].replace("\\040", " ")
    fstype = right.split()[0]
    if mp == "/" or fstype in skip_types or any(mp == p or mp.startswith(p + "/") for p in
                                                ("/proc", "/sys", "/dev", "/run", "/tmp", work)):
        continue
    if mp not in [m["destination"] for m in extra]:
        extra.append({"destination": mp, "type": "bind", "source": mp, "options": ["bind", "ro"]})
print("extra read-only binds:", ", ".join(f"{m['destination']}" for m in extra) or "none")
devices = []
for d in sorted(os.listdir("/dev")):
    p = os.path.join("/dev", d)
    if d.startswith("nvidia") and os.path.exists(p) and stat.S_ISCHR(os.stat(p).st_mode):
        st = os.stat(p)
        devices.append({"path": p, "type": "c", "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
                        "fileMode": 0o666, "uid": 0, "gid": 0})
print("devices:", ", ".join(d["path"] for d in devices))
env = [f"{k}={v}" for k, v in os.environ.items()
       if k not in ("OUT", "PWD", "OLDPWD", "SHLVL", "_", "GSTORE_STORE") and not k.startswith("BASH_FUNC")]
state = os.path.join(work, "state")
args = [python, os.path.join(state, "serve.py"), os.path.join(state, "serve"), "7", size]
if size.startswith("pair"):
    parent_gib, child_gib = (size.split(":") + ["28", "11"])[1:3] if ":" in size else ("28", "11")
    args = [python, os.path.join(state, "holder.py"), parent_gib, os.path.join(state, "serve"), "1"]
    env += [f"HOLDER_WORKER_GIB={child_gib}", "HOLDER_HALF=1", "HOLDER_ANSWER_ALL=1"]
c["process"].update(terminal=False, cwd="/", env=env + ["PYTHONUNBUFFERED=1"], args=args)
c["root"] = {"path": "rootfs", "readonly": True}
c["mounts"] += extra + [
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
    {"destination": state, "type": "bind", "source": state, "options": ["rbind", "rw"]},
]
c["linux"]["devices"] = devices
c["linux"]["resources"] = {"devices": [{"allow": True, "access": "rwm"}]}
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
c["hostname"] = "gpu-ctr"
json.dump(c, open(os.path.join(bundle, "config.json"), "w"), indent=1)
# The probe: the same container, answering whether torch sees the GPU, its output to a file.
c["process"]["args"] = [python, "-c", "import torch; x = torch.ones(4, device='cuda'); "
                        "print('probe: torch', torch.__version__, torch.cuda.get_device_name(0), float(x.sum()))"]
c["root"]["path"] = os.path.join(bundle, "rootfs")
os.makedirs(os.path.join(work, "probe"), exist_ok=True)
json.dump(c, open(os.path.join(work, "probe", "config.json"), "w"), indent=1)
PY
if [ -z "${CTR_NO_PROBE:-}" ]; then
  t0=$(now)
  (cd "$W/probe" && runc run "$ID-probe" </dev/null >"$W/probe.out" 2>&1)
  say "$(cat "$W/probe.out") ($(dt "$t0" "$(now)") s)"
  if ! grep -q "^probe: torch" "$W/probe.out"; then
    say "FAIL  PyTorch does not run in the container; the host's mounts and driver files:"
    cut -d' ' -f5,9,10 /proc/self/mountinfo | tee -a "$OUTFILE"
    ls -la /dev/nvidia* 2>&1 | tee -a "$OUTFILE"; ldconfig -p | grep -E 'libcuda|libnvidia-ml' | tee -a "$OUTFILE"
    exit 1
  fi
fi

S="$W/state/serve"; mkdir -p "$S"
t0=$(now)
(cd "$B" && runc --log "$W/runc-run.log" run -d "$ID" </dev/null >/dev/null 2>&1) || { say "FAIL  runc run"; cat "$W/runc-run.log"; exit 1; }
wait_file "$S/ready" || { say "FAIL  the model did not load in the container"; runc ps "$ID"; exit 1; }
say "$SIZE in container $ID ready ($(cat "$S/ready")), loaded in $(dt "$t0" "$(now)") s"
counter() { cat "$S/counter" 2>/dev/null || echo 0; }
progressing() { local a; a=$(counter); sleep 1.5; [ "$(counter)" -gt "$a" ]; }
ask() { rm -f "$S/answer"; : >"$S/ask"; }
wait_answer() { for _ in $(seq 12000); do [ -s "$S/answer" ] && return 0; sleep 0.01; done; return 1; }
answer_ok() {
  [ -s "$S/answer" ] && [ "$(cat "$S/answer")" = "$(cat "$S/expect")" ] && return 0
  say "      answer: $(cat "$S/answer" 2>&1)"; say "      expect: $(cat "$S/expect" 2>&1)"; return 1
}
# The container's processes that hold CUDA state (host pids).
gpu_pids() {
  local p out=()
  for p in $(runc ps --format json "$ID" | tr '[],' '   '); do grep -q libcuda "/proc/$p/maps" 2>/dev/null && out+=("$p"); done
  echo "${out[*]}"
}
ask; wait_answer
check "answers deterministically before any checkpoint" "answer_ok"
say "GPU processes of the container: $(gpu_pids); $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';')"

# The raw path: the driver API by hand (raw_cr.py, ctypes) around runc checkpoint / restore.
img="$W/raw-img"; mkdir -p "$img"
pids=$(gpu_pids)
t0=$(now)
if [ -n "$pids" ]; then python3 "$HERE/raw_cr.py" suspend $pids >"$W/raw-suspend.txt" || { say "FAIL  raw suspend"; exit 1; }; fi
t1=$(now)
runc checkpoint --image-path "$img" --work-path "$W/raw-work" "$ID" || { say "FAIL  raw runc checkpoint"; grep Error "$W/raw-work/dump.log" | tail; exit 1; }
t2=$(now)
RAW_CKPT_S=$(dt "$t0" "$t2"); RAW_IMG=$(du -sb "$img" | cut -f1)
say "raw checkpoint: $RAW_CKPT_S s (driver lock+checkpoint $(dt "$t0" "$t1") s [$(cat "$W/raw-suspend.txt")], runc checkpoint $(dt "$t1" "$t2") s); image $(awk -v b="$RAW_IMG" 'BEGIN{printf "%.2f GB", b/1e9}')"
ask
t3=$(now)
runc restore --image-path "$img" --work-path "$W/raw-work-r" --bundle "$B" --detach "$ID" </dev/null >/dev/null 2>"$W/raw-restore.err" || { say "FAIL  raw runc restore"; cat "$W/raw-restore.err"; grep Error "$W/raw-work-r/restore.log" | tail; exit 1; }
t4=$(now)
pids=$(gpu_pids)
if [ -n "$pids" ]; then python3 "$HERE/raw_cr.py" resume $pids >"$W/raw-resume.txt" || { say "FAIL  raw resume"; exit 1; }; fi
t5=$(now)
wait_answer
t6=$(now)
RAW_REST_S=$(dt "$t3" "$t5"); RAW_ANS_S=$(dt "$t3" "$t6")
say "raw restore: answer $RAW_ANS_S s (runc restore $(dt "$t3" "$t4") s, driver restore+unlock $(dt "$t4" "$t5") s [$(cat "$W/raw-resume.txt")])"
check "verified answer after the raw restore" "answer_ok"
check "computes on after the raw restore" "progressing"
rm -rf "$img"

# Raw, left running: the pause from the driver's lock to the driver's unlock around
# runc checkpoint --leave-running.
img="$W/raw-live"; mkdir -p "$img"
pids=$(gpu_pids)
t0=$(now)
if [ -n "$pids" ]; then python3 "$HERE/raw_cr.py" suspend $pids >"$W/raw-live-suspend.txt" || { say "FAIL  raw suspend (left running)"; exit 1; }; fi
t1=$(now)
runc checkpoint --leave-running --image-path "$img" --work-path "$W/raw-live-work" "$ID" || { say "FAIL  raw runc checkpoint --leave-running"; grep Error "$W/raw-live-work/dump.log" | tail; exit 1; }
t2=$(now)
if [ -n "$pids" ]; then python3 "$HERE/raw_cr.py" resume $pids >"$W/raw-live-resume.txt" || { say "FAIL  raw resume (left running)"; exit 1; }; fi
t3=$(now)
RAW_PAUSE_S=$(dt "$t0" "$t3")
say "raw --leave-running: paused $RAW_PAUSE_S s (driver lock+checkpoint $(dt "$t0" "$t1") s, runc checkpoint --leave-running $(dt "$t1" "$t2") s, driver restore+unlock $(dt "$t2" "$t3") s)"
check "computes on after the raw --leave-running checkpoint" "progressing"
rm -rf "$img"

# gstore: checkpoint through runc (GPU state through the driver), the container gone, restore.
t0=$(now)
"$G" --json checkpoint --container "$ID" --runtime runc --tag ctr:full --criu "$W/bin/criu" >"$W/g-ckpt.json" 2>"$W/g-ckpt.err" || { say "FAIL  gstore checkpoint --container"; cat "$W/g-ckpt.err" | tee -a "$OUTFILE"; exit 1; }
t1=$(now)
G_CKPT_S=$(dt "$t0" "$t1")
say "gstore checkpoint: $G_CKPT_S s ($(js "$W/g-ckpt.json" "'GPU pids %s; lock %.2f + gpu %.2f + runc checkpoint %.2f, push %.2f (beside the dump); %.2f GB logical, %.2f GB new' % (d['gpu_pids'], d['timings']['lock_s'] or 0, d['timings']['gpu_checkpoint_s'] or 0, d['timings']['criu_dump_s'], d['push']['seconds'], d['push']['logical_bytes']/1e9, d['push']['new_stored_bytes']/1e9)"))"
check "the checkpoint names the container's GPU process" "[ -n \"\$(js $W/g-ckpt.json \"' '.join(map(str, d['gpu_pids']))\")\" ]"
check "the container is gone after the checkpoint" "! runc state $ID >/dev/null 2>&1"
ask
t2=$(now)
"$G" --json restore ctr:full --container --criu "$W/bin/criu" >"$W/g-rest.json" 2>"$W/g-rest.err" || { say "FAIL  gstore restore --container"; cat "$W/g-rest.err" | tee -a "$OUTFILE"; exit 1; }
t3=$(now)
wait_answer
t4=$(now)
G_ANS_S=$(dt "$t2" "$t4")
say "gstore restore ($(js "$W/g-rest.json" "d['mode']")): answer $G_ANS_S s (command $(dt "$t2" "$t3") s: $(js "$W/g-rest.json" "'images %.2f GB written in %.2f + runc restore %.2f + gpu restore %.2f + unlock %.2f; fill %s' % (d['image_bytes']/1e9, d['write_s'], d['runtime_s'], d['gpu_restore_s'] or 0, d['gpu_unlock_s'] or 0, d['fill'] and '%.2f GB lazy, %.2f s after runc, %d faults' % (d['fill']['lazy_bytes']/1e9, d['fill']['fill_s'], d['fill']['faults']))"))"
check "verified answer after the gstore restore" "answer_ok"
check "computes on after the gstore restore" "progressing"
# The same image restored eagerly (CRIU's images written out first), for comparison; with
# CTR_NO_EAGER=1 skipped (the images written out need the image's size on disk beside the store).
runc delete -f "$ID" >/dev/null 2>&1
G_EAGER_S=skipped
if [ -z "${CTR_NO_EAGER:-}" ]; then
ask
t2=$(now)
"$G" --json restore ctr:full --container --no-lazy --criu "$W/bin/criu" >"$W/g-rest-eager.json" 2>"$W/g-rest-eager.err" || { say "FAIL  gstore restore --container --no-lazy"; cat "$W/g-rest-eager.err" | tee -a "$OUTFILE"; exit 1; }
wait_answer
t4=$(now)
G_EAGER_S=$(dt "$t2" "$t4")
say "gstore restore (eager): answer $G_EAGER_S s ($(js "$W/g-rest-eager.json" "'images %.2f GB written in %.2f + runc restore %.2f + gpu restore %.2f + unlock %.2f' % (d['image_bytes']/1e9, d['write_s'], d['runtime_s'], d['gpu_restore_s'] or 0, d['gpu_unlock_s'] or 0)"))"
check "verified answer after the eager gstore restore" "answer_ok"
else
  "$G" --json restore ctr:full --container --criu "$W/bin/criu" >"$W/g-rest2.json" 2>"$W/g-rest2.err" || { say "FAIL  gstore restore --container (again)"; cat "$W/g-rest2.err" | tee -a "$OUTFILE"; exit 1; }
  progressing
fi

# A second checkpoint, left running: what it adds, and how long the model paused.
"$G" --json checkpoint --container "$ID" --runtime runc --tag ctr:live --leave-running --criu "$W/bin/criu" >"$W/g-live.json" 2>"$W/g-live.err" || { say "FAIL  gstore checkpoint --leave-running"; cat "$W/g-live.err" | tee -a "$OUTFILE"; }
G_PAUSE_S=?
if [ -s "$W/g-live.json" ]; then
  G_PAUSE_S=$(js "$W/g-live.json" "'%.2f' % d['paused_s']")
  say "gstore --leave-running: paused $(js "$W/g-live.json" "round(d['paused_s'], 2)") s, total $(js "$W/g-live.json" "round(d['total_s'], 2)") s; adds $(js "$W/g-live.json" "'%.3f GB of %.2f GB' % (d['push']['new_stored_bytes']/1e9, d['push']['logical_bytes']/1e9)")"
  check "computes on after a --leave-running checkpoint" "progressing"
  ask; wait_answer
  check "verified answer after the --leave-running checkpoint" "answer_ok"
fi
say ""
say "container ($SIZE)         raw        gstore     ratio"
say "checkpoint (s)          $RAW_CKPT_S       $G_CKPT_S       $(ratio "$G_CKPT_S" "$RAW_CKPT_S") x raw"
say "--leave-running pause   $RAW_PAUSE_S       $G_PAUSE_S       $(ratio "$G_PAUSE_S" "$RAW_PAUSE_S") x raw"
say "restore to answer (s)   $RAW_ANS_S       $G_ANS_S       $(ratio "$G_ANS_S" "$RAW_ANS_S") x raw (eager: $G_EAGER_S s, $(ratio "$G_EAGER_S" "$RAW_ANS_S") x raw)"
runc delete -f "$ID" >/dev/null 2>&1
umount "$B/rootfs"
check "store verifies clean" "'$G' -q verify --read-data >/dev/null"
say "$fails failed"
rm -rf "$W/store"
exit $((fails > 0))
