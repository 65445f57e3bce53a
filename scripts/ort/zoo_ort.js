// ONNX Runtime's side of the model zoo (tests/e2e/test_zoo.sh and
// scripts/bench/bench_vs_ort.sh --zoo). One model, one process:
//
//   outputs: one session runs each input file and writes its outputs as .npy
//   into the folder given before it, named as `edgeserve run` names them
//   (session creation is most of ORT's time on small inputs, so the shapes of
//   a model share one);
//     node zoo_ort.js MODEL.onnx --out DIR FILE.npy [--out DIR FILE.npy]...
//
//   bench: load time, median and p99 of ITERS single-threaded runs after
//   WARMUP, and the RSS growth of a second session on the same model, taken
//   the way bench_streams.js takes it: after each session's warm-up runs,
//   since a session reaches its steady footprint only after two (the first
//   grows the arena, the second allocates the memory-pattern buffers). The
//   second session is made after the first is warm, so its growth is the
//   marginal cost of one more stream without one-time runtime setup.
//     node zoo_ort.js MODEL.onnx --bench FILE.npy [--iters N] [--warmup K] [--threads T] [--json]
//
// Inputs are bound in the model's input order. Exit 1 when ORT refuses the
// model or a run (message on stderr), 2 on a usage error.
'use strict';
const fs = require('fs');
const path = require('path');
const { loadOrt, rss, pct } = require('./common');
const npy = require('./npy');

function usage(msg) {
  if (msg) console.error(`zoo_ort: ${msg}`);
  console.error('usage: node zoo_ort.js MODEL.onnx --out DIR FILE.npy [--out DIR FILE.npy]...\n' +
    '       node zoo_ort.js MODEL.onnx --bench FILE.npy [--iters N] [--warmup K] [--threads T] [--json]');
  process.exit(2);
}

function parse(argv) {
  const o = { model: argv[0], cases: [], bench: null, iters: 20, warmup: 2, threads: 1, json: false };
  if (!o.model || o.model.startsWith('-')) usage('no model given');
  const int = (s, flag, min) => {
    const n = Number(s);
    if (!Number.isInteger(n) || n < min) usage(`${flag} wants an integer >= ${min}, got '${s}'`);
    return n;
  };
  for (let i = 1; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--out') {
      if (i + 2 >= argv.length) usage('--out wants DIR FILE.npy');
      o.cases.push({ dir: argv[i + 1], file: argv[i + 2] });
      i += 2;
    } else if (a === '--bench') {
      if (i + 1 >= argv.length) usage('--bench wants FILE.npy');
      o.bench = argv[++i];
    } else if (a === '--iters') o.iters = int(argv[++i], a, 1);
    else if (a === '--warmup') o.warmup = int(argv[++i], a, 2);
    else if (a === '--threads') o.threads = int(argv[++i], a, 1);
    else if (a === '--json') o.json = true;
    else usage(`unknown argument '${a}'`);
  }
  if (!o.bench && o.cases.length === 0) usage('nothing to do (--out or --bench)');
  return o;
}

const opts = parse(process.argv.slice(2));
const ort = loadOrt();
const sessOpts = {
  intraOpNumThreads: opts.threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
  executionMode: 'sequential', logSeverityLevel: 3,
};
const now = () => Number(process.hrtime.bigint()) / 1e6;

function feedsOf(sess, file) {
  const t = npy.read(file);
  return { [sess.inputNames[0]]: new ort.Tensor(t.type, t.data, t.shape) };
}

async function outputs() {
  const sess = await ort.InferenceSession.create(opts.model, sessOpts);
  for (const c of opts.cases) {
    const t0 = now();
    const res = await sess.run(feedsOf(sess, c.file));
    const ms = now() - t0;
    fs.mkdirSync(c.dir, { recursive: true });
    for (const name of sess.outputNames) {
      const t = res[name];
      npy.write(path.join(c.dir, `${name.replace(/[^A-Za-z0-9._-]/g, '_')}.npy`), t.type, t.dims, t.data);
    }
    console.log(`${c.dir}: ${sess.outputNames.map(n => `${n} [${res[n].dims.join(',')}]`).join(' ')} ` +
      `${ms.toFixed(3)} ms`);
  }
}

async function bench() {
  // Input first, so its bytes are not counted as session memory.
  const data = npy.read(opts.bench);
  const base = rss();
  const t0 = now();
  const a = await ort.InferenceSession.create(opts.model, sessOpts);
  const loadMs = now() - t0;
  const feeds = { [a.inputNames[0]]: new ort.Tensor(data.type, data.data, data.shape) };
  for (let k = 0; k < opts.warmup; k++) await a.run(feeds);
  const one = rss();
  const b = await ort.InferenceSession.create(opts.model, sessOpts);
  for (let k = 0; k < opts.warmup; k++) await b.run(feeds);
  const two = rss();
  const lat = [];
  for (let r = 0; r < opts.iters; r++) {
    const s = now();
    await a.run(feeds);
    lat.push(now() - s);
  }
  const r = {
    engine: 'onnxruntime', model: path.basename(opts.model), threads: opts.threads,
    iters: opts.iters, median_ms: pct(lat, 0.5), p99_ms: pct(lat, 0.99),
    load_ms: Number(loadMs.toFixed(3)),
    rss_first_session_bytes: one - base, rss_extra_session_bytes: two - one,
  };
  if (opts.json) console.log(JSON.stringify(r));
  else {
    const mib = x => `${(x / 1048576).toFixed(1)} MiB`;
    console.log(`${r.model}: median ${r.median_ms.toFixed(3)} ms, p99 ${r.p99_ms.toFixed(3)} ms ` +
      `over ${r.iters} runs; load ${r.load_ms.toFixed(1)} ms; RSS first session ` +
      `${mib(r.rss_first_session_bytes)}, each extra ${mib(r.rss_extra_session_bytes)}`);
  }
}

(opts.bench ? bench() : outputs()).catch(e => {
  console.error(`zoo_ort: ${String(e.message).split('\n')[0]}`);
  process.exit(1);
});
