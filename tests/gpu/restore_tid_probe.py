"""Which processes does cuCheckpointProcessGetRestoreThreadId answer for? (gstore locks the
processes of a tree it answers for.) Starts a process that only loads libcuda, a PyTorch process
with a context and a child forked from it, and prints what the driver says of each.
Usage: python3 tests/gpu/restore_tid_probe.py"""
import ctypes, os, subprocess, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
def tid(pid):
    t = ctypes.c_int(0)
    rc = cuda.cuCheckpointProcessGetRestoreThreadId(ctypes.c_int(pid), ctypes.byref(t))
    s = ctypes.c_int(-1)
    rs = cuda.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(s))
    return f"tid rc={rc} tid={t.value} | state rc={rs} state={s.value}"
code_noinit = "import ctypes,time; ctypes.CDLL('libcuda.so.1'); open('/tmp/p1','w').write('x'); time.sleep(30)"
code_ctx = "import torch,os,time; x=torch.ones(10,device='cuda'); open('/tmp/p2','w').write('x')\npid=os.fork()\nif pid==0:\n  time.sleep(30)\nelse:\n  open('/tmp/p2child','w').write(str(pid)); time.sleep(30)"
for f in ["/tmp/p1","/tmp/p2","/tmp/p2child"]:
    try: os.remove(f)
    except FileNotFoundError: pass
a = subprocess.Popen([sys.executable, "-c", code_noinit])
b = subprocess.Popen([sys.executable, "-c", code_ctx])
while not (os.path.exists("/tmp/p1") and os.path.exists("/tmp/p2child")): time.sleep(0.1)
time.sleep(0.5)
child = int(open("/tmp/p2child").read())
print("libcuda loaded, no cuInit:", tid(a.pid))
print("torch with a context:     ", tid(b.pid))
print("forked child of it:       ", tid(child))
print("this controller:          ", tid(os.getpid()))
print("pid 1:                    ", tid(1))
a.kill(); b.kill(); os.kill(child, 9)
