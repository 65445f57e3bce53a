// Builds a KServe v2 binary-extension request body from .npy files:
// the JSON inference header followed by the raw little-endian tensor bytes
// of every input (parameters.binary_data_size set on each), asking for
// binary outputs too (parameters.binary_data_output), so that neither side
// of the exchange is dominated by JSON number text.
//   node make_v2_body.js OUT.bin NAME=FILE.npy [NAME=FILE.npy ...]
// Writes OUT.bin and OUT.bin.hlen (the JSON header's length in bytes, the
// value of the Inference-Header-Content-Length request header) and prints
// "body BYTES header HLEN" on stdout.
'use strict';
const fs = require('fs');
const npy = require('./npy');

const DTYPES = { float32: 'FP32', int64: 'INT64', int32: 'INT32', bool: 'BOOL', uint8: 'UINT8' };

const [out, ...specs] = process.argv.slice(2);
if (!out || specs.length === 0 || specs.some(s => !s.includes('='))) {
  console.error('usage: node make_v2_body.js OUT.bin NAME=FILE.npy [NAME=FILE.npy ...]');
  process.exit(2);
}
const inputs = [];
const parts = [];
for (const s of specs) {
  const eq = s.indexOf('=');
  const name = s.slice(0, eq), file = s.slice(eq + 1);
  const a = npy.read(file);
  const bytes = Buffer.from(a.data.buffer, a.data.byteOffset, a.data.byteLength);
  inputs.push({ name, shape: a.shape, datatype: DTYPES[a.type],
                parameters: { binary_data_size: bytes.length } });
  parts.push(bytes);
}
const header = Buffer.from(JSON.stringify({ inputs, parameters: { binary_data_output: true } }));
const body = Buffer.concat([header, ...parts]);
fs.writeFileSync(out, body);
fs.writeFileSync(`${out}.hlen`, `${header.length}\n`);
console.log(`body ${body.length} header ${header.length}`);
