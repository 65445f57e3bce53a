// Runs one model with ONNX Runtime (onnxruntime-node) on one input .npy and
// writes each output as OUTDIR/PREFIX+NAME.npy, for the detector zoo
// (scripts/zoo/export_detectors.py compares them with PyTorch's).
//
// Why not ort_run.js: a detector's outputs are empty or of a size known only
// after the run, and the checks want the session's load time and the first
// run apart from the later ones (the first run of a model with NonZero and
// Loop allocates what the next ones reuse). One single-threaded session, as
// the rest of the project measures ORT.
//
//   node run_ort.js MODEL.onnx INPUT.npy OUTDIR [--prefix P] [--repeat N] [--threads T] [--json]
//
// Prints each output's type and shape and the times, or with --json one line
// {load_ms, first_ms, median_ms, runs, outputs: {name: {type, shape}}}.
// Exit 1 when ORT refuses the model or the run, 2 on a usage error.
'use strict';
const fs = require('fs');
const path = require('path');
const { loadOrt } = require('../ort/common');
const npy = require('../ort/npy');

function usage(msg) {
  if (msg) console.error(`run_ort: ${msg}`);
  console.error('usage: node run_ort.js MODEL.onnx INPUT.npy OUTDIR [--prefix P] [--repeat N] ' +
    '[--threads T] [--json]');
  process.exit(2);
}

function parse(argv) {
  const o = { prefix: '', repeat: 1, threads: 1, json: false, pos: [] };
  const int = (s, flag) => {
    const n = Number(s);
    if (!Number.isInteger(n) || n < 1) usage(`${flag} wants an integer >= 1, got '${s}'`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--prefix') o.prefix = argv[++i] ?? usage('--prefix wants a value');
    else if (a === '--repeat') o.repeat = int(argv[++i], a);
    else if (a === '--threads') o.threads = int(argv[++i], a);
    else if (a === '--json') o.json = true;
    else if (a.startsWith('--')) usage(`unknown option '${a}'`);
    else o.pos.push(a);
  }
  if (o.pos.length !== 3) usage('wants MODEL.onnx INPUT.npy OUTDIR');
  return o;
}

const now = () => Number(process.hrtime.bigint()) / 1e6;

async function main() {
  const o = parse(process.argv.slice(2));
  const [model, input, outdir] = o.pos;
  const ort = loadOrt();
  const t = npy.read(input);
  let t0 = now();
  const sess = await ort.InferenceSession.create(model, {
    intraOpNumThreads: o.threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
    executionMode: 'sequential', logSeverityLevel: 3,
  });
  const loadMs = now() - t0;
  const feeds = { [sess.inputNames[0]]: new ort.Tensor(t.type, t.data, t.shape) };
  const times = [];
  let res;
  for (let r = 0; r < o.repeat; r++) {
    t0 = now();
    res = await sess.run(feeds);
    times.push(now() - t0);
  }
  fs.mkdirSync(outdir, { recursive: true });
  const outputs = {};
  for (const name of sess.outputNames) {
    const v = res[name];
    const safe = name.replace(/[^A-Za-z0-9._-]/g, '_');
    npy.write(path.join(outdir, `${o.prefix}${safe}.npy`), v.type, v.dims, v.data);
    outputs[name] = { type: v.type, shape: Array.from(v.dims) };
  }
  // The median of the runs after the first (the first alone when there is one).
  const later = times.length > 1 ? times.slice(1) : times;
  const sorted = later.slice().sort((a, b) => a - b);
  const r3 = x => Math.round(x * 1000) / 1000;
  const info = {
    load_ms: r3(loadMs), first_ms: r3(times[0]), median_ms: r3(sorted[Math.floor((sorted.length - 1) / 2)]),
    runs: times.length, outputs,
  };
  if (o.json) {
    console.log(JSON.stringify(info));
    return;
  }
  for (const [name, v] of Object.entries(outputs)) console.log(`output ${name} ${v.type} [${v.shape.join(',')}]`);
  console.log(`load ${info.load_ms} ms, first run ${info.first_ms} ms, median ${info.median_ms} ms ` +
    `(of ${sorted.length})`);
}

main().catch(e => { console.error(`run_ort: ${e.message}`); process.exit(1); });
