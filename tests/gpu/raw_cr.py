"""The raw baseline: the CUDA checkpoint driver API called directly through ctypes, no gstore.
Usage: raw_cr.py suspend PID...   (lock all, then checkpoint each: GPU memory moves to host memory)
       raw_cr.py resume PID... [--pairs OLD=NEW,...]
                                  (restore + unlock each; with --pairs, GPU UUIDs as nvidia-smi
                                  prints them, what was on OLD is restored onto NEW: CUDA 13+)
Prints the seconds each call took."""
import ctypes
import sys
import time

cuda = ctypes.CDLL("libcuda.so.1")


class Args(ctypes.Structure):
    _fields_ = [("timeout_ms", ctypes.c_uint32), ("reserved0", ctypes.c_uint32), ("reserved1", ctypes.c_uint64 * 7)]


class Pair(ctypes.Structure):  # CUcheckpointGpuPair
    _fields_ = [("old", ctypes.c_ubyte * 16), ("new", ctypes.c_ubyte * 16)]


class RestoreArgs(ctypes.Structure):  # CUcheckpointRestoreArgs: gpuPairs @0, gpuPairsCount @8
    _fields_ = [("pairs", ctypes.POINTER(Pair)), ("count", ctypes.c_uint32), ("reserved", ctypes.c_ubyte * 52)]


def uuid_bytes(text):
    raw = bytes.fromhex(text.strip().removeprefix("GPU-").replace("-", ""))
    assert len(raw) == 16, f"not a GPU UUID: {text}"
    return (ctypes.c_ubyte * 16)(*raw)


def call(name, pid, args=None):
    t = time.time()
    rc = getattr(cuda, name)(ctypes.c_int(pid), ctypes.byref(args) if args else None)
    if rc != 0:
        sys.exit(f"{name}({pid}) failed with CUresult {rc}")
    return time.time() - t


args = sys.argv[1:]
restore_args = None
if "--pairs" in args:
    at = args.index("--pairs")
    items = [item.split("=") for item in args[at + 1].split(",")]
    del args[at:at + 2]
    pairs = (Pair * len(items))(*[Pair(uuid_bytes(old), uuid_bytes(new)) for old, new in items])
    restore_args = RestoreArgs(pairs=ctypes.cast(pairs, ctypes.POINTER(Pair)), count=len(items))
if len(args) < 2 or args[0] not in ("suspend", "resume"):
    sys.exit("usage: raw_cr.py suspend|resume PID... [--pairs OLD=NEW,...]")
action, pids = args[0], [int(p) for p in args[1:]]
assert cuda.cuInit(0) == 0
if action == "suspend":
    lock = Args(timeout_ms=10000)
    locks = sum(call("cuCheckpointProcessLock", pid, lock) for pid in pids)
    print(f"lock {locks:.3f} checkpoint {sum(call('cuCheckpointProcessCheckpoint', pid) for pid in pids):.3f}")
else:
    print(f"restore {sum(call('cuCheckpointProcessRestore', pid, restore_args) for pid in pids):.3f} "
          f"unlock {sum(call('cuCheckpointProcessUnlock', pid) for pid in pids):.3f}")
