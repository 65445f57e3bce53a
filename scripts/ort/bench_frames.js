// The frame loop of `edgeserve bench-lane` with ONNX Runtime (onnxruntime-node),
// for the third column of the shared-lane comparison (BRIEF §6).
//
// Why: bench-lane runs several models one after another per camera frame on
// one lane (a face detector, a text detector, a text recogniser) and reports
// frame latency and memory with a shared scratchpad or private arenas. The
// question for ONNX Runtime is the same: what does a frame cost and how much
// memory does a process holding one session per model take? So this is the
// straightforward deployment: one InferenceSession per model in one process,
// one intra-op thread each (bench-lane's one worker), and a frame runs the
// models in the order given, awaiting each (onnxruntime-node runs Run() on the
// JS main thread anyway, so sessions never overlap). Frame latency is the
// first run's start to the last run's end; per-model time is each awaited
// run. Numbers use the same nearest-rank percentiles and the same JSON keys as
// bench-lane where they apply.
//
// Memory: RSS before any session exists (inputs already read, so they are not
// counted as session memory), peak RSS as the larger of VmHWM and a 50 ms
// sampler (the kernel refreshes VmHWM lazily, so memory given back by madvise
// can leave a peak it never saw; the sampler only fires between runs because
// runs block the main thread), RSS and PSS at the end.
//
//   node bench_frames.js --model FILE.onnx --input FILE.npy|NAME=FILE.npy
//                        [--model FILE.onnx --input ...]... [--frames N] [--warmup K] [--json]
// Each --input belongs to the --model before it (a model with several inputs
// takes several --input, by name or in the model's input order).
'use strict';
const path = require('path');
const { loadOrt, procKb, rss, pct } = require('./common');
const fs = require('fs');
const npy = require('./npy');

const USAGE = 'usage: node bench_frames.js --model FILE.onnx --input FILE.npy|NAME=FILE.npy ' +
  '[--model FILE.onnx --input ...]... [--frames N] [--warmup K] [--json]';

function usage(msg) {
  if (msg) console.error(`bench_frames: ${msg}`);
  console.error(USAGE);
  process.exit(2);
}

function fail(msg, code) {
  console.error(`bench_frames: ${msg}`);
  process.exit(code);
}

function parseArgs(argv) {
  const o = { models: [], frames: 100, warmup: 3, json: false };
  const value = (i, flag) => {
    if (i >= argv.length) usage(`${flag} needs a value`);
    return argv[i];
  };
  const int = (s, flag, min) => {
    const n = Number(s);
    if (!Number.isInteger(n) || n < min || n > 1000000) usage(`${flag} must be an integer in ${min}..1000000, got '${s}'`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--model') o.models.push({ file: value(++i, a), inputs: [] });
    else if (a === '--input') {
      const v = value(++i, a);
      if (o.models.length === 0) usage(`--input ${v} comes before any --model`);
      o.models[o.models.length - 1].inputs.push(v);
    } else if (a === '--frames') o.frames = int(value(++i, a), a, 1);
    else if (a === '--warmup') o.warmup = int(value(++i, a), a, 0);
    else if (a === '--json') o.json = true;
    else if (a === '-h' || a === '--help') { console.log(USAGE); process.exit(0); }
    else usage(`unknown argument '${a}'`);
  }
  if (o.models.length === 0) usage('no --model given');
  for (const m of o.models) if (m.inputs.length === 0) usage(`no --input for ${m.file}`);
  return o;
}




// Registry-style name as bench-lane makes it: base name without .onnx/.esm,
// made unique with "#INDEX".
function modelNames(models) {
  const names = [];
  models.forEach((m, i) => {
    let n = path.basename(m.file).replace(/\.(onnx|esm)$/, '');
    if (names.includes(n)) n = `${n}#${i}`;
    names.push(n);
  });
  return names;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const names = modelNames(opts.models);
  for (const m of opts.models) {
    if (!fs.existsSync(m.file) || !fs.statSync(m.file).isFile()) fail(`model not found: ${m.file}`, 2);
  }
  const ort = loadOrt();
  const sessOpts = {
    intraOpNumThreads: 1, interOpNumThreads: 1, graphOptimizationLevel: 'all',
    executionMode: 'sequential', logSeverityLevel: 3,
  };

  // Read the inputs before the baseline so their data is not counted as
  // session memory; bound to input names once each session gives its order.
  const specs = opts.models.map(m => m.inputs.map(s => {
    const eq = s.indexOf('=');
    let sp = eq > 0 ? { name: s.slice(0, eq), file: s.slice(eq + 1) } : { name: null, file: s };
    // A bare path that itself contains '=' is taken as a file if it exists.
    if (sp.name !== null && !fs.existsSync(sp.file) && fs.existsSync(s)) sp = { name: null, file: s };
    if (!fs.existsSync(sp.file)) fail(`input file not found: ${sp.file}`, 2);
    try { sp.data = npy.read(sp.file); } catch (e) { fail(`cannot read input ${sp.file}: ${e.message}`, 2); }
    return sp;
  }));

  const baseline = rss();
  let maxSample = baseline || 0;
  const sample = () => {
    const v = rss();
    if (v !== null && v > maxSample) maxSample = v;
    return v;
  };
  const sampler = setInterval(sample, 50);

  const t_load = process.hrtime.bigint();
  const sessions = [];
  for (const m of opts.models) {
    try {
      sessions.push(await ort.InferenceSession.create(m.file, sessOpts));
    } catch (e) {
      fail(`cannot load model ${m.file}: ${e.message}`, 1);
    }
  }
  const loadMs = Number(process.hrtime.bigint() - t_load) / 1e6;

  const feeds = sessions.map((s, k) => {
    const inNames = s.inputNames, f = {};
    let pos = 0;
    for (const sp of specs[k]) {
      let name = sp.name;
      if (name === null) {
        while (pos < inNames.length && Object.prototype.hasOwnProperty.call(f, inNames[pos])) pos++;
        if (pos >= inNames.length) fail(`${opts.models[k].file}: too many inputs (it has ${inNames.join(', ')})`, 2);
        name = inNames[pos++];
      } else if (!inNames.includes(name)) {
        fail(`${opts.models[k].file} has no input '${name}' (inputs: ${inNames.join(', ')})`, 2);
      }
      if (Object.prototype.hasOwnProperty.call(f, name)) fail(`${opts.models[k].file}: input '${name}' given twice`, 2);
      f[name] = new ort.Tensor(sp.data.type, sp.data.data, sp.data.shape);
    }
    const missing = inNames.filter(n => !Object.prototype.hasOwnProperty.call(f, n));
    if (missing.length) fail(`${opts.models[k].file}: missing input(s) ${missing.join(', ')}`, 2);
    return f;
  });

  const frameMs = [];
  const runMs = sessions.map(() => []);
  for (let f = -opts.warmup; f < opts.frames; f++) {
    const t0 = process.hrtime.bigint();
    let tEnd = t0;
    for (let k = 0; k < sessions.length; k++) {
      const a = process.hrtime.bigint();
      try {
        await sessions[k].run(feeds[k]);
      } catch (e) {
        fail(`${names[k]}: run failed: ${e.message}`, 1);
      }
      tEnd = process.hrtime.bigint();
      if (f >= 0) runMs[k].push(Number(tEnd - a) / 1e6);
    }
    if (f >= 0) frameMs.push(Number(tEnd - t0) / 1e6);
  }
  clearInterval(sampler);
  const rssEnd = sample();

  const ms = x => (x === null ? null : Number(x.toFixed(3)));
  const runP50 = {};
  names.forEach((n, k) => { runP50[n] = ms(pct(runMs[k], 0.5)); });
  const r = {
    engine: 'onnxruntime',
    mode: 'sessions',
    models: names,
    frames: opts.frames,
    warmup: opts.warmup,
    frame_p50_ms: ms(pct(frameMs, 0.5)),
    frame_p99_ms: ms(pct(frameMs, 0.99)),
    frame_max_ms: ms(pct(frameMs, 1)),
    run_p50_ms: runP50,
    load_ms: Number(loadMs.toFixed(1)),
    baseline_rss_bytes: baseline,
    peak_rss_bytes: Math.max(procKb('/proc/self/status', 'VmHWM') || 0, maxSample) || null,
    rss_bytes: rssEnd,
    pss_bytes: procKb('/proc/self/smaps_rollup', 'Pss'),
  };
  if (opts.json) {
    console.log(JSON.stringify(r));
    return;
  }
  const mib = b => (b === null ? 'n/a' : `${(b / 1048576).toFixed(1)} MiB`);
  console.log(`bench_frames: ${names.length} model(s), one ONNX Runtime session each, 1 intra-op thread; ` +
    `${opts.frames} frames after ${opts.warmup} warm-up`);
  console.log(`frame latency ms: p50 ${r.frame_p50_ms}  p99 ${r.frame_p99_ms}  max ${r.frame_max_ms}`);
  for (const n of names) console.log(`  ${n.padEnd(24)} run p50 ms ${runP50[n]}`);
  console.log(`load ${r.load_ms} ms`);
  console.log(`memory: baseline RSS ${mib(baseline)}, peak RSS ${mib(r.peak_rss_bytes)}, ` +
    `RSS ${mib(r.rss_bytes)}, PSS ${mib(r.pss_bytes)}`);
}

main().catch(e => fail(e.message, 1));
