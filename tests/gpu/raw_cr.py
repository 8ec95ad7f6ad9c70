"""The raw baseline: the CUDA checkpoint driver API called directly through ctypes, no gstore.
Usage: raw_cr.py suspend PID...   (lock all, then checkpoint each: GPU memory moves to host memory)
       raw_cr.py resume PID...    (restore + unlock each)
Prints the seconds each call took."""
import ctypes
import sys
import time

cuda = ctypes.CDLL("libcuda.so.1")


class Args(ctypes.Structure):
    _fields_ = [("timeout_ms", ctypes.c_uint32), ("reserved0", ctypes.c_uint32), ("reserved1", ctypes.c_uint64 * 7)]


def call(name, pid, args=None):
    t = time.time()
    rc = getattr(cuda, name)(ctypes.c_int(pid), ctypes.byref(args) if args else None)
    if rc != 0:
        sys.exit(f"{name}({pid}) failed with CUresult {rc}")
    return time.time() - t


if len(sys.argv) < 3 or sys.argv[1] not in ("suspend", "resume"):
    sys.exit("usage: raw_cr.py suspend|resume PID...")
action, pids = sys.argv[1], [int(p) for p in sys.argv[2:]]
assert cuda.cuInit(0) == 0
if action == "suspend":
    lock = Args(timeout_ms=10000)
    locks = sum(call("cuCheckpointProcessLock", pid, lock) for pid in pids)
    print(f"lock {locks:.3f} checkpoint {sum(call('cuCheckpointProcessCheckpoint', pid) for pid in pids):.3f}")
else:
    print(f"restore {sum(call('cuCheckpointProcessRestore', pid) for pid in pids):.3f} "
          f"unlock {sum(call('cuCheckpointProcessUnlock', pid) for pid in pids):.3f}")
