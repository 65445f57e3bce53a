#!/usr/bin/python3
"""Exports a tiny decoder-only transformer with a KV cache: the growing state
the sequence tests serve (tests/e2e/test_decoder_sequence.sh).

A GPT-style stack (token and position embeddings, pre-LayerNorm blocks of
causal self-attention and a GELU MLP, a linear head) with random weights,
seeded. One step takes the new token, ids [1, 1] (int64), and each layer's
past keys and values, past_k{i} and past_v{i} [1, heads, T, head_dim] (T
free, 0 at the start), and returns the logits [1, 1, vocab] and the
present_k{i}, present_v{i} [1, heads, T + 1, head_dim]: served as a
sequence, the server feeds each present back as the next past, and the
state grows by 2 x layers x d_model floats a step.

Beside OUT/decoder_tiny.onnx the script writes data/decoder_tiny/ids.npy
(the STEPS tokens fed, int64) and logits.npy ([STEPS, vocab]: PyTorch's
logits at each step, run with its own cache), so that a served sequence
can be checked step by step. Skipped when the files exist and were made by
the same torch version and this script's format (OUT/decoder_tiny.json).

  export_decoder.py [--out DIR] [--force]
"""
import argparse
import json
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

FORMAT = 1
VOCAB, D, HEADS, LAYERS, MAX_T, STEPS = 96, 64, 4, 3, 256, 40
HEAD = D // HEADS


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, past_k, past_v):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        heads = lambda y: y.view(b, t, HEADS, HEAD).transpose(1, 2)  # noqa: E731
        q = heads(q)
        k = torch.cat([past_k, heads(k)], dim=2)
        v = torch.cat([past_v, heads(v)], dim=2)
        # Causal: a new token sees the past and the new tokens up to itself.
        past = past_k.shape[2]
        total = past + t
        seen = torch.arange(total).unsqueeze(0) <= (past + torch.arange(t)).unsqueeze(1)
        att = (q @ k.transpose(-1, -2)) / HEAD ** 0.5
        att = att.masked_fill(~seen, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(self.ln2(x)), k, v


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(MAX_T, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids, *past):
        start = past[0].shape[2]
        x = self.tok(ids) + self.pos(torch.arange(start, start + ids.shape[1]).unsqueeze(0))
        present = []
        for i, blk in enumerate(self.blocks):
            x, k, v = blk(x, past[2 * i], past[2 * i + 1])
            present += [k, v]
        return (self.head(self.ln(x)), *present)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("ES_ZOO_DIR", ".cache/zoo"))
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    key = {"format": FORMAT, "torch": torch.__version__}
    model_path = os.path.join(a.out, "decoder_tiny.onnx")
    key_path = os.path.join(a.out, "decoder_tiny.json")
    data = os.path.join(a.out, "data", "decoder_tiny")
    if not a.force and os.path.exists(model_path) and os.path.exists(key_path):
        with open(key_path) as f:
            if json.load(f) == key:
                print("decoder_tiny: exported already")
                return
    os.makedirs(data, exist_ok=True)
    torch.manual_seed(20261203)
    m = Decoder().eval()
    names_in = ["ids"] + [f"past_{kv}{i}" for i in range(LAYERS) for kv in "kv"]
    names_out = ["logits"] + [f"present_{kv}{i}" for i in range(LAYERS) for kv in "kv"]
    past = [torch.zeros(1, HEADS, 3, HEAD) for _ in range(2 * LAYERS)]
    axes = {n: {2: "past"} for n in names_in[1:]}
    axes.update({n: {2: "total"} for n in names_out[1:]})
    with torch.no_grad():
        torch.onnx.export(m, (torch.tensor([[1]]), *past), model_path, input_names=names_in,
                          output_names=names_out, dynamic_axes=axes, opset_version=17)
        # The reference: STEPS tokens fed one at a time through PyTorch's own
        # cache (the first from a fixed seed, then each the argmax of the last
        # logits: a greedy decode), with the logits at every step.
        ids, logits = [7], []
        cache = [torch.zeros(1, HEADS, 0, HEAD) for _ in range(2 * LAYERS)]
        for _ in range(STEPS):
            out = m(torch.tensor([[ids[-1]]]), *cache)
            logits.append(out[0][0, 0].numpy())
            cache = list(out[1:])
            ids.append(int(out[0][0, 0].argmax()))
    np.save(os.path.join(data, "ids.npy"), np.array(ids[:STEPS], dtype=np.int64))
    np.save(os.path.join(data, "logits.npy"), np.stack(logits).astype(np.float32))
    with open(key_path, "w") as f:
        json.dump(key, f)
    print(f"decoder_tiny: {model_path}, {STEPS} steps of reference logits; the state grows by "
          f"{2 * LAYERS * D * 4} bytes a step")


if __name__ == "__main__":
    main()
