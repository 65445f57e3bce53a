// Compares a detector's outputs from two runs (ONNX Runtime's and
// edgeserve's, each OUTPUT.npy in its folder) as detections: the same
// number, and after sorting each side by score (best first) the same
// labels exactly and every other output (boxes, scores, keypoints, masks)
// within TOL of max(1, the reference's range), the zoo's rule. The order
// of equal scores is the engines' own, so they are compared as sorted.
//
//   node det_compare.js REF_DIR GOT_DIR [--tol 1e-3] [--json]
//
// Prints one line per output (or one JSON line); exit 0 when they match,
// 1 when not, 2 on a usage error or a missing file.
'use strict';
const fs = require('fs');
const path = require('path');
const npy = require('../ort/npy');

function usage(msg) {
  if (msg) console.error(`det_compare: ${msg}`);
  console.error('usage: node det_compare.js REF_DIR GOT_DIR [--tol T] [--json]');
  process.exit(2);
}

const argv = process.argv.slice(2);
const pos = [];
let tol = 1e-3, json = false;
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--tol') tol = Number(argv[++i]);
  else if (argv[i] === '--json') json = true;
  else if (argv[i].startsWith('--')) usage(`unknown option '${argv[i]}'`);
  else pos.push(argv[i]);
}
if (pos.length !== 2 || !(tol > 0)) usage();
const [refDir, gotDir] = pos;

const read = (dir, name) => {
  const f = path.join(dir, `${name}.npy`);
  if (!fs.existsSync(f)) usage(`missing ${f}`);
  return npy.read(f);
};
const names = fs.readdirSync(refDir).filter(f => f.endsWith('.npy')).map(f => f.slice(0, -4));
if (!names.includes('scores')) usage(`${refDir} has no scores.npy`);

// Detections best first; equal scores by index, on each side.
const order = t => Array.from(t.data.keys()).sort((a, b) => t.data[b] - t.data[a] || a - b);
const ref = {}, got = {};
for (const n of names) {
  ref[n] = read(refDir, n);
  got[n] = read(gotDir, n);
}
const ro = order(ref.scores), go = order(got.scores);
const result = { match: true, detections: [ro.length, go.length], outputs: {} };
if (ro.length !== go.length) result.match = false;
for (const n of names) {
  const r = ref[n], g = got[n];
  const o = { shape: [Array.from(g.shape), Array.from(r.shape)] };
  result.outputs[n] = o;
  if (r.shape.length !== g.shape.length || r.shape.some((d, i) => i > 0 && d !== g.shape[i]) ||
      r.shape[0] !== ro.length || g.shape[0] !== go.length) {
    o.error = 'shapes differ';
    result.match = false;
    continue;
  }
  if (ro.length !== go.length) continue;
  const per = ro.length ? r.data.length / ro.length : 0;
  let lo = Infinity, hi = -Infinity, diff = 0;
  for (const v of r.data) {
    const x = Number(v);
    if (x < lo) lo = x;
    if (x > hi) hi = x;
  }
  for (let k = 0; k < ro.length; k++)
    for (let j = 0; j < per; j++) {
      const d = Math.abs(Number(r.data[ro[k] * per + j]) - Number(g.data[go[k] * per + j]));
      if (d > diff || Number.isNaN(d)) diff = Number.isNaN(d) ? Infinity : d;
    }
  const scale = Math.max(1, hi - lo);
  o.max_abs = diff;
  o.err = diff / scale;
  const exact = n === 'labels' || /int/.test(r.type);
  if (exact ? diff !== 0 : o.err > tol) result.match = false;
}
if (json) {
  console.log(JSON.stringify(result));
} else {
  console.log(`detections: ${go.length} (reference ${ro.length})`);
  for (const [n, o] of Object.entries(result.outputs))
    console.log(`  ${n} [${o.shape[0]}]: ${o.error ?? `max |diff| ${o.max_abs.toPrecision(3)}, ` +
      `${o.err.toPrecision(3)} of max(1, range)`}`);
}
process.exit(result.match ? 0 : 1);
