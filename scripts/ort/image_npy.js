// Turns a binary PPM (P6) image into a float32 NCHW .npy normalised as
// PP-OCR's detector expects: RGB / 255, minus mean (0.485, 0.456, 0.406),
// over std (0.229, 0.224, 0.225). --norm half: minus 0.5, over 0.5 (values in
// [-1, 1]); --nhwc: channels last, as BlazeFace takes them.
//   node image_npy.js IMAGE.ppm OUT.npy [--norm half] [--nhwc]
'use strict';
const fs = require('fs');
const npy = require('./npy');

const [src, dst] = process.argv.slice(2);
const half = process.argv.includes('--norm') && process.argv[process.argv.indexOf('--norm') + 1] === 'half';
const nhwc = process.argv.includes('--nhwc');
const buf = fs.readFileSync(src);
const tokens = [];
let i = 0;
while (tokens.length < 4) {
  while (/\s/.test(String.fromCharCode(buf[i]))) i++;
  if (buf[i] === 0x23) { while (buf[i] !== 0x0a) i++; continue; }
  let t = '';
  while (!/\s/.test(String.fromCharCode(buf[i]))) t += String.fromCharCode(buf[i++]);
  tokens.push(t);
}
i++;
if (tokens[0] !== 'P6' || Number(tokens[3]) !== 255) throw new Error(`${src}: not an 8-bit P6 PPM`);
const w = Number(tokens[1]), h = Number(tokens[2]);
const mean = half ? [0.5, 0.5, 0.5] : [0.485, 0.456, 0.406];
const std = half ? [0.5, 0.5, 0.5] : [0.229, 0.224, 0.225];
const out = new Float32Array(3 * h * w);
for (let y = 0; y < h; y++)
  for (let x = 0; x < w; x++)
    for (let c = 0; c < 3; c++)
      out[nhwc ? (y * w + x) * 3 + c : c * h * w + y * w + x] =
        (buf[i + (y * w + x) * 3 + c] / 255 - mean[c]) / std[c];
npy.write(dst, 'float32', nhwc ? [1, h, w, 3] : [1, 3, h, w], out);
