// Checks for quantized models (edgeserve quantize): what a user sees of the
// outputs, not their last bits, since a rounding flip early in a deep int8
// network moves later values by whole steps in any engine.
//   node quant_check.js map A.npy B.npy [--thresh 0.3] [--min 0.99]
//       a probability map: the share of pixels on the same side of thresh
//   node quant_check.js text KEYS.txt A.npy B.npy...
//       CTC greedy decode of recognition outputs: every text the same
//   node quant_check.js argmax A.npy B.npy...
//       the top class of each row the same
//   node quant_check.js faces A.json B.json [--iou 0.98]
//       `edgeserve face --json` answers: as many faces, each box's IoU with
//       its match at least iou
// Prints what it measured; exits 1 when the check fails.
'use strict';
const fs = require('fs');
const npy = require('./npy');

const [mode, ...rest] = process.argv.slice(2);
const opt = (name, def) => {
  const i = rest.indexOf(name);
  if (i < 0) return def;
  const v = Number(rest[i + 1]);
  rest.splice(i, 2);
  return v;
};

function ctc(t, keys) {
  const [, T, C] = t.shape;
  let s = '', prev = -1;
  for (let i = 0; i < T; i++) {
    let b = 0;
    for (let c = 1; c < C; c++) if (t.data[i * C + c] > t.data[i * C + b]) b = c;
    if (b !== 0 && b !== prev) s += keys[b - 1] === undefined ? '?' : keys[b - 1];
    prev = b;
  }
  return s;
}

function iou(a, b) {
  const ix = Math.max(0, Math.min(a[2], b[2]) - Math.max(a[0], b[0]));
  const iy = Math.max(0, Math.min(a[3], b[3]) - Math.max(a[1], b[1]));
  const inter = ix * iy, ua = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
  return ua > 0 ? inter / ua : 0;
}

let ok = true;
if (mode === 'map') {
  const thresh = opt('--thresh', 0.3), min = opt('--min', 0.99);
  const [a, b] = rest.map(npy.read);
  if (a.data.length !== b.data.length) throw new Error('the maps differ in size');
  let same = 0, on = 0;
  for (let i = 0; i < a.data.length; i++) {
    same += (a.data[i] > thresh) === (b.data[i] > thresh);
    on += a.data[i] > thresh;
  }
  const share = same / a.data.length;
  ok = share >= min;
  console.log(`map: ${(share * 100).toFixed(3)}% of ${a.data.length} pixels on the same side of ` +
              `${thresh} (${on} above it in the first; at least ${(min * 100).toFixed(1)}% asked)`);
} else if (mode === 'text') {
  const keys = fs.readFileSync(rest[0], 'utf8').split('\n');
  keys.push(' ');
  const texts = rest.slice(1).map((f) => ctc(npy.read(f), keys));
  ok = texts.every((t) => t === texts[0]);
  texts.forEach((t, i) => console.log(`text ${i}: ${JSON.stringify(t)}`));
} else if (mode === 'argmax') {
  const ts = rest.map(npy.read);
  const C = ts[0].shape[ts[0].shape.length - 1], rows = ts[0].data.length / C;
  const top = (t) => [...Array(rows).keys()].map((r) => {
    let b = 0;
    for (let c = 1; c < C; c++) if (t.data[r * C + c] > t.data[r * C + b]) b = c;
    return b;
  });
  const tops = ts.map(top);
  ok = tops.every((t) => t.join() === tops[0].join());
  tops.forEach((t, i) => console.log(`argmax ${i}: ${t.join(' ')}`));
} else if (mode === 'faces') {
  const min = opt('--iou', 0.98);
  const [a, b] = rest.map((f) => JSON.parse(fs.readFileSync(f, 'utf8')).faces);
  ok = a.length === b.length && a.length > 0;
  let worst = 1;
  for (const fa of a) {
    const best = Math.max(0, ...b.map((fb) => iou(fa.box, fb.box)));
    worst = Math.min(worst, best);
  }
  ok = ok && worst >= min;
  console.log(`faces: ${a.length} vs ${b.length}, worst IoU ${worst.toFixed(4)} (at least ${min} asked)`);
} else {
  console.error('usage: node quant_check.js map|text|argmax|faces ...');
  process.exit(2);
}
console.log(ok ? 'ok' : 'FAIL');
process.exit(ok ? 0 : 1);
