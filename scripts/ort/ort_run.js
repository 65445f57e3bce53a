// Runs a model with ONNX Runtime (onnxruntime-node) on .npy inputs and writes
// its outputs as .npy, named as `edgeserve run` names them (OUTDIR "-" writes
// nothing). --json prints one line of timings for scripts/bench/bench_vs_ort.sh.
//   node ort_run.js MODEL.onnx OUTDIR [--threads N] [--repeat N] [--warmup N] [--json]
//                   [--opt disabled|basic|extended|all]   (graph optimisation: all by
//                   default; disabled runs a QDQ model's Q and DQ nodes as written)
//                   FILE.npy... | NAME=FILE.npy...
'use strict';
const path = require('path');
const { loadOrt } = require('./common');
const fs = require('fs');
const npy = require('./npy');


async function main() {
  const args = process.argv.slice(2);
  if (args.length < 2) {
    console.error('usage: node ort_run.js MODEL.onnx OUTDIR [--threads N] [--repeat N] INPUTS...');
    process.exit(2);
  }
  const [model, outdir] = args;
  let threads = 1, repeat = 1, warmup = 0, json = false, opt = 'all';
  const files = [];
  for (let i = 2; i < args.length; i++) {
    if (args[i] === '--threads') threads = Number(args[++i]);
    else if (args[i] === '--repeat') repeat = Number(args[++i]);
    else if (args[i] === '--warmup') warmup = Number(args[++i]);
    else if (args[i] === '--json') json = true;
    else if (args[i] === '--opt') opt = args[++i]; // disabled | basic | extended | all
    else files.push(args[i]);
  }
  const ort = loadOrt();
  const sess = await ort.InferenceSession.create(model, {
    intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: opt,
    executionMode: 'sequential', logSeverityLevel: 3,
  });
  const feeds = {};
  files.forEach((f, i) => {
    let name = sess.inputNames[i], file = f;
    const eq = f.indexOf('=');
    if (eq > 0 && !f.endsWith('.npy') || (eq > 0 && sess.inputNames.includes(f.slice(0, eq)))) {
      name = f.slice(0, eq);
      file = f.slice(eq + 1);
    }
    const t = npy.read(file);
    feeds[name] = new ort.Tensor(t.type, t.data, t.shape);
  });
  let res;
  const lat = [];
  for (let r = -warmup; r < repeat; r++) {
    const t0 = process.hrtime.bigint();
    res = await sess.run(feeds);
    if (r >= 0) lat.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  lat.sort((a, b) => a - b);
  if (json) {
    const mem = process.memoryUsage();
    console.log(JSON.stringify({
      median_ms: lat[Math.floor(repeat / 2)], p99_ms: lat[Math.ceil(0.99 * repeat) - 1],
      threads, iters: repeat, rss_bytes: mem.rss,
    }));
    return;
  }
  if (outdir === '-') {
    console.log(`latency ms: median ${lat[Math.floor(repeat / 2)].toFixed(3)} over ${repeat} runs`);
    return;
  }
  fs.mkdirSync(outdir, { recursive: true });
  for (const name of sess.outputNames) {
    const t = res[name];
    const safe = name.replace(/[^A-Za-z0-9._-]/g, '_');
    npy.write(path.join(outdir, `${safe}.npy`), t.type, t.dims, t.data);
    console.log(`output ${name} ${t.type} [${t.dims.join(',')}]`);
  }
  console.log(`latency ms: median ${lat[Math.floor(repeat / 2)].toFixed(3)} over ${repeat} runs`);
}

main().catch(e => { console.error(`ort_run: ${e.message}`); process.exit(1); });
