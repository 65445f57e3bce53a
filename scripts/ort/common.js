// Helpers shared by the ONNX Runtime companions (ort_run.js, bench_streams.js,
// bench_frames.js): where onnxruntime-node is installed, how memory is read
// from /proc, and one percentile definition, so that every ORT number is
// measured the way the edgeserve side measures its own.
'use strict';
const path = require('path');
const fs = require('fs');

// onnxruntime-node from $ES_ORT_DIR or the project's cache (scripts/setup/install-ort.sh).
function loadOrt() {
  const dirs = [process.env.ES_ORT_DIR, path.join(__dirname, '../../.cache/ort/node_modules')];
  for (const d of dirs) {
    if (!d) continue;
    try { return require(path.join(d, 'onnxruntime-node')); } catch (e) { /* next */ }
  }
  throw new Error('onnxruntime-node is not installed: run scripts/setup/install-ort.sh');
}

// Value in bytes of a "Key:   N kB" line of a /proc file, or null.
function procKb(file, key) {
  let text;
  try { text = fs.readFileSync(file, 'latin1'); } catch (e) { return null; }
  const m = new RegExp(`^${key}:\\s+(\\d+)\\s+kB`, 'm').exec(text);
  return m ? Number(m[1]) * 1024 : null;
}
const rss = () => procKb('/proc/self/status', 'VmRSS');

// Nearest-rank percentile (sorts a copy); null for no values.
function pct(values, q) {
  if (values.length === 0) return null;
  const s = values.slice().sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}

module.exports = { loadOrt, procKb, rss, pct };
