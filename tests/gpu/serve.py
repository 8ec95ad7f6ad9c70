"""A model-serving-like GPU process: a decoder with random weights from a fixed seed, made on
the GPU, generating tokens in a loop and answering requests. Two processes started with the
same seed and size hold identical weights, as two replicas of one model do.
Usage: serve.py OUTDIR [SEED] [SIZE]

SIZE (default medium):
  medium  GPT-2-medium-shaped: 24 layers, d=1024, 16 heads, vocab 50257; ~355 M params, fp16
  large   GPT-2-large-shaped: 36 layers, d=1280, 20 heads, vocab 50257; ~774 M params, fp16
  qwen8b  Qwen3-8B-shaped: 36 layers, hidden 4096, MLP 12288 (SwiGLU), 32 query / 8 KV heads
          of 128, q/k RMSNorm, untied vocab 151936; ~8.2 B params, bf16 (~16.4 GB); no RoPE
          (a plain module of those shapes, not a faithful Qwen)

Writes OUTDIR/expect (the answer to a request: a deterministic greedy generation from a fixed
prompt, its tokens and the bits of its last logits' sum), then OUTDIR/ready (the parameter
count) when loaded, and OUTDIR/counter (tokens generated) as it runs. When OUTDIR/ask exists
(it is then removed) it computes the answer again into OUTDIR/answer (via rename): a request
file made before a restore starts is answered as soon as the restored process runs, and the
answer must equal OUTDIR/expect. It keeps no file open, so CRIU sees no file change between
dump and restore.

With SERVE_SAVE_AS=TAG it stores its weights in the store ($GSTORE_STORE) as image TAG and
exits: a model image. With SERVE_WEIGHTS_FROM=TAG it builds the model empty, loads its weights
from image TAG of that store (Store.load_into) and registers them (gstore.serving.weights_from):
a checkpoint leaves them out and a restore refills them from the store.

With SERVE_RAW_DIR=DIR the saving run also writes the weights there as ~1 GiB safetensors
shards (as a model folder holds them), and a serving run takes part in the raw tools'
cooperative path: on SIGUSR1 it frees its weights' GPU memory (storages resized to nothing, the
allocator's cache emptied), writes OUTDIR/released and waits (by stat alone) for OUTDIR/reload;
then it reloads them from DIR with InstantTensor (buffered) into the same parameters and goes on.

Each answer's wall-clock start and end (seconds since the epoch), then when the last three
generation steps before it ended, go to OUTDIR/answer.times."""
import collections
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

out = sys.argv[1]
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 7
size = sys.argv[3] if len(sys.argv) > 3 else "medium"
torch.manual_seed(seed)
GPT2 = {"medium": (1024, 24, 16), "large": (1280, 36, 20)}
CTX = 1024


class Block(nn.Module):
    def __init__(self, D, H, fk):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D, **fk), nn.LayerNorm(D, **fk)
        self.attn = nn.MultiheadAttention(D, H, batch_first=True, **fk)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D, **fk), nn.GELU(), nn.Linear(4 * D, D, **fk))

    def forward(self, x):
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], device=x.device, dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-2-shaped, tied embeddings."""

    def __init__(self, D, L, H, V, fk):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D, **fk), nn.Embedding(CTX, D, **fk)
        self.blocks = nn.ModuleList(Block(D, H, fk) for _ in range(L))
        self.ln = nn.LayerNorm(D, **fk)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.ln(x) @ self.tok.weight.T


class QBlock(nn.Module):
    def __init__(self, D, F_, HQ, HKV, HD, fk):
        super().__init__()
        self.HQ, self.HKV, self.HD = HQ, HKV, HD
        self.n1, self.n2 = nn.RMSNorm(D, **fk), nn.RMSNorm(D, **fk)
        self.q = nn.Linear(D, HQ * HD, bias=False, **fk)
        self.k = nn.Linear(D, HKV * HD, bias=False, **fk)
        self.v = nn.Linear(D, HKV * HD, bias=False, **fk)
        self.o = nn.Linear(HQ * HD, D, bias=False, **fk)
        self.qn, self.kn = nn.RMSNorm(HD, **fk), nn.RMSNorm(HD, **fk)
        self.gate = nn.Linear(D, F_, bias=False, **fk)
        self.up = nn.Linear(D, F_, bias=False, **fk)
        self.down = nn.Linear(F_, D, bias=False, **fk)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.n1(x)
        q = self.qn(self.q(h).view(B, T, self.HQ, self.HD)).transpose(1, 2)
        k = self.kn(self.k(h).view(B, T, self.HKV, self.HD)).transpose(1, 2)
        v = self.v(h).view(B, T, self.HKV, self.HD).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, self.HQ * self.HD))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Qwen(nn.Module):
    """Qwen3-8B-shaped, untied embeddings."""

    def __init__(self, D, L, F_, HQ, HKV, HD, V, fk):
        super().__init__()
        self.tok = nn.Embedding(V, D, **fk)
        self.blocks = nn.ModuleList(QBlock(D, F_, HQ, HKV, HD, fk) for _ in range(L))
        self.norm = nn.RMSNorm(D, **fk)
        self.head = nn.Linear(D, V, bias=False, **fk)

    def forward(self, idx):
        x = self.tok(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


weights_from = os.environ.get("SERVE_WEIGHTS_FROM")
# Loaded weights need no random init: the model is made empty on the GPU.
where = "meta" if weights_from else "cuda"
if size in GPT2:
    V = 50257
    model = GPT(*GPT2[size], V, dict(device=where, dtype=torch.float16))
elif size == "qwen8b":
    V = 151936
    model = Qwen(4096, 36, 12288, 32, 8, 128, V, dict(device=where, dtype=torch.bfloat16))
else:
    sys.exit(f"unknown size {size!r}: medium, large or qwen8b")
model.eval()
raw_dir = os.environ.get("SERVE_RAW_DIR")
if os.environ.get("SERVE_SAVE_AS"):
    import gstore

    gstore.Store(os.environ["GSTORE_STORE"]).save(model.state_dict(), os.environ["SERVE_SAVE_AS"], progress=False)
    if raw_dir:
        import safetensors.torch

        os.makedirs(raw_dir, exist_ok=True)
        shard, size, k = {}, 0, 0
        items = list(model.state_dict().items())
        for i, (name, t) in enumerate(items):
            shard[name], size = t.contiguous(), size + t.nbytes
            if size >= 1 << 30 or i == len(items) - 1:
                safetensors.torch.save_file(shard, os.path.join(raw_dir, f"model-{k:05d}.safetensors"))
                shard, size, k = {}, 0, k + 1
    sys.exit(0)
if weights_from:
    import gstore
    import gstore.serving

    model = model.to_empty(device="cuda")
    t = time.perf_counter()
    gstore.Store(os.environ["GSTORE_STORE"]).load_into(model, weights_from, progress=False)
    print(f"weights loaded from {weights_from} in {time.perf_counter() - t:.2f} s", flush=True)
    gstore.serving.weights_from(model, weights_from, store=os.environ["GSTORE_STORE"])


def put(name, text):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(out, name))


asked = os.path.join(out, "ask")


def answer():
    """Greedy generation of 16 tokens from a fixed prompt: no random numbers, so the same
    weights give the same answer, to the bit, every time on the same GPU."""
    idx = (torch.arange(16, device="cuda") * 7919 % V).unsqueeze(0)
    for _ in range(16):
        logits = model(idx)[:, -1].float()
        idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], 1)
    bits = struct.pack(">d", logits.double().sum().item()).hex()
    return " ".join(str(t) for t in idx[0, 16:].tolist()) + f" | {bits}"


def serve_request():
    if os.path.exists(asked):
        os.remove(asked)
        began = time.time()
        text = answer()
        put("answer.times", " ".join(f"{t:.6f}" for t in (began, time.time(), *steps)))
        put("answer", text)


def raw_release(signum, frame):
    """The raw tools' cooperative path: free the weights, wait for OUTDIR/reload, reload them
    from SERVE_RAW_DIR with InstantTensor (see the module's doc)."""
    from instanttensor import BackendPolicy, safe_open

    torch.cuda.synchronize()
    state = model.state_dict()
    storages = {}
    for t in state.values():
        storages.setdefault(t.untyped_storage().data_ptr(), (t.untyped_storage(), t.untyped_storage().nbytes()))
    for storage, _ in storages.values():
        storage.resize_(0)
    torch.cuda.empty_cache()
    put("released", "1")
    reload = os.path.join(out, "reload")
    while not os.path.exists(reload):
        time.sleep(0.001)
    os.remove(reload)
    began = time.time()
    for storage, nbytes in storages.values():
        storage.resize_(nbytes)
    files = sorted(os.path.join(raw_dir, f) for f in os.listdir(raw_dir) if f.endswith(".safetensors"))
    with safe_open(files, framework="pt", device=torch.cuda.current_device(), backend=BackendPolicy.BUFFERED) as f:
        for name, t in f.tensors():
            state[name].copy_(t)
    torch.cuda.synchronize()
    put("reloaded", f"{began:.6f} {time.time():.6f}")


if raw_dir:
    import signal

    signal.signal(signal.SIGUSR1, raw_release)


with torch.no_grad():
    put("expect", answer())
    params = sum(p.numel() for p in model.parameters())
    put("ready", str(params))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tokens = 0
    steps = collections.deque(maxlen=3)  # when the last generation steps ended
    while True:
        idx = torch.randint(0, V, (1, 16), device="cuda", generator=gen)
        for _ in range(16):
            nxt = model(idx)[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, nxt], 1)
            torch.cuda.synchronize()
            steps.append(time.time())
            serve_request()
        tokens += 16
        put("counter", str(tokens))
        time.sleep(0.01)
