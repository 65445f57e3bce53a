// The model zoo's manifest and error measure, for the shell scripts that
// compare and time the zoo (tests/e2e/test_zoo.sh, scripts/bench/bench_vs_ort.sh --zoo).
//
//   node zoo.js list MANIFEST [--all] [--models a,b] [--variants plain,randnorm]
//     One line per export, tab-separated, paths absolute, "-" for none:
//     name variant status file output shape input shape2 input2 torch torch2 bench_shape
//     bench_input sensitivity (output: the .npy name `edgeserve run` gives the
//     model's output; sensitivity: how much another input moves it, relative)
//     status: ok, "skip: why" (a variant the model does not have) or
//     "export failed: why". Shapes as edgeserve writes them (1x3x224x224).
//     The core models unless --all; --models picks by name.
//
//   node zoo.js error A.npy B.npy
//     Prints two measures of max |A - B| against B, the reference (%.3e):
//       E = max |A - B| / max(1, range of B): absolute within a unit range,
//           relative to the range for larger outputs;
//       R = max |A - B| / max(range of B, max |B|): scale-free. Random
//           networks can end in tiny outputs (torchvision's initialisation
//           gives mobilenet_v2 logits of 1e-9), where E would pass anything;
//           floating point keeps its relative precision at any scale.
//     A shape or type mismatch prints "shape ..." and exits 1; NaN anywhere
//     counts as an infinite error.
//
//   node zoo.js ops FILE.onnx...
//     The operators of each model's main graph with their counts, one model
//     a line ("resnet18.onnx: Conv 20, Relu 17, ..."), read straight from the
//     protobuf (no ONNX library): what a model needs, not only the first
//     operator an engine stops at.
'use strict';
const fs = require('fs');
const path = require('path');
const npy = require('../ort/npy');

function die(msg, code) {
  console.error(`zoo: ${msg}`);
  process.exit(code);
}

function list(args) {
  const file = args[0];
  if (!file) die('list wants MANIFEST', 2);
  let all = false, models = null, variants = null;
  for (let i = 1; i < args.length; i++) {
    if (args[i] === '--all') all = true;
    else if (args[i] === '--models') models = (args[++i] || '').split(',').filter(Boolean);
    else if (args[i] === '--variants') variants = (args[++i] || '').split(',').filter(Boolean);
    else die(`unknown argument '${args[i]}'`, 2);
  }
  let m;
  try { m = JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) { die(`${file}: ${e.message}`, 1); }
  const dir = path.dirname(file);
  const abs = f => (f ? path.resolve(dir, f) : '-');
  const shp = s => (s ? s.join('x') : '-');
  for (const e of m.models || []) {
    if (models ? !models.includes(e.name) : !(all || e.tier === 'core')) continue;
    if (variants && !variants.includes(e.variant)) continue;
    const status = e.skip ? `skip: ${e.skip}` : e.error ? `export failed: ${e.error}` : 'ok';
    const out = e.output ? `${e.output.replace(/[^A-Za-z0-9._-]/g, '_')}.npy` : '-';
    console.log([e.name, e.variant, status.replace(/\s+/g, ' '), abs(e.file), out, shp(e.shape),
      abs(e.input_file), shp(e.shape2), abs(e.input2_file), abs(e.torch_file), abs(e.torch2_file),
      shp(e.bench_shape), abs(e.bench_file), e.sensitivity ?? '-'].join('\t'));
  }
}

function error(args) {
  if (args.length !== 2) die('error wants A.npy B.npy', 2);
  const [a, b] = args.map(f => {
    try { return npy.read(f); } catch (e) { return die(`${f}: ${e.message}`, 1); }
  });
  if (a.type !== b.type || a.shape.join('x') !== b.shape.join('x')) {
    console.log(`shape ${a.type}[${a.shape.join('x')}] vs ${b.type}[${b.shape.join('x')}]`);
    process.exit(1);
  }
  let err = 0, lo = Infinity, hi = -Infinity, big = 0;
  for (let i = 0; i < a.data.length; i++) {
    const u = Number(a.data[i]), v = Number(b.data[i]);
    const e = Math.abs(u - v);
    if (!(e <= err)) err = Number.isNaN(e) ? Infinity : e;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
    if (!(Math.abs(v) <= big)) big = Number.isNaN(v) ? Infinity : Math.abs(v);
  }
  const range = a.data.length ? hi - lo : 0;
  const scale = Math.max(range, big);
  const rel = err === 0 ? 0 : err / scale;
  console.log(`${(err / Math.max(1, range)).toExponential(3)} ${rel.toExponential(3)}`);
}

// Protobuf wire format, just enough for ModelProto.graph (7) ->
// GraphProto.node (1) -> NodeProto.op_type (4) and domain (7).
function* fields(buf, start, end) {
  let p = start;
  const varint = () => {
    let v = 0, mul = 1, b;
    do {
      if (p >= end) throw new Error('truncated varint');
      b = buf[p++];
      v += (b & 0x7f) * mul;
      mul *= 128;
    } while (b & 0x80);
    return v;
  };
  while (p < end) {
    const key = varint(), field = Math.floor(key / 8), wire = key & 7;
    if (wire === 0) { varint(); continue; }
    if (wire === 1) { p += 8; continue; }
    if (wire === 5) { p += 4; continue; }
    if (wire !== 2) throw new Error(`wire type ${wire}`);
    const len = varint();
    if (p + len > end) throw new Error('truncated field');
    yield { field, start: p, end: p + len };
    p += len;
  }
}

function ops(files) {
  if (files.length === 0) die('ops wants FILE.onnx...', 2);
  for (const f of files) {
    const buf = fs.readFileSync(f);
    const counts = new Map();
    try {
      for (const g of fields(buf, 0, buf.length)) {
        if (g.field !== 7) continue;
        for (const n of fields(buf, g.start, g.end)) {
          if (n.field !== 1) continue;
          let op = '?', domain = '';
          for (const a of fields(buf, n.start, n.end)) {
            if (a.field === 4) op = buf.toString('utf8', a.start, a.end);
            else if (a.field === 7) domain = buf.toString('utf8', a.start, a.end);
          }
          const name = domain && domain !== 'ai.onnx' ? `${domain}.${op}` : op;
          counts.set(name, (counts.get(name) || 0) + 1);
        }
      }
    } catch (e) { die(`${f}: ${e.message}`, 1); }
    const list = [...counts].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
    console.log(`${path.basename(f)}: ${list.map(([o, c]) => `${o} ${c}`).join(', ')}`);
  }
}

const [cmd, ...rest] = process.argv.slice(2);
if (cmd === 'list') list(rest);
else if (cmd === 'error') error(rest);
else if (cmd === 'ops') ops(rest);
else die('usage: node zoo.js list MANIFEST [...] | error A.npy B.npy | ops FILE.onnx...', 2);
