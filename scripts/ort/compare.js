// Compares two folders of .npy outputs: for every file in A, the same name
// in B. Prints max abs error and the output's range; exits 1 when the error
// exceeds the tolerance: atol for probability outputs (values in [0, 1]),
// rtol x range otherwise.
//   node compare.js DIR_A DIR_B [--tol 1e-3]
'use strict';
const fs = require('fs');
const path = require('path');
const npy = require('./npy');

const [a, b] = process.argv.slice(2, 4);
let tol = 1e-3;
const ti = process.argv.indexOf('--tol');
if (ti > 0) tol = Number(process.argv[ti + 1]);
let bad = 0, n = 0;
for (const f of fs.readdirSync(a).filter(f => f.endsWith('.npy')).sort()) {
  const x = npy.read(path.join(a, f));
  if (!fs.existsSync(path.join(b, f))) { console.log(`${f}: missing in ${b}`); bad++; continue; }
  const y = npy.read(path.join(b, f));
  n++;
  if (x.shape.join(',') !== y.shape.join(',') || x.type !== y.type) {
    console.log(`${f}: shape/type ${x.type}[${x.shape}] vs ${y.type}[${y.shape}]`);
    bad++;
    continue;
  }
  let maxerr = 0, lo = Infinity, hi = -Infinity;
  for (let i = 0; i < x.data.length; i++) {
    const u = Number(x.data[i]), v = Number(y.data[i]);
    const e = Math.abs(u - v);
    if (!(e <= maxerr)) maxerr = e; // NaN counts as error
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const prob = lo >= 0 && hi <= 1;
  const range = hi - lo;
  const limit = prob ? tol : tol * Math.max(range, 1e-12);
  const ok = maxerr <= limit;
  if (!ok) bad++;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${f}: max abs err ${maxerr.toExponential(3)}, range [${lo.toPrecision(4)}, ${hi.toPrecision(4)}], limit ${limit.toExponential(2)} (${prob ? 'probability' : 'relative to range'})`);
}
if (n === 0) { console.log('compare: no outputs compared'); process.exit(1); }
process.exit(bad ? 1 : 0);
