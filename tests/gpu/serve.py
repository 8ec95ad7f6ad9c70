"""A model-serving-like GPU process: a GPT-2-medium-sized decoder (24 layers, d=1024,
16 heads, vocab 50257; ~355 M parameters, fp16) with random weights from a fixed seed,
generating tokens in a loop. Two processes started with the same seed hold identical weights,
as two replicas of one model do. Usage: serve.py OUTDIR [SEED]
Writes OUTDIR/ready when loaded and OUTDIR/counter (tokens generated) as it runs."""
import os
import sys
import time

import torch
import torch.nn as nn

out = sys.argv[1]
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 7
torch.manual_seed(seed)
D, L, H, V, CTX = 1024, 24, 16, 50257, 1024


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, H, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], device=x.device, dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln = nn.LayerNorm(D)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.ln(x) @ self.tok.weight.T


model = GPT().half().cuda().eval()


def put(name, text):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(out, name))


params = sum(p.numel() for p in model.parameters())
put("ready", str(params))
gen = torch.Generator(device="cuda").manual_seed(seed)
tokens = 0
with torch.no_grad():
    while True:
        idx = torch.randint(0, V, (1, 16), device="cuda", generator=gen)
        for _ in range(16):
            nxt = model(idx)[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, nxt], 1)
        torch.cuda.synchronize()
        tokens += 16
        put("counter", str(tokens))
        time.sleep(0.01)
