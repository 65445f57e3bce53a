// Structured inputs for the classifiers' accuracy checks: N pictures made
// from real images (PPM, P6) by random crops (10-100% of the area, any
// aspect between 3:4 and 4:3), flips, quarter turns, brightness and
// contrast jitter and a little noise, resized (bilinear) to SIZE x SIZE,
// normalised as torchvision's classifiers expect (ImageNet mean and std),
// written as float32 NCHW .npy batches of BATCH. Deterministic for a seed.
//   node augment.js OUTDIR N BATCH SIZE SEED IMAGE.ppm...
'use strict';
const fs = require('fs');
const path = require('path');
const npy = require('../ort/npy');

const [out, nArg, bArg, sArg, seedArg, ...imgs] = process.argv.slice(2);
const N = Number(nArg), B = Number(bArg), S = Number(sArg);
let seed = Number(seedArg) >>> 0 || 1;
const rnd = () => { // xorshift32
  seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
};
function readPpm(file) {
  const buf = fs.readFileSync(file);
  const tok = [];
  let i = 0;
  while (tok.length < 4) {
    while (/\s/.test(String.fromCharCode(buf[i]))) i++;
    if (buf[i] === 0x23) { while (buf[i] !== 0x0a) i++; continue; }
    let t = '';
    while (!/\s/.test(String.fromCharCode(buf[i]))) t += String.fromCharCode(buf[i++]);
    tok.push(t);
  }
  if (tok[0] !== 'P6' || tok[3] !== '255') throw new Error(`${file}: not an 8-bit P6 PPM`);
  return { w: Number(tok[1]), h: Number(tok[2]), px: buf.subarray(i + 1) };
}
const src = imgs.map(readPpm);
const mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225];
fs.mkdirSync(out, { recursive: true });
let batch = new Float32Array(B * 3 * S * S), inBatch = 0, file = 0;
for (let n = 0; n < N; n++) {
  const im = src[n % src.length];
  const area = im.w * im.h * (0.1 + 0.9 * rnd()), ar = 0.75 + 0.58 * rnd();
  const cw = Math.min(im.w, Math.sqrt(area * ar)), ch = Math.min(im.h, Math.sqrt(area / ar));
  const x0 = rnd() * (im.w - cw), y0 = rnd() * (im.h - ch);
  const flip = rnd() < 0.5, turn = Math.floor(rnd() * 4);
  const gain = 0.6 + 0.8 * rnd(), bias = (rnd() - 0.5) * 60, noise = 8 * rnd();
  const base = inBatch * 3 * S * S;
  for (let y = 0; y < S; y++)
    for (let x = 0; x < S; x++) {
      let u = x, v = y;
      for (let t = 0; t < turn; t++) [u, v] = [S - 1 - v, u];
      if (flip) u = S - 1 - u;
      const fx = x0 + (u + 0.5) * cw / S - 0.5, fy = y0 + (v + 0.5) * ch / S - 0.5;
      const ix = Math.max(0, Math.min(im.w - 2, Math.floor(fx))), iy = Math.max(0, Math.min(im.h - 2, Math.floor(fy)));
      const ax = Math.min(1, Math.max(0, fx - ix)), ay = Math.min(1, Math.max(0, fy - iy));
      for (let c = 0; c < 3; c++) {
        const p = (yy, xx) => im.px[(yy * im.w + xx) * 3 + c];
        const val = (1 - ay) * ((1 - ax) * p(iy, ix) + ax * p(iy, ix + 1)) + ay * ((1 - ax) * p(iy + 1, ix) + ax * p(iy + 1, ix + 1));
        const j = Math.max(0, Math.min(255, (val - 128) * gain + 128 + bias + (rnd() - 0.5) * noise));
        batch[base + (c * S + y) * S + x] = (j / 255 - mean[c]) / std[c];
      }
    }
  if (++inBatch === B || n === N - 1) {
    npy.write(path.join(out, `${String(file++).padStart(4, '0')}.npy`), 'float32', [inBatch, 3, S, S],
              inBatch === B ? batch : batch.subarray(0, inBatch * 3 * S * S));
    batch = new Float32Array(B * 3 * S * S);
    inBatch = 0;
  }
}
