#!/usr/bin/python3
"""Exports torchvision's detectors to ONNX, with their post-processing in the
graph: the models whose output sizes depend on the data.

The classification zoo (export.py) has fixed output shapes. A detector ends
in thresholds, per-class top-k, non-maximum suppression and, for the R-CNNs,
a second stage on the boxes the first one kept (RoiAlign, and a Loop for
Keypoint R-CNN's heatmaps and Mask R-CNN's mask pasting), so the number of
detections, and every shape after the first NonZero, is known only at run
time. These exports are what the engine is measured against for that.

Weights are random (torchvision's initialisation, seeded by a CRC-32 of the
model's name; nothing is ever downloaded), and random heads are a problem
here: softmax over 91 classes gives every class about 1/91, under the R-CNNs'
threshold of 0.05 (so the model would find nothing and test nothing after
the first NonZero) and over SSD's 0.001 (every class of every anchor a
candidate), and a 2-class head (Keypoint R-CNN) passes every proposal. So
each model's last classification layer is calibrated on the test image, a
change of its weights only:

  - for a few classes (cal's classes), that class's logit (for the softmax
    heads, its excess over the background's) is rescaled to a spread of
    cal's sigma and shifted so that cal's pass anchors or proposals clear
    the model's own score threshold, the threshold placed midway between
    two samples so that float noise (ONNX Runtime against PyTorch) cannot
    move one across it;
  - with softmax, every other class is lowered (its bias) where it comes
    within a factor 2 of the threshold somewhere, so no class that was not
    chosen fills the detections by chance (Mask R-CNN's logits spread by 2
    over the classes, and some pass).

The MobileNet backbones are also rescaled (see build: with torchvision's
initialisation their activations vanish). The model's own thresholds,
top-k, NMS and detections_per_img are torchvision's defaults.

Inputs are fixed (no dynamic axes: a detector's trace bakes in the image
size at several places anyway): one image [1, 3, H, W] (a wrapper takes the
list the models want out of it), a smooth synthetic picture with a few
rectangles and a disc, not noise, so that features vary as in a photograph.
The resnet50 models get min_size/max_size so the network sees 384 x 512
(resizing is then the identity) rather than the 800 x 1066 torchvision's
defaults would make of it: five times less work for the same graph.

torch 1.13 with torchvision 0.14 registers RoiAlign for opset 11 only, without
coordinate_transformation_mode; from opset 16 on the ONNX default is
half_pixel (torchvision's aligned=True), while the R-CNNs use aligned=False
(output_half_pixel). Exported as it is at opset 17 the second stage would
silently differ from PyTorch, so this script registers its own RoiAlign for
opset 16+ that states the mode.

Everything goes to OUT (default .cache/zoo/detectors): NAME.onnx,
data/NAME/input.npy, data/NAME/torch.OUTPUT.npy (PyTorch's eager outputs)
and manifest.json. Then, unless --no-check, each model is run with ONNX
Runtime (scripts/zoo/run_ort.js: data/NAME/ort.OUTPUT.npy) and compared with
PyTorch (count; boxes, scores, labels and the rest within TOL after sorting
by score), its operators are listed with the data-dependent ones and the
inputs that bound their output sizes (data/NAME/graph.json, read straight
from the protobuf: Debian 12 has no python3-onnx), and `edgeserve inspect`
tells what the engine cannot run yet (data/NAME/inspect.txt; build-release's
binary, if there is one). A model already exported with the same key (its
configuration, torch and torchvision versions, opset, this script's format)
is not exported again; the checks always run.

  export_detectors.py [--out DIR] [--models a,b,...] [--opset N] [--force]
                      [--no-check] [--edgeserve PATH] [--list]
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings
import zlib

# One thread by default (ES_ZOO_THREADS to change), as export.py: on a busy
# two-core machine more threads than free cores only spin. OpenBLAS reads its
# variable when it loads, so before torch is imported.
THREADS = int(os.environ.get("ES_ZOO_THREADS", "1"))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))

import numpy as np  # noqa: E402 (after the thread settings)
import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision import models as tvm  # noqa: E402

FORMAT = 1  # bump when shapes, inputs, calibration or export options change
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# name: size [H, W] of the input (and of the network's image: min_size and
# max_size are chosen so torchvision's resize keeps it), kw for the model's
# builder, outputs in the order of the ONNX outputs, and the calibration
# (cal): classes (those made to pass the score threshold), pass (samples,
# anchors or proposals, above it per class, before top-k and NMS) and sigma
# (the spread of the calibrated logits: the detections' scores vary by
# about that much). Thresholds, NMS, top-k and detections_per_img are
# torchvision's defaults.
BOX = ["boxes", "scores", "labels"]
MODELS = {
    "ssdlite320_mobilenet_v3_large": {
        # SSD resizes to 320 x 320 itself.
        "size": [320, 320], "kw": {}, "outputs": BOX,
        "cal": {"classes": [1, 18, 62], "pass": 30, "sigma": 3.0},
    },
    "fasterrcnn_mobilenet_v3_large_320_fpn": {
        "size": [320, 320], "kw": {}, "outputs": BOX,
        "cal": {"classes": [1, 18, 62], "pass": 15, "sigma": 3.0},
    },
    "retinanet_resnet50_fpn": {
        "size": [384, 512], "kw": {"min_size": 384, "max_size": 512}, "outputs": BOX,
        "cal": {"classes": [1, 18, 62], "pass": 30, "sigma": 3.0},
    },
    "keypointrcnn_resnet50_fpn": {
        "size": [384, 512], "kw": {"min_size": 384, "max_size": 512},
        "outputs": BOX + ["keypoints", "keypoints_scores"],
        "cal": {"classes": [1], "pass": 40, "sigma": 3.0},
    },
    "maskrcnn_resnet50_fpn": {
        "size": [384, 512], "kw": {"min_size": 384, "max_size": 512}, "outputs": BOX + ["masks"],
        "cal": {"classes": [1, 18, 62], "pass": 15, "sigma": 3.0},
    },
}
TOL = 1e-3


def seed_of(name):
    return zlib.crc32(name.encode())


def build(name, image):
    """The model with random weights, seeded by its name. The MobileNet
    detectors' backbones (with FPN or SSDLite's extra blocks) are rescaled:
    torchvision gives MobileNetV3's convolutions He initialisation on
    fan-out, which for a depthwise convolution is nine times the channels
    rather than nine, and SSDLite's normal(0, 0.03) on top, so the
    activations shrink at every block and reach the heads at 1e-15
    (SSDLite) or constant over the image (Faster R-CNN's box head sees the
    same features for every proposal): scores would be rounding noise and
    every anchor alike. He initialisation on fan-in instead makes them grow
    (to 40 at the box head, where the RPN then drops most anchors) and
    without the ReLU gain vanish again, so the scale is measured instead:
    in one run on the test image each convolution of the backbone, in
    order, is divided by its output's standard deviation (LSUV, Mishkin and
    Matas 2015), the next ones seeing the rescaled output. The directions of
    the weights stay torchvision's; the heads are untouched."""
    torch.manual_seed(seed_of(name))
    model = tvm.get_model(name, weights=None, weights_backbone=None, **MODELS[name]["kw"]).eval()
    if "mobilenet" in name:
        def unit(m, inp, out):
            s = float(out.std())
            if s > 0:
                m.weight /= s
                if m.bias is not None:
                    m.bias /= s
                return out / s
            return out
        convs = [m for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d)]
        hooks = [m.register_forward_hook(unit) for m in convs]
        with torch.no_grad():
            model([image])
        for h in hooks:
            h.remove()
    return model


def head_of(model, name):
    """The layers whose outputs are the class logits, how many classes, how
    scores come from logits (softmax over the classes, background 0, or a
    sigmoid per class) and the model's score threshold."""
    if name.startswith("ssd"):
        # Each level's block ends in a 1x1 convolution of anchors x classes.
        head = model.head.classification_head
        return [blk[-1] for blk in head.module_list], head.num_columns, "softmax", model.score_thresh
    if name.startswith("retinanet"):
        head = model.head.classification_head
        return [head.cls_logits], head.num_classes, "sigmoid", model.score_thresh
    lin = model.roi_heads.box_predictor.cls_score
    return [lin], lin.out_features, "softmax", model.roi_heads.score_thresh


def logits_of(out, k):
    """A layer's output as samples x classes: [N, A*K, H, W] (channel a*K + k,
    the layout the heads view it with) or [R, K]."""
    if out.dim() == 4:
        n, c, h, w = out.shape
        return out.reshape(n, c // k, k, h * w).permute(0, 1, 3, 2).reshape(-1, k)
    return out.reshape(-1, k)


def calibrate(model, name, image, cal):
    """Rescales and shifts the logits of cal's classes (see the docstring)
    with one eager run on the test image. The change is affine in each
    layer's rows, so it is a change of weights, not of the graph. Returns
    per class the spread its logits had and how many samples now pass."""
    layers, k, mode, t = head_of(model, name)
    # RetinaNet's one layer runs once per FPN level: every call counts.
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(logits_of(o.detach(), k)))
             for m in layers]
    with torch.no_grad():
        model([image])
    for h in hooks:
        h.remove()
    z = torch.cat(seen).double()
    found = z.clone()  # the logits as found; z: as the calibration leaves them
    softmax = mode == "softmax"

    def logit(p):
        return float(np.log(p / (1 - p)))

    def excess(c):
        """Per sample, the logit of class c's score: softmax's (against
        all the other classes) or the sigmoid's input."""
        if not softmax:
            return z[:, c]
        return z[:, c] - torch.logsumexp(torch.cat([z[:, :c], z[:, c + 1:]], 1), 1)

    def rows(lay):  # the row of class 0 for each anchor of a layer
        return range(0, lay.weight.shape[0], k) if lay.weight.dim() == 4 else [0]

    if softmax:
        # The other classes stay out: a wide head (Mask R-CNN's logits spread
        # by 2 over the classes) passes some of them by chance, which would
        # fill detections_per_img with classes no one chose. Each class whose
        # logit comes within logit(t / 2) of the background's somewhere is
        # lowered (its bias) until it does not: its score is then under t / 2
        # whatever the other classes do (their terms only add to softmax's
        # denominator), so one pass settles all of them.
        for c in range(1, k):
            over = float((z[:, c] - z[:, 0]).max()) - logit(t / 2)
            if c not in cal["classes"] and over > 0:
                with torch.no_grad():
                    for lay in layers:
                        for r in rows(lay):
                            lay.bias[r + c] -= over
                z[:, c] -= over
    report = {}
    # The chosen classes count as absent until set (each then sees the ones
    # set before it as they are): as found, they would weigh in softmax's
    # denominator with values they are about to lose.
    for c in cal["classes"]:
        z[:, c] = z[:, 0] - 30 if softmax else -30
    for c in cal["classes"]:
        # d: what is rescaled (the class's logit, or its excess over the
        # background's: softmax is invariant to a common shift, so d and the
        # other classes' excesses decide the score); need: the value of d
        # above which the sample's score passes the threshold, given the
        # other classes as they are.
        if softmax:
            d = found[:, c] - z[:, 0]
            others = torch.cat([z[:, :c], z[:, c + 1:]], 1) - z[:, :1]
            need = logit(t) + torch.logsumexp(others, 1)
        else:
            d = found[:, c]
            need = torch.full_like(d, logit(t))
        m, s = float(d.mean()), float(d.std())
        # Logits that do not vary over the image (vanished features: see
        # build) would be rescaled rounding noise: refuse rather than export
        # detections that test nothing.
        big = float(found.abs().max())
        if not s > 1e-4 * big or not s > 1e-6:
            raise RuntimeError(f"class {c}'s logits barely vary over the image (spread {s:.3g}, "
                               f"largest logit {big:.3g})")
        gain = cal["sigma"] / s
        u = (d - m) * gain
        # Exactly `pass` samples satisfy u + shift > need: the shift lies
        # midway between the pass-th and the next smallest need - u.
        v = torch.sort(need - u).values
        n = min(cal["pass"], len(v) - 1)
        shift = float(v[n - 1] + v[n]) / 2
        with torch.no_grad():
            for lay in layers:
                w, b = lay.weight, lay.bias
                for r in rows(lay):
                    if softmax:  # d' = (d - m) * gain + shift, z_0 kept
                        w[r + c] = w[r] + (w[r + c] - w[r]) * gain
                        b[r + c] = b[r] + (b[r + c] - b[r] - m) * gain + shift
                    else:
                        w[r + c] = w[r + c] * gain
                        b[r + c] = (b[r + c] - m) * gain + shift
        # Later classes see this one as it now is.
        z[:, c] = (z[:, 0] if softmax else 0) + u + shift
        report[c] = {"spread": round(s, 6), "samples": len(v)}
    # What passes in the end (the classes chosen change each other's
    # softmax a little), before top-k and NMS.
    for c in cal["classes"]:
        report[c]["pass"] = int((excess(c) > logit(t)).sum())
    report["others_pass"] = sum(int((excess(c) > logit(t)).sum())
                                for c in range(1 if softmax else 0, k) if c not in cal["classes"])
    return report


def synthetic_image(h, w, seed):
    """A smooth picture in [0, 1]: two slow colour gradients, five filled
    rectangles and a disc of flat colours with soft (one-pixel) edges,
    seeded. Not noise: a random network's features then vary over the image
    as they would on a photograph, and boxes have edges to find."""
    g = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((3, h, w), np.float32)
    for c in range(3):
        fy, fx, ph = g.uniform(0.5, 2.0), g.uniform(0.5, 2.0), g.uniform(0, 6.3)
        img[c] = 0.5 + 0.25 * np.sin(fy * np.pi * y / h + ph) * np.cos(fx * np.pi * x / w)

    def soft(dist):  # 1 inside, 0 outside, linear over one pixel
        return np.clip(0.5 - dist, 0, 1)

    for _ in range(5):
        bh, bw = g.integers(h // 10, h // 3), g.integers(w // 10, w // 3)
        y0, x0 = g.integers(0, h - bh), g.integers(0, w - bw)
        dist = np.maximum(np.maximum(y0 - y, y - (y0 + bh)), np.maximum(x0 - x, x - (x0 + bw)))
        a = soft(dist)
        col = g.uniform(0, 1, 3).astype(np.float32)
        img = img * (1 - a) + col[:, None, None] * a
    cy, cx, r = h * 0.6, w * 0.35, min(h, w) * 0.15
    a = soft(np.sqrt((y - cy) ** 2 + (x - cx) ** 2) - r)
    img = img * (1 - a) + np.array([0.9, 0.8, 0.1], np.float32)[:, None, None] * a
    return np.clip(img, 0, 1)[None].astype(np.float32)


class Single(torch.nn.Module):
    """image [1, 3, H, W] -> the detector's outputs for it, as a tuple in a
    fixed order (the models take a list of images and return a list of
    dicts; ONNX wants tensors, named)."""

    def __init__(self, model, outputs):
        super().__init__()
        self.model, self.outputs = model, outputs

    def forward(self, x):
        det = self.model([x[0]])[0]
        return tuple(det[k] for k in self.outputs)


def register_roi_align(opset):
    """RoiAlign for opset 16+ with coordinate_transformation_mode stated (see
    the docstring): torchvision 0.14's symbolic leaves it out."""
    if opset < 16:
        return
    from torch.onnx import register_custom_op_symbolic, symbolic_helper
    from torch.onnx.symbolic_opset11 import select, squeeze
    from torch.onnx.symbolic_opset9 import _cast_Long

    @symbolic_helper.parse_args("v", "v", "f", "i", "i", "i", "i")
    def roi_align(g, inp, rois, spatial_scale, ph, pw, sampling_ratio, aligned):
        idx = _cast_Long(g, squeeze(g, select(g, rois, 1, g.op(
            "Constant", value_t=torch.tensor([0], dtype=torch.long))), 1), False)
        rois = select(g, rois, 1, g.op("Constant", value_t=torch.tensor([1, 2, 3, 4], dtype=torch.long)))
        return g.op("RoiAlign", inp, rois, idx, spatial_scale_f=spatial_scale,
                    output_height_i=ph, output_width_i=pw,
                    # ONNX has no adaptive (negative) sampling ratio; 0 is it.
                    sampling_ratio_i=max(sampling_ratio, 0),
                    coordinate_transformation_mode_s="half_pixel" if aligned else "output_half_pixel")

    register_custom_op_symbolic("torchvision::roi_align", roi_align, 16)


def key_of(name, opset):
    cfg = json.dumps(MODELS[name], sort_keys=True)
    return {"format": FORMAT, "torch": torch.__version__, "torchvision": torchvision.__version__,
            "opset": opset, "config": hashlib.sha1(cfg.encode()).hexdigest()[:12]}


def export(name, out, opset):
    """Builds, calibrates, runs and exports one model; returns its manifest
    entry (or raises)."""
    spec = MODELS[name]
    h, w = spec["size"]
    data = os.path.join(out, "data", name)
    os.makedirs(data, exist_ok=True)
    x = torch.from_numpy(synthetic_image(h, w, seed_of(name)))
    model = build(name, x[0])
    spread = calibrate(model, name, x[0], spec["cal"])
    with torch.no_grad():
        ref = Single(model, spec["outputs"])(x)
    np.save(os.path.join(data, "input.npy"), x.numpy())
    for k, v in zip(spec["outputs"], ref):
        np.save(os.path.join(data, f"torch.{k}.npy"), v.numpy())
    path = os.path.join(out, f"{name}.onnx")
    t0 = time.time()
    with torch.no_grad(), warnings.catch_warnings():
        # The tracer warns about every Python int and bool it bakes in; the
        # input size is fixed on purpose, and ORT's comparison is the check.
        warnings.simplefilter("ignore")
        torch.onnx.export(Single(model, spec["outputs"]), (x,), path, input_names=["image"],
                          output_names=spec["outputs"], opset_version=opset)
    return {"name": name, "file": f"{name}.onnx", "input": "image", "shape": [1, 3, h, w],
            "input_file": f"data/{name}/input.npy", "outputs": spec["outputs"],
            "output_shapes": {k: list(v.shape) for k, v in zip(spec["outputs"], ref)},
            "torch_files": {k: f"data/{name}/torch.{k}.npy" for k in spec["outputs"]},
            "detections": int(ref[0].shape[0]), "export_s": round(time.time() - t0, 1),
            "calibration": {str(c): v for c, v in spread.items()}, "key": key_of(name, opset)}


# --- Reading the exported graph: protobuf's wire format, just the fields of
# ModelProto, GraphProto, NodeProto, AttributeProto and TensorProto used here.

def _varint(buf, p):
    v, sh = 0, 0
    while True:
        b = buf[p]
        p += 1
        v |= (b & 0x7F) << sh
        sh += 7
        if not b & 0x80:
            return v, p


def _fields(buf):
    """(field number, wire type, value) of a message: an int for varints,
    a memoryview (no copy: the weights are most of the file) otherwise."""
    p = 0
    while p < len(buf):
        key, p = _varint(buf, p)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, p = _varint(buf, p)
            yield f, wt, v
            continue
        n = {1: 8, 5: 4}.get(wt)
        if n is None:
            if wt != 2:
                raise ValueError(f"wire type {wt}")
            n, p = _varint(buf, p)
        yield f, wt, buf[p:p + n]
        p += n


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _ints(wt, v):
    """A repeated int64 field's values: one (unpacked) or several (packed)."""
    if wt == 0:
        return [_signed(v)]
    out, p = [], 0
    while p < len(v):
        x, p = _varint(v, p)
        out.append(_signed(x))
    return out


def _str(v):
    return bytes(v).decode(errors="replace")


DTYPES = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 11: np.float64}


def _tensor(buf):
    dims, dt, raw, f32, i64, i32 = [], 1, None, [], [], []
    for f, wt, v in _fields(buf):
        if f == 1:
            dims += _ints(wt, v)
        elif f == 2:
            dt = v
        elif f == 9:
            raw = v
        elif f == 4:
            f32 += list(np.frombuffer(v, np.float32)) if wt == 2 else [np.frombuffer(v, np.float32)[0]]
        elif f == 7:
            i64 += _ints(wt, v)
        elif f == 5:
            i32 += _ints(wt, v)
    if dt not in DTYPES:
        return np.zeros(0)
    if raw is not None:
        a = np.frombuffer(raw, DTYPES[dt])
    else:
        a = np.array(f32 or i64 or i32, DTYPES[dt])
    return a.reshape(dims) if a.size == int(np.prod(dims)) else a


def _attr(buf):
    a = {"ints": [], "floats": []}
    for f, wt, v in _fields(buf):
        if f == 1:
            a["name"] = _str(v)
        elif f == 2:
            a["f"] = float(np.frombuffer(v, np.float32)[0])
        elif f == 3:
            a["i"] = _signed(v)
        elif f == 4:
            a["s"] = _str(v)
        elif f == 5:
            a["t"] = _tensor(v)
        elif f == 6:
            a["g"] = _graph(v)
        elif f == 8:
            a["ints"] += _ints(wt, v)
        elif f == 7:
            a["floats"] += list(np.frombuffer(v, np.float32))
    return a


def _graph(buf):
    g = {"nodes": [], "inits": {}}
    for f, wt, v in _fields(buf):
        if f == 1:
            n = {"inputs": [], "outputs": [], "attrs": {}, "name": "", "op": ""}
            for nf, nwt, nv in _fields(v):
                if nf == 1:
                    n["inputs"].append(_str(nv))
                elif nf == 2:
                    n["outputs"].append(_str(nv))
                elif nf == 3:
                    n["name"] = _str(nv)
                elif nf == 4:
                    n["op"] = _str(nv)
                elif nf == 5:
                    at = _attr(nv)
                    n["attrs"][at.pop("name")] = at
            g["nodes"].append(n)
        elif f == 5:
            name = next((_str(fv) for ff, _, fv in _fields(v) if ff == 8), "")
            g["inits"][name] = _tensor(v) if len(v) < 4096 else None  # values of small ones only
    return g


def read_onnx(path):
    with open(path, "rb") as f:
        buf = memoryview(f.read())
    g, opsets = None, {}
    for f, wt, v in _fields(buf):
        if f == 7:
            g = _graph(v)
        elif f == 8:
            dom, ver = "", 0
            for ff, _, fv in _fields(v):
                if ff == 1:
                    dom = _str(fv)
                elif ff == 2:
                    ver = fv
            opsets[dom or "ai.onnx"] = ver
    return g, opsets


# Operators whose output size depends on input values, or on shapes computed
# at run time (ConstantOfShape, Expand, Resize, Reshape, Slice, Tile: bounded
# when their shape input is a constant, data-dependent when it comes from one
# of the first kind).
DATA_DEP = ("NonZero", "NonMaxSuppression", "TopK", "RoiAlign", "Range", "Unique", "Compress",
            "ConstantOfShape", "Expand", "Tile", "Resize", "Loop", "If", "Scan")
# Inputs and attributes that matter for each (input indices).
WATCH = {"TopK": [1], "NonMaxSuppression": [2, 3, 4], "Range": [0, 1, 2], "ConstantOfShape": [0],
         "Expand": [1], "Tile": [1], "Resize": [1, 2, 3], "Loop": [0, 1], "RoiAlign": [1, 2],
         "If": [0], "NonZero": [0], "Compress": [1], "Unique": [0]}


def fmt(v):
    """A constant as text: its values when few, else its type and shape."""
    v = np.asarray(v)
    if v.size > 8:
        return f"{v.dtype}{list(v.shape)}"
    vals = [float(f"{x:.7g}") if v.dtype.kind == "f" else int(x) for x in v.reshape(-1).tolist()]
    return str(vals if v.ndim else vals[0])


def describe(scope, name, depth=4):
    """A short expression for a tensor: its value if constant, else the
    operators that compute it, depth levels deep (Gather with its axis: a
    Gather of a Shape is how a traced graph reads a dimension)."""
    producers, consts = scope
    if name == "":
        return "(none)"
    if name in consts:
        return "initializer" if consts[name] is None else f"const {fmt(consts[name])}"
    n = producers.get(name)
    if n is None:
        return f"input {name}"  # the graph's input or the loop body's own
    if depth == 0:
        return f"{n['op']}(..)"
    args = ", ".join(describe(scope, i, depth - 1) for i in n["inputs"][:3])
    more = ", .." if len(n["inputs"]) > 3 else ""
    axis = f" axis={n['attrs']['axis'].get('i')}" if n["op"] == "Gather" and "axis" in n["attrs"] else ""
    return f"{n['op']}{axis}({args}{more})"


def _attrs(n):
    out = {}
    for k, a in n["attrs"].items():
        if "g" in a:
            continue
        out[k] = (a["i"] if "i" in a else round(a["f"], 7) if "f" in a else a["s"] if "s" in a
                  else fmt(a["t"]) if "t" in a else a["ints"] or [round(x, 7) for x in a["floats"]])
    return out


def _walk(g, where, outer, out, hist_of):
    """Every node of g and of its subgraphs: the histogram of each graph,
    and the data-dependent nodes with the inputs that size their outputs.
    A subgraph sees its outer graphs' values (outer: producers, consts)."""
    producers = dict(outer[0], **{o: n for n in g["nodes"] for o in n["outputs"]})
    consts = dict(outer[1], **g["inits"])
    for n in g["nodes"]:
        if n["op"] == "Constant" and "value" in n["attrs"]:
            consts[n["outputs"][0]] = n["attrs"]["value"].get("t")
    scope = (producers, consts)
    hist = hist_of.setdefault(where, {})
    for n in g["nodes"]:
        hist[n["op"]] = hist.get(n["op"], 0) + 1
        if n["op"] in DATA_DEP:
            e = {"op": n["op"], "node": n["name"], "graph": where}
            if _attrs(n):
                e["attrs"] = _attrs(n)
            e["inputs"] = {i: describe(scope, n["inputs"][i])
                           for i in WATCH.get(n["op"], []) if i < len(n["inputs"])}
            out.append(e)
        for k, a in n["attrs"].items():
            if "g" in a:
                _walk(a["g"], f"{where}/{n['name'] or n['op']}.{k}", scope, out, hist_of)


def _grouped(entries):
    """Entries alike but for an integer constant (SSD's 90 per-class
    branches: the class index, and the label ConstantOfShape fills in) as
    one, with a count."""
    groups = {}
    for e in entries:
        attrs = {k: v for k, v in (e.get("attrs") or {}).items() if not (e["op"] == "ConstantOfShape"
                                                                           and k == "value")}
        key = re.sub(r"const -?\d+(?![\d.])", "const #",
                     json.dumps([e["op"], e["graph"], attrs, e["inputs"]], sort_keys=True))
        if key in groups:
            groups[key]["count"] += 1
        else:
            groups[key] = {"count": 1, **e}
    return list(groups.values())


# Operators whose output size is decided by values: what starts the
# data-dependent part of a graph (TopK only when its k is computed from one).
DYN_SOURCES = ("NonZero", "NonMaxSuppression", "Unique", "Compress", "If", "Loop", "Scan")


def _dynamic(g):
    """The main graph's data-dependent part: every node with an input whose
    size (or, for a shape computation, value) follows from a source's
    output, in order (ONNX nodes are sorted). An over-approximation: a node
    fed only by a shape that does not really vary counts too. Returns the
    node count and the caps: Slice nodes with a constant end on such a
    tensor (keep[:detections_per_img] and the like: what bounds the sizes
    after NMS)."""
    producers = {o: n for n in g["nodes"] for o in n["outputs"]}
    consts = dict(g["inits"], **{n["outputs"][0]: n["attrs"]["value"].get("t") for n in g["nodes"]
                                 if n["op"] == "Constant" and "value" in n["attrs"]})
    dyn, count, caps = set(), 0, []
    for n in g["nodes"]:
        if n["op"] in DYN_SOURCES or any(i in dyn for i in n["inputs"]):
            dyn.update(n["outputs"])
            count += 1
        if n["op"] == "Slice" and n["inputs"][0] in dyn and len(n["inputs"]) > 2 and n["inputs"][2] in consts:
            end = describe((producers, consts), n["inputs"][2], 0)
            if str(2 ** 63 - 1) not in end:  # [a:] has INT64_MAX for its end
                caps.append({"node": n["name"], "ends": end, "of": describe((producers, {}), n["inputs"][0], 2)})
    return count, caps


def analyse(path):
    g, opsets = read_onnx(path)
    dd, hist = [], {}
    _walk(g, "main", ({}, {}), dd, hist)
    dyn_nodes, caps = _dynamic(g)
    total = {}
    for h in hist.values():
        for k, v in h.items():
            total[k] = total.get(k, 0) + v
    sort = lambda h: dict(sorted(h.items(), key=lambda kv: (-kv[1], kv[0])))  # noqa: E731
    return {"opsets": opsets, "ops": sort(total), "ops_by_graph": {k: sort(v) for k, v in hist.items()},
            "control_flow": [e for e in dd if e["op"] in ("If", "Loop", "Scan")],
            "data_dependent": _grouped(e for e in dd if e["op"] not in ("If", "Loop", "Scan")),
            "nodes": len(g["nodes"]), "data_dependent_nodes": dyn_nodes, "caps": caps}


# --- Checks: ONNX Runtime against PyTorch, and the engine's inspector.

def sort_dets(d):
    """Detections in a canonical order: score descending, then label, then
    the box (ties in score are possible and NMS keeps them in either order)."""
    s = d["scores"].astype(np.float64)
    order = np.lexsort((d["boxes"][:, 0], d["labels"], -np.round(s, 5)))
    return {k: v[order] for k, v in d.items()}


def compare(ref, got):
    """Count, then max |error| of each output after sorting by score."""
    if ref["scores"].shape[0] != got["scores"].shape[0]:
        return {"match": False, "why": f"{got['scores'].shape[0]} detections, PyTorch {ref['scores'].shape[0]}"}
    a, b = sort_dets(ref), sort_dets(got)
    err = {}
    for k in a:
        if a[k].shape != b[k].shape:
            return {"match": False, "why": f"{k}: shape {list(b[k].shape)}, PyTorch {list(a[k].shape)}"}
        err[k] = float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) if a[k].size else 0.0
    bad = [k for k, e in err.items() if not e <= TOL]
    return {"match": not bad, "max_abs_error": err, **({"why": f"over {TOL}: {', '.join(bad)}"} if bad else {})}


def check_ort(e, out):
    node = shutil.which("node")
    if not node:
        return {"error": "node not found"}
    data = os.path.join(out, "data", e["name"])
    cmd = [node, os.path.join(HERE, "run_ort.js"), os.path.join(out, e["file"]),
           os.path.join(out, e["input_file"]), data, "--prefix", "ort.", "--repeat", "3", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip() or r.stdout.strip())[-2000:]}
    info = json.loads(r.stdout.strip().splitlines()[-1])
    ref = {k: np.load(os.path.join(out, f)) for k, f in e["torch_files"].items()}
    got = {k: np.load(os.path.join(data, f"ort.{k}.npy")) for k in e["outputs"]}
    return {"detections": int(got["scores"].shape[0]), "load_ms": info["load_ms"],
            "first_ms": info["first_ms"], "median_ms": info["median_ms"], **compare(ref, got)}


def inspect(e, out, binary):
    if not binary or not os.path.exists(binary):
        return {"error": f"no edgeserve binary at {binary}"}
    shape = "x".join(map(str, e["shape"]))
    r = subprocess.run([binary, "inspect", os.path.join(out, e["file"]), "--shape",
                        f"{e['input']}={shape}"], capture_output=True, text=True)
    text = r.stdout + (("\n" + r.stderr) if r.stderr else "")
    rel = f"data/{e['name']}/inspect.txt"
    with open(os.path.join(out, rel), "w") as f:
        f.write(text)
    return {"status": r.returncode, "file": rel}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(
        os.environ.get("ES_ZOO_DIR", os.path.join(ROOT, ".cache/zoo")), "detectors"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--force", action="store_true", help="export again even with the same key")
    ap.add_argument("--no-check", action="store_true", help="skip ONNX Runtime, the graph report and inspect")
    ap.add_argument("--edgeserve", default=os.path.join(ROOT, "build-release/edgeserve"))
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print("\n".join(MODELS))
        return 0
    names = [n for n in a.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown models: {', '.join(unknown)}")
    torch.set_num_threads(THREADS)
    register_roi_align(a.opset)
    os.makedirs(a.out, exist_ok=True)
    mpath = os.path.join(a.out, "manifest.json")
    try:
        with open(mpath) as f:
            old = {e["name"]: e for e in json.load(f)["models"]}
    except (OSError, ValueError, KeyError):
        old = {}
    entries = dict(old)
    failed = 0
    for name in names:
        prev = old.get(name)
        if (not a.force and prev and prev.get("key") == key_of(name, a.opset) and "error" not in prev
                and os.path.exists(os.path.join(a.out, prev["file"]))):
            print(f"{name}: exported already ({prev['detections']} detections)", flush=True)
            e = prev
        else:
            print(f"{name}: exporting", flush=True)
            try:
                e = export(name, a.out, a.opset)
            except Exception as ex:  # noqa: BLE001 (a failed export is a result)
                traceback.print_exc()
                e = {"name": name, "error": f"{type(ex).__name__}: {ex}"[:2000], "key": key_of(name, a.opset)}
                entries[name] = e
                failed += 1
                continue
            print(f"{name}: {e['file']} in {e['export_s']} s, {e['detections']} detections", flush=True)
        if not a.no_check:
            g = analyse(os.path.join(a.out, e["file"]))
            with open(os.path.join(a.out, "data", name, "graph.json"), "w") as f:
                json.dump(g, f, indent=1, default=str)
            e["graph_file"] = f"data/{name}/graph.json"
            e["ort"] = check_ort(e, a.out)
            e["inspect"] = inspect(e, a.out, a.edgeserve)
            o = e["ort"]
            print(f"{name}: ort " + (f"error {o['error'][:200]}" if "error" in o else
                  f"{o['detections']} detections, {'matches' if o['match'] else 'DIFFERS: ' + o['why']}, "
                  f"{o['median_ms']} ms") + f"; inspect exit {e['inspect'].get('status')}", flush=True)
        entries[name] = e
    order = [n for n in MODELS if n in entries]
    with open(mpath, "w") as f:
        json.dump({"format": FORMAT, "opset": a.opset, "models": [entries[n] for n in order]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
