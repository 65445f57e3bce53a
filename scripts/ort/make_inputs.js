// Deterministic inputs for the target models (seeded, uniform in [lo, hi]).
//   node make_inputs.js OUTDIR
'use strict';
const path = require('path');
const fs = require('fs');
const npy = require('./npy');

function rng(seed) {
  let s = BigInt(seed);
  return () => {
    s = (s + 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn;
    let z = s;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & 0xffffffffffffffffn;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & 0xffffffffffffffffn;
    z ^= z >> 31n;
    return Number(z >> 11n) / 2 ** 53;
  };
}

const specs = [
  ['blazeface_front_128', [1, 128, 128, 3], -1, 1],
  ['blazeface_back_256', [1, 256, 256, 3], -1, 1],
  ['ppocr_cls', [1, 3, 48, 192], -1, 1],
  ['ppocr_rec_w80', [1, 3, 48, 80], -1, 1],
  ['ppocr_rec_w320', [1, 3, 48, 320], -1, 1],
  ['ppocr_rec_w1000', [1, 3, 48, 1000], -1, 1],
  ['ppocr_det_320', [1, 3, 320, 320], -2, 2],
  ['ppocr_det_640', [1, 3, 640, 640], -2, 2],
  ['ppocr_det_960x640', [1, 3, 960, 640], -2, 2],
];

const out = process.argv[2] || '.';
fs.mkdirSync(out, { recursive: true });
specs.forEach(([name, shape, lo, hi], i) => {
  const r = rng(1234 + i);
  const n = shape.reduce((a, b) => a * b, 1);
  const d = new Float32Array(n);
  for (let k = 0; k < n; k++) d[k] = lo + (hi - lo) * r();
  npy.write(path.join(out, `${name}.npy`), 'float32', shape, d);
});
console.log(`inputs: ${specs.length} files in ${out}`);
