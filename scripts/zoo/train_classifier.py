#!/usr/bin/python3
"""Trains a torchvision classifier here, from its random initialisation, and
exports it to ONNX: a classifier whose top-1 margins are a trained network's.

The zoo's classifiers have random weights, so their outputs for two
pictures differ by little and the best class of most inputs leads the
second by a hair: any rounding (int8, bf16) flips many of them. Agreement
with FP32 says something about a lower precision only on a network that
has learnt to tell its classes apart. Nothing can be downloaded, so the
network learns a task made here: which of K source pictures a picture was
cut from (scripts/zoo/augment.js makes picture n from source n mod K by a
random crop of 10-100% of its area, flips, quarter turns, brightness,
contrast and noise). Small crops of flat regions stay ambiguous, as real
inputs are.

  train_classifier.py MODEL TRAIN_DIR K OUT.onnx [--epochs E] [--val DIR]

TRAIN_DIR (and the optional validation DIR) hold augment.js's .npy batches
(float32 N x 3 x S x S, pictures in file order); the labels are picture
index mod K. Prints the loss per epoch and the accuracy on both sets.
Deterministic for a torch version (seeded, one thread per core).
"""
import argparse
import glob
import os
import sys

import numpy as np
import torch
from torchvision import models as tvm


def load(d):
    xs = [np.load(f) for f in sorted(glob.glob(os.path.join(d, "*.npy")))]
    if not xs:
        sys.exit(f"train_classifier: no .npy batches in {d}")
    return torch.from_numpy(np.concatenate(xs))


def accuracy(model, x, y):
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, len(x), 64):
            right += (model(x[i:i + 64]).argmax(1) == y[i:i + 64]).sum().item()
    return right / len(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("train")
    ap.add_argument("k", type=int)
    ap.add_argument("out")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--val")
    a = ap.parse_args()
    torch.manual_seed(1)
    torch.set_num_threads(os.cpu_count() or 1)
    x = load(a.train)
    y = torch.arange(len(x)) % a.k
    model = getattr(tvm, a.model)(num_classes=a.k)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    steps = a.epochs * ((len(x) + 31) // 32)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    for e in range(a.epochs):
        model.train()
        order = torch.randperm(len(x))
        total = 0.0
        for i in range(0, len(x), 32):
            idx = order[i:i + 32]
            if len(idx) < 2:
                continue  # BatchNorm needs two
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        print(f"{a.model} epoch {e + 1}/{a.epochs}: loss {total / len(x):.3f}", flush=True)
    line = f"{a.model}: train accuracy {accuracy(model, x, y):.3f}"
    if a.val:
        xv = load(a.val)
        line += f", held-out accuracy {accuracy(model, xv, torch.arange(len(xv)) % a.k):.3f}"
    print(line)
    model.eval()
    tmp = a.out + ".tmp"
    torch.onnx.export(model, x[:1], tmp, opset_version=13, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": {0: "n"}, "output": {0: "n"}})
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
