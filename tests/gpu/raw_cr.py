"""The raw baseline: the CUDA checkpoint driver API called directly through ctypes, no gstore.
Usage: raw_cr.py suspend PID   (lock + checkpoint: GPU memory moves to host memory)
       raw_cr.py resume PID    (restore + unlock)
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


action, pid = sys.argv[1], int(sys.argv[2])
assert cuda.cuInit(0) == 0
if action == "suspend":
    lock = Args(timeout_ms=10000)
    print(f"lock {call('cuCheckpointProcessLock', pid, lock):.3f} checkpoint {call('cuCheckpointProcessCheckpoint', pid):.3f}")
elif action == "resume":
    print(f"restore {call('cuCheckpointProcessRestore', pid):.3f} unlock {call('cuCheckpointProcessUnlock', pid):.3f}")
else:
    sys.exit("usage: raw_cr.py suspend|resume PID")
