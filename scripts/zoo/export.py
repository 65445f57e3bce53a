#!/usr/bin/python3
"""Exports torchvision's architectures to ONNX: the model zoo.

The zoo is how edgeserve is checked against the models users bring, not only
the five it was built around; a few recurrent models of speech sizes (torch's
LSTM, GRU and RNN, kind rnn) sit beside torchvision's. Every model gets
random weights (torchvision's own initialisation, or torch's for the
recurrent ones, seeded by the model's name; nothing is ever downloaded) in
two variants (the recurrent models, without normalisation, only plain):

  plain     torchvision's initialisation as it is: BatchNorm with mean 0,
            variance 1, scale 1, shift 0, so normalisation is the identity and
            a wrong BatchNorm fold would go unseen;
  randnorm  the same weights with random affine parameters in every
            BatchNorm, LayerNorm and GroupNorm, and BatchNorm statistics
            measured on a random batch then perturbed (as a trained network
            has them), so normalisation changes every value; exported with the
            BatchNormalization nodes kept (torch.onnx's default folds them
            into the convolutions, as in the plain variant): the engine's own
            folding is what is checked. Models without normalisation layers
            (alexnet, vgg11, squeezenet) have only the plain variant.

Two things torchvision's initialisation leaves silent get random values in
both variants, or part of the network would not reach the output and an
engine error there would go unseen: weights initialised to zero (ViT's
classification head: every output would be 0) and ConvNeXt's layer scale
(1e-6: each block an identity to six digits).

Each export has a dynamic batch axis, and dynamic height and width (and
frames for video) where the traced graph allows them: the model is traced at
the first shape and the trace is run at the second; when it disagrees with
the eager model there (shape arithmetic baked into the trace), the axes fall
back to batch only, then to none. Alongside each .onnx the script writes the
inputs (seeded, standard normal) and PyTorch's outputs for both shapes, so
the comparison can tell an unfaithful export from an engine error.

Everything goes to OUT (default .cache/zoo): NAME.onnx, NAME.randnorm.onnx,
data/NAME/input.{1,2,bench}.npy, data/NAME/VARIANT/torch.{1,2}.npy and
manifest.json. A model already exported with the same key (name, variant,
torch version, opset, this script's format version) is skipped.

  export.py [--out DIR] [--all] [--models a,b,...] [--variants plain,randnorm]
            [--opset N] [--force] [--list]
"""
import argparse
import json
import os
import sys
import time
import traceback
import warnings
import zlib

# One thread (ES_ZOO_THREADS to change): the eager runs are a small part of
# the time, and on a busy machine more threads than free cores only spin.
# OpenBLAS reads its variable when it loads, so before torch is imported.
THREADS = int(os.environ.get("ES_ZOO_THREADS", "1"))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))

import numpy as np  # noqa: E402 (after the thread settings)
import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision import models as tvm  # noqa: E402

FORMAT = 3  # bump when shapes, inputs or export options change

# name: kind, tier, options. kind: cls (N,3,H,W -> N,K), seg (N,3,H,W ->
# N,K,H,W), video (N,3,T,H,W -> N,K), rnn (N,T,F -> N,T,K: a torch LSTM,
# GRU or RNN stack, then a per-frame linear layer; class Recurrent). tier
# core: the set the test runs by default; extra: exported with --all. opset
# 17 for the transformers (native LayerNormalization); size: H=W of the usual input (video: T, H=W);
# fixed_hw: H and W cannot be dynamic (AdaptiveAvgPool to a size above 1,
# whose ONNX export needs the input size; ViT's position embeddings), so the
# export does not spend a trace and a failed export finding it out.
MODELS = {
    "resnet18": ("cls", "core", {}),
    "resnet50": ("cls", "core", {}),
    "mobilenet_v2": ("cls", "core", {}),
    "mobilenet_v3_small": ("cls", "core", {}),
    "mobilenet_v3_large": ("cls", "core", {}),
    "efficientnet_b0": ("cls", "core", {}),
    "densenet121": ("cls", "core", {}),
    "regnet_y_400mf": ("cls", "core", {}),
    "squeezenet1_1": ("cls", "core", {}),
    "googlenet": ("cls", "core", {"kw": {"aux_logits": False, "init_weights": True}}),
    "mnasnet1_0": ("cls", "core", {}),
    "shufflenet_v2_x1_0": ("cls", "core", {}),
    "vit_b_16": ("cls", "core", {"opset": 17, "fixed_hw": True}),
    "swin_t": ("cls", "core", {"opset": 17}),
    "convnext_tiny": ("cls", "core", {}),
    "alexnet": ("cls", "core", {"fixed_hw": True}),
    "vgg11": ("cls", "core", {"fixed_hw": True}),
    "inception_v3": ("cls", "core", {"size": 299, "kw": {"aux_logits": False, "init_weights": True}}),
    "deeplabv3_mobilenet_v3_large": ("seg", "core", {}),
    "lraspp_mobilenet_v3_large": ("seg", "core", {}),
    "fcn_resnet50": ("seg", "core", {}),
    "r3d_18": ("video", "core", {}),
    # Recurrent models of edge speech and sensor sizes (batch 1, 50-200
    # frames, 40-256 features, hidden 64-512): opts cell, features, hidden,
    # layers, bidirectional, steps (frames at the first shape, default 100).
    "lstm_speech": ("rnn", "core", {"cell": "LSTM", "features": 40, "hidden": 128, "layers": 2,
                                    "bidirectional": True, "opset": 14}),
    "lstm_large": ("rnn", "core", {"cell": "LSTM", "features": 256, "hidden": 512, "layers": 1,
                                   "steps": 200, "opset": 14}),
    "gru_speech": ("rnn", "core", {"cell": "GRU", "features": 40, "hidden": 256, "layers": 2}),
    "gru_small_bi": ("rnn", "core", {"cell": "GRU", "features": 40, "hidden": 64, "layers": 1,
                                     "bidirectional": True, "steps": 50, "opset": 14}),
    "rnn_tanh": ("rnn", "core", {"cell": "RNN", "features": 64, "hidden": 256, "layers": 2,
                                 "opset": 14}),
    # The rest of torchvision 0.14's classification, segmentation and video
    # models up to about 70M parameters (the larger ones add gigabytes and
    # minutes and nothing an architecture above does not already cover).
    "resnet34": ("cls", "extra", {}),
    "resnet101": ("cls", "extra", {}),
    "resnext50_32x4d": ("cls", "extra", {}),
    "wide_resnet50_2": ("cls", "extra", {}),
    "squeezenet1_0": ("cls", "extra", {}),
    "vgg11_bn": ("cls", "extra", {"fixed_hw": True}),
    "densenet169": ("cls", "extra", {}),
    "mnasnet0_5": ("cls", "extra", {}),
    "mnasnet1_3": ("cls", "extra", {}),
    "shufflenet_v2_x0_5": ("cls", "extra", {}),
    "shufflenet_v2_x2_0": ("cls", "extra", {}),
    "efficientnet_b3": ("cls", "extra", {}),
    "efficientnet_v2_s": ("cls", "extra", {}),
    "regnet_x_400mf": ("cls", "extra", {}),
    "regnet_x_1_6gf": ("cls", "extra", {}),
    "regnet_y_1_6gf": ("cls", "extra", {}),
    "convnext_small": ("cls", "extra", {}),
    "vit_b_32": ("cls", "extra", {"opset": 17, "fixed_hw": True}),
    "swin_v2_t": ("cls", "extra", {"opset": 17}),
    "maxvit_t": ("cls", "extra", {"opset": 17}),
    "deeplabv3_resnet50": ("seg", "extra", {}),
    "mc3_18": ("video", "extra", {}),
    "r2plus1d_18": ("video", "extra", {}),
    "s3d": ("video", "extra", {"size": (16, 224)}),
    "mvit_v2_s": ("video", "extra", {"opset": 17, "size": (16, 224)}),
}
VARIANTS = ("plain", "randnorm")
NORMS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)


def seed_of(*parts):
    return zlib.crc32("/".join(parts).encode())


def shapes(name, kind, opts):
    """(first, second with dynamic H/W, second batch-only, bench) shapes."""
    if kind == "rnn":  # H/W stands for the frames here
        t, f = opts.get("steps", 100), opts["features"]
        return [1, t, f], [4, t * 7 // 10, f], [2, t, f], [1, t, f]
    if kind == "video":
        t, s = opts.get("size", (16, 112))
        one = [1, 3, t, s, s]
        return one, [4, 3, t // 2, s * 6 // 7, s * 5 // 7], [2, 3, t, s, s], one
    s = opts.get("size", 224)
    if kind == "seg":
        return [1, 3, 320, 320], [4, 3, 200, 168], [2, 3, 320, 320], [1, 3, 520, 520]
    one = [1, 3, s, s]
    # An H x W that is not a multiple of 32 (odd sizes down the strided layers).
    return one, [4, 3, s * 17 // 28, s * 15 // 28], [2, 3, s, s], one


class Recurrent(torch.nn.Module):
    """features [N, T, F] -> a recurrent stack (batch first) -> per-frame
    scores [N, T, 32]. The states the stack returns are left out: one output,
    as the other kinds."""

    def __init__(self, opts):
        super().__init__()
        cell = getattr(torch.nn, opts["cell"])
        bi = opts.get("bidirectional", False)
        self.rnn = cell(opts["features"], opts["hidden"], num_layers=opts.get("layers", 1),
                        bidirectional=bi, batch_first=True)
        self.head = torch.nn.Linear(opts["hidden"] * (2 if bi else 1), 32)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y)


def build(name, opts):
    if MODELS[name][0] == "rnn":
        torch.manual_seed(seed_of(name))
        return Recurrent(opts).eval()
    kw = dict(opts.get("kw", {}))
    kw["weights"] = None
    if MODELS[name][0] == "seg":
        kw["weights_backbone"] = None
    torch.manual_seed(seed_of(name))
    return tvm.get_model(name, **kw).eval()


def randomise_norms(model, name, calib):
    """Random affine parameters for every BatchNorm, LayerNorm and GroupNorm,
    and BatchNorm statistics as training leaves them: measured on a random
    calibration batch, then perturbed. Statistics drawn at random instead
    (tried first) let the shifts swamp what the weights carry of the input:
    eight of the core models then answered every input alike to 1e-7, which
    tests no convolution before the last BatchNorm. Returns how many layers
    changed."""
    g = torch.Generator().manual_seed(seed_of(name, "randnorm"))
    u = lambda shape, lo, hi: lo + (hi - lo) * torch.rand(shape, generator=g)
    bns = []
    n = 0
    with torch.no_grad():
        for mod in model.modules():
            if not isinstance(mod, NORMS):
                continue
            if getattr(mod, "weight", None) is not None:
                mod.weight.copy_(u(mod.weight.shape, 0.5, 1.5))
            if getattr(mod, "bias", None) is not None:
                mod.bias.copy_(u(mod.bias.shape, -0.3, 0.3))
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.track_running_stats:
                bns.append(mod)
            n += 1
        if bns:
            # Only the BatchNorms in training mode (dropout and stochastic
            # depth stay off); momentum None: the running statistics become
            # the calibration batch's.
            for mod in bns:
                mod.reset_running_stats()
                mod.momentum = None
                mod.train()
            model(calib)
            for mod in bns:
                mod.eval()
                mod.momentum = 0.1
                sd = mod.running_var.sqrt()
                mod.running_mean.add_(u(sd.shape, -0.3, 0.3) * sd)
                mod.running_var.mul_(u(sd.shape, 0.6, 1.6))
    return n


def liven(model, name):
    """Random values for what torchvision's initialisation silences (see the
    design note). Returns the names changed."""
    g = torch.Generator().manual_seed(seed_of(name, "liven"))
    changed = []
    with torch.no_grad():
        for mname, mod in model.named_modules():
            w = getattr(mod, "weight", None)
            if isinstance(mod, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) and \
                    w is not None and not torch.any(w):
                fan_in = w[0].numel()
                w.copy_(torch.randn(w.shape, generator=g) / fan_in ** 0.5)
                changed.append(f"{mname}.weight")
        for pname, p in model.named_parameters():
            if pname.endswith("layer_scale"):
                p.copy_(0.2 + 0.8 * torch.rand(p.shape, generator=g))
                changed.append(pname)
    return changed


class SegOut(torch.nn.Module):
    """Segmentation models return a dict; the export takes its "out"."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


def axes(kind, hw):
    if kind == "rnn":
        i = {0: "batch", 1: "time"} if hw else {0: "batch"}
        return {"input": i, "output": dict(i)}
    if kind == "video":
        i = {0: "batch", 2: "frames", 3: "height", 4: "width"} if hw else {0: "batch"}
        return {"input": i, "output": {0: "batch"}}
    i = {0: "batch", 2: "height", 3: "width"} if hw else {0: "batch"}
    return {"input": i, "output": dict(i) if kind == "seg" else {0: "batch"}}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    rng = float(b.max() - b.min()) if b.size else 0.0
    return float(np.abs(a - b).max()) / max(1.0, rng) if b.size else 0.0


def trace_agrees(model, x1, x2):
    """None when the model traced at x1 runs x2 as the eager model does, else
    why not (shape arithmetic baked into the trace)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, x1, check_trace=False)
    try:
        e = rel_err(traced(x2).numpy(), model(x2).numpy())
    except Exception as ex:  # the trace may refuse the shape outright
        return str(ex).strip().splitlines()[0][:120]
    return None if e <= 1e-4 else f"the trace differs by {e:.2e}"


def onnx_export(model, x1, path, opset, dyn, keep_norm):
    # With gradients on: under no_grad, nn.MultiheadAttention in eval mode
    # takes its fused fast path (aten::_native_multi_head_attention), which
    # has no ONNX export; the composite path exports as MatMul and Softmax.
    with warnings.catch_warnings(), torch.enable_grad():
        warnings.simplefilter("ignore")
        # PRESERVE exports the eval-mode model as it is; EVAL (the default)
        # also folds BatchNormalization into the preceding Conv.
        mode = torch.onnx.TrainingMode.PRESERVE if keep_norm else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(model, x1, path, opset_version=opset, input_names=["input"],
                          output_names=["output"], dynamic_axes=dyn, do_constant_folding=True,
                          training=mode)


def export_axes(model, kind, x1, cands, path, opset, fixed, keep_norm):
    """Exports with the first candidate second shape (label, input) that the
    trace runs faithfully and torch.onnx accepts as dynamic, else with static
    axes. Returns (label or None, second input or None, notes). fixed: the
    label an earlier variant chose."""
    notes = []
    for label, x2 in cands:
        if fixed is not None and label != fixed:
            continue
        why = trace_agrees(model, x1, x2) if fixed is None else None
        if why is None:
            try:
                onnx_export(model, x1, path, opset, axes(kind, label == "hw"), keep_norm)
                return label, x2, notes
            except Exception as ex:
                why = f"{type(ex).__name__}: {str(ex).strip().splitlines()[0][:120]}"
        notes.append(f"{label}: {why}")
    onnx_export(model, x1, path, opset, None, keep_norm)
    return None, None, notes


# Below this, another input moves the output by less than a comparison's
# tolerance would notice (a random network whose weights shrink the signal
# layer after layer until biases are all that is left).
INSENSITIVE = 1e-4


def sensitivity(y, y_other):
    """How much the output moves for another input: max |y - y'| over the
    output's scale (its range or largest magnitude)."""
    y, y_other = np.asarray(y, np.float64), np.asarray(y_other, np.float64)
    scale = max(float(y.max() - y.min()), float(np.abs(y).max()))
    return float(np.abs(y - y_other).max()) / scale if scale > 0 else 0.0


def save(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, np.ascontiguousarray(arr, dtype=np.float32))


def export_one(name, variants, out, opset_override, old, force):
    kind, tier, opts = MODELS[name]
    opset = opset_override or opts.get("opset", 13)
    one, two_hw, two_b, bench = shapes(name, kind, opts)
    data = os.path.join(out, "data", name)
    keys = {v: f"{name}|{v}|torch {torch.__version__}|torchvision {torchvision.__version__}|"
               f"opset {opset}|format {FORMAT}"
            for v in variants}
    todo = [v for v in variants
            if force or not (old.get((name, v), {}).get("key") == keys[v]
                             and ("skip" in old[(name, v)]
                                  or os.path.exists(os.path.join(out, old[(name, v)].get("file", "-")))))]
    entries = [old[(name, v)] for v in variants if v not in todo]
    for e in entries:
        print(f"{name:32s} {e['variant']:9s} cached")
    if not todo:
        return entries
    rng = np.random.default_rng(seed_of(name, "input"))
    x1 = torch.from_numpy(rng.standard_normal(one, dtype=np.float32))
    x2hw = torch.from_numpy(rng.standard_normal(two_hw, dtype=np.float32))
    x2b = torch.from_numpy(rng.standard_normal(two_b, dtype=np.float32))
    xb = torch.from_numpy(rng.standard_normal(bench, dtype=np.float32)) if bench != one else None
    xs = torch.from_numpy(rng.standard_normal(one, dtype=np.float32))
    # Two samples: BatchNorm in training refuses a 1x1 map of one sample.
    calib = torch.from_numpy(rng.standard_normal([2] + one[1:], dtype=np.float32))
    # The axes are the model's, not the variant's: a later variant takes the
    # first one's.
    chosen = None
    for e in entries:
        if "file" in e:
            dyn = e["dynamic"]
            chosen = "hw" if "height" in dyn or "time" in dyn else "batch" if dyn else ""
    for v in todo:
        t0, c0 = time.monotonic(), time.process_time()
        entry = {"name": name, "variant": v, "kind": kind, "tier": tier, "opset": opset,
                 "key": keys[v]}
        tmp = None
        try:
            model = build(name, opts)
            livened = liven(model, name)
            if v == "randnorm" and randomise_norms(model, name, calib) == 0:
                print(f"{name:32s} {v:9s} no normalisation layers: plain only")
                entry["skip"] = "no normalisation layers"
                entries.append(entry)
                continue
            if kind == "seg":
                model = SegOut(model).eval()
            file = f"{name}.onnx" if v == "plain" else f"{name}.{v}.onnx"
            tmp = os.path.join(out, file + ".tmp")
            cands = [("hw", x2hw), ("batch", x2b)][1 if opts.get("fixed_hw") else 0:]
            with torch.no_grad():
                label, x2, notes = export_axes(model, kind, x1, cands, tmp, opset, chosen,
                                               v == "randnorm")
                chosen = label or ""
                why = "; ".join(notes)
                # torch.onnx.export puts back the training flag it found on
                # every module: the outputs below must be inference ones.
                model.eval()
                y1 = model(x1).numpy()
                sens = sensitivity(y1, model(xs).numpy())
                y2 = model(x2).numpy() if label else None
            os.replace(tmp, os.path.join(out, file))
            save(os.path.join(data, "input.1.npy"), x1)
            save(os.path.join(data, v, "torch.1.npy"), y1)
            entry.update({"file": file, "input": "input", "output": "output",
                          "shape": one, "input_file": f"data/{name}/input.1.npy",
                          "torch_file": f"data/{name}/{v}/torch.1.npy",
                          "dynamic": list(axes(kind, label == "hw")["input"].values()) if label else [],
                          "bench_shape": bench,
                          "bench_file": f"data/{name}/input.1.npy"})
            if label:
                save(os.path.join(data, "input.2.npy"), x2)
                save(os.path.join(data, v, "torch.2.npy"), y2)
                entry.update({"shape2": list(x2.shape), "input2_file": f"data/{name}/input.2.npy",
                              "torch2_file": f"data/{name}/{v}/torch.2.npy"})
            else:
                entry["shape2_none"] = why
            if xb is not None:
                save(os.path.join(data, "input.bench.npy"), xb)
                entry["bench_file"] = f"data/{name}/input.bench.npy"
            entry["bytes"] = os.path.getsize(os.path.join(out, file))
            if livened:
                entry["livened"] = len(livened)
            entry["sensitivity"] = float(f"{sens:.3e}")
            entry["params"] = sum(p.numel() for p in model.parameters())
            entry["export_s"] = round(time.monotonic() - t0, 2)
            entry["export_cpu_s"] = round(time.process_time() - c0, 2)
            note = f"second shape {entry['shape2']}" if label else "static axes"
            if why:
                note += f" ({why})"
            if sens < INSENSITIVE:
                note += (f"; the output barely depends on the input (sensitivity {sens:.1e}), "
                         "so a comparison sees little before the last layers")
            print(f"{name:32s} {v:9s} {entry['export_s']:6.1f} s ({entry['export_cpu_s']:5.1f} s CPU)  "
                  f"opset {opset}  "
                  f"{entry['bytes'] / 1e6:7.1f} MB  {note}", flush=True)
        except Exception as ex:
            entry["error"] = f"{type(ex).__name__}: {str(ex).strip().splitlines()[0][:300]}"
            entry["export_s"] = round(time.monotonic() - t0, 2)
            if tmp and os.path.exists(tmp):
                os.remove(tmp)
            print(f"{name:32s} {v:9s} export failed: {entry['error']}", flush=True)
            if os.environ.get("ES_ZOO_TRACEBACK"):
                traceback.print_exc()
        entries.append(entry)
    return entries


def no_downloads():
    """Random weights only: any attempt to fetch pretrained weights fails."""
    def refuse(*a, **k):
        raise RuntimeError("the zoo never downloads weights")
    torch.hub.load_state_dict_from_url = refuse
    torch.hub.download_url_to_file = refuse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../.cache/zoo"))
    ap.add_argument("--all", action="store_true", help="the extra models too")
    ap.add_argument("--models", default="", help="comma-separated names (default: the core set)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--opset", type=int, default=0, help="override every model's opset")
    ap.add_argument("--force", action="store_true", help="export again even when cached")
    ap.add_argument("--list", action="store_true", help="print the models and exit")
    a = ap.parse_args()
    if a.list:
        for n, (kind, tier, opts) in MODELS.items():
            print(f"{n:32s} {kind:6s} {tier}")
        return 0
    names = [n for n in a.models.split(",") if n] or \
        [n for n, (_, tier, _) in MODELS.items() if a.all or tier == "core"]
    bad = [n for n in names if n not in MODELS]
    if bad:
        print(f"export: unknown model(s) {', '.join(bad)} (--list shows them)", file=sys.stderr)
        return 2
    variants = [v for v in a.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants):
        print(f"export: variants are {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    out = os.path.normpath(a.out)
    os.makedirs(out, exist_ok=True)
    mpath = os.path.join(out, "manifest.json")
    old = {}
    if os.path.exists(mpath):
        with open(mpath) as f:
            for e in json.load(f).get("models", []):
                old[(e["name"], e["variant"])] = e
    no_downloads()
    torch.set_num_threads(THREADS)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{len(names)} models into {out}", flush=True)
    t0 = time.monotonic()
    done = {}
    for n in names:
        for e in export_one(n, variants, out, a.opset, old, a.force):
            done[(e["name"], e["variant"])] = e
        # Written after every model, so an interrupted run keeps its work.
        merged = {**old, **done}
        with open(mpath + ".tmp", "w") as f:
            # One entry a line: readable, and grep finds a model's.
            f.write(f'{{"torch": "{torch.__version__}", "torchvision": "{torchvision.__version__}", '
                    f'"format": {FORMAT}, "models": [\n')
            f.write(",\n".join(json.dumps(merged[k]) for k in sorted(merged)))
            f.write("\n]}\n")
        os.replace(mpath + ".tmp", mpath)
    failed = [k for k, e in done.items() if "error" in e]
    print(f"export: {len(done)} exports ({len(failed)} failed) in {time.monotonic() - t0:.0f} s; "
          f"manifest {mpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
