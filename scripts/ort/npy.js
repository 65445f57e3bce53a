// Minimal NumPy .npy reader/writer (version 1, little-endian, C order) for
// the ONNX Runtime comparison scripts.
'use strict';
const fs = require('fs');

const DESCR = { '<f4': 'float32', '<i8': 'int64', '<i4': 'int32', '|b1': 'bool', '|u1': 'uint8', '|i1': 'int8' };
const ARRAYS = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array, bool: Uint8Array, uint8: Uint8Array, int8: Int8Array };

function read(path) {
  const buf = fs.readFileSync(path);
  if (buf.readUInt8(0) !== 0x93 || buf.toString('latin1', 1, 6) !== 'NUMPY') throw new Error(`${path}: not a .npy file`);
  const major = buf.readUInt8(6);
  const hlen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = buf.toString('latin1', start, start + hlen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const type = DESCR[descr];
  if (!type) throw new Error(`${path}: unsupported dtype ${descr}`);
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${path}: Fortran order`);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map(s => s.trim()).filter(s => s).map(Number);
  const off = start + hlen;
  const bytes = buf.subarray(off);
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  const Arr = ARRAYS[type];
  return { type, shape, data: new Arr(copy.buffer, 0, copy.byteLength / Arr.BYTES_PER_ELEMENT) };
}

function write(path, type, shape, data) {
  const descr = Object.keys(DESCR).find(k => DESCR[k] === type);
  const shp = shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shp}, }`;
  const pad = (64 - ((10 + header.length + 1) % 64)) % 64;
  header += ' '.repeat(pad) + '\n';
  const pre = Buffer.alloc(10);
  pre.writeUInt8(0x93, 0);
  pre.write('NUMPY', 1, 'latin1');
  pre.writeUInt8(1, 6);
  pre.writeUInt8(0, 7);
  pre.writeUInt16LE(header.length, 8);
  const body = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  fs.writeFileSync(path, Buffer.concat([pre, Buffer.from(header, 'latin1'), body]));
}

module.exports = { read, write };
