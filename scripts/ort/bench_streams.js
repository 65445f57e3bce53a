// Measures ONNX Runtime (onnxruntime-node) serving N concurrent streams of one
// model the way a naive deployment does it: one InferenceSession per stream,
// all in one Node process. Each stream runs a closed loop (submit a run on its
// own session, await it, repeat) for a fixed duration; latencies of all
// streams are pooled. Besides throughput and latency it reports memory: the
// RSS before any session exists, the RSS growth per session (each session
// holds its own copy of the weights, its own optimized graph and its own
// arena, which is what sharing one model across streams would avoid), the
// peak RSS (VmHWM) and the PSS at the end. The per-session growth is taken
// after the warm-up runs because a session only reaches its steady-state
// footprint after two runs (the first grows the arena, the second allocates
// the memory-pattern buffers), so --warmup below 2 under-reports it. With one
// stream the figure also includes one-time runtime setup; the marginal cost of
// an extra stream is best read from two runs with different N.
//
// Concurrency note: onnxruntime-node's InferenceSession.run() defers with
// setImmediate() and then calls the native Run() synchronously on the main JS
// thread. It uses neither the libuv threadpool nor threads of its own (other
// than the intra-op pool when --threads > 1), so runs of different sessions do
// NOT overlap: the N streams take turns and a process uses about
// `threads` cores whatever N is. UV_THREADPOOL_SIZE is still set below (it is
// harmless and would matter if the binding ever moved Run() to the pool); the
// CPU use printed in the summary shows whether runs overlapped. Because the
// main thread is blocked during a run, the 50 ms RSS sampler only fires
// between runs. The peak reported is the larger of VmHWM and the largest
// sample: the kernel refreshes VmHWM lazily (on unmap), so memory released by
// madvise (allocator trims, V8 GC) can leave a peak that VmHWM never saw.
//
//   node bench_streams.js MODEL.onnx --concurrency N [--input NAME=FILE.npy | FILE.npy]...
//                         [--threads T] [--duration SECONDS] [--warmup K] [--json]
'use strict';
const path = require('path');
const { loadOrt, procKb, rss, pct } = require('./common');
const fs = require('fs');

const USAGE = 'usage: node bench_streams.js MODEL.onnx --concurrency N ' +
  '[--input NAME=FILE.npy | FILE.npy]... [--threads T] [--duration SECONDS] [--warmup K] [--json]';

function usage(msg) {
  if (msg) console.error(`bench_streams: ${msg}`);
  console.error(USAGE);
  process.exit(2);
}

function parseArgs(argv) {
  const o = { model: null, concurrency: null, threads: 1, duration: 10, warmup: 2, json: false, inputs: [] };
  const value = (i, flag) => {
    if (i >= argv.length) usage(`${flag} needs a value`);
    return argv[i];
  };
  const int = (s, flag, min) => {
    const n = Number(s);
    if (!Number.isInteger(n) || n < min) usage(`${flag} must be an integer >= ${min}, got '${s}'`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--concurrency' || a === '-c') o.concurrency = int(value(++i, a), a, 1);
    else if (a === '--threads') o.threads = int(value(++i, a), a, 1);
    else if (a === '--warmup') o.warmup = int(value(++i, a), a, 0);
    else if (a === '--duration') {
      const s = value(++i, a);
      o.duration = Number(s);
      if (!(o.duration > 0) || !Number.isFinite(o.duration)) usage(`--duration must be a number > 0, got '${s}'`);
    } else if (a === '--input') o.inputs.push(value(++i, a));
    else if (a === '--json') o.json = true;
    else if (a === '-h' || a === '--help') { console.log(USAGE); process.exit(0); }
    else if (a.startsWith('-')) usage(`unknown option ${a}`);
    else if (o.model === null) o.model = a;
    else o.inputs.push(a);
  }
  if (o.model === null) usage('no model given');
  if (o.concurrency === null) usage('--concurrency N is required');
  if (o.inputs.length === 0) usage('no inputs given (--input NAME=FILE.npy or FILE.npy in model input order)');
  return o;
}

const opts = parseArgs(process.argv.slice(2));
// First statement after parsing argv: libuv reads this when its threadpool
// starts, which has not happened yet (nothing async has run). See the
// concurrency note above: onnxruntime-node does not use this pool for Run().
if (!process.env.UV_THREADPOOL_SIZE) process.env.UV_THREADPOOL_SIZE = String(Math.max(4, opts.concurrency));

const npy = require('./npy');




function fail(msg, code) {
  console.error(`bench_streams: ${msg}`);
  process.exit(code);
}

async function main() {
  if (!fs.existsSync(opts.model)) fail(`model not found: ${opts.model}`, 2);
  if (!fs.statSync(opts.model).isFile()) fail(`model is not a file: ${opts.model}`, 2);
  const ort = loadOrt();
  const sessOpts = {
    intraOpNumThreads: opts.threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
    executionMode: 'sequential', logSeverityLevel: 3,
  };
  const N = opts.concurrency;

  // Read (and check) the input files before the baseline so the input data is
  // not counted as session memory; they are bound to input names once the
  // first session gives the model's input order.
  const specs = opts.inputs.map(s => {
    const eq = s.indexOf('=');
    return eq > 0 ? { name: s.slice(0, eq), file: s.slice(eq + 1), raw: s } : { name: null, file: s, raw: s };
  });
  const data = specs.map(sp => {
    // A bare path that itself contains '=' is taken as a file if it exists.
    if (sp.name !== null && !fs.existsSync(sp.file) && fs.existsSync(sp.raw)) {
      sp.name = null;
      sp.file = sp.raw;
    }
    if (!fs.existsSync(sp.file)) fail(`input file not found: ${sp.file}`, 2);
    try { return npy.read(sp.file); } catch (e) { return fail(`cannot read input ${sp.file}: ${e.message}`, 2); }
  });

  const baseline = rss();
  const sessions = [];
  for (let i = 0; i < N; i++) {
    try {
      sessions.push(await ort.InferenceSession.create(opts.model, sessOpts));
    } catch (e) {
      fail(`cannot load model ${opts.model}: ${e.message}`, 1);
    }
  }

  const names = sessions[0].inputNames;
  const feeds = {};
  let pos = 0;
  specs.forEach((sp, i) => {
    let name = sp.name;
    if (name === null) {
      while (pos < names.length && Object.prototype.hasOwnProperty.call(feeds, names[pos])) pos++;
      if (pos >= names.length) fail(`too many inputs: the model has ${names.length} (${names.join(', ')})`, 2);
      name = names[pos++];
    } else if (!names.includes(name)) {
      fail(`the model has no input '${name}' (inputs: ${names.join(', ')})`, 2);
    }
    if (Object.prototype.hasOwnProperty.call(feeds, name)) fail(`input '${name}' given twice`, 2);
    const t = data[i];
    feeds[name] = new ort.Tensor(t.type, t.data, t.shape);
  });
  const missing = names.filter(n => !Object.prototype.hasOwnProperty.call(feeds, n));
  if (missing.length) fail(`missing input(s): ${missing.join(', ')} (model inputs: ${names.join(', ')})`, 2);

  for (const s of sessions) {
    for (let k = 0; k < opts.warmup; k++) {
      try { await s.run(feeds); } catch (e) { fail(`run failed: ${e.message}`, 1); }
    }
  }
  const rssLoaded = rss();

  // Timed phase.
  let nSamples = 0, maxSample = 0;
  const sample = () => {
    const v = rss();
    nSamples++;
    if (v !== null && v > maxSample) maxSample = v;
    return v;
  };
  const sampler = setInterval(sample, 50);
  const lat = [];
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  const deadline = t0 + BigInt(Math.round(opts.duration * 1e9));
  await Promise.all(sessions.map(async s => {
    while (process.hrtime.bigint() < deadline) {
      const a = process.hrtime.bigint();
      await s.run(feeds);
      lat.push(Number(process.hrtime.bigint() - a) / 1e6);
    }
  }));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  clearInterval(sampler);
  const rssEnd = sample();

  lat.sort((a, b) => a - b);
  const ms = x => (x === null ? null : Number(x.toFixed(3)));
  const r = {
    engine: 'onnxruntime',
    model: path.basename(opts.model),
    concurrency: N,
    threads: opts.threads,
    requests: lat.length,
    seconds: Number(seconds.toFixed(3)),
    throughput_rps: Number((lat.length / seconds).toFixed(3)),
    p50_ms: ms(pct(lat, 0.5)),
    p99_ms: ms(pct(lat, 0.99)),
    max_ms: ms(pct(lat, 1)),
    peak_rss_bytes: Math.max(procKb('/proc/self/status', 'VmHWM') || 0, maxSample) || null,
    rss_bytes: rssEnd,
    pss_bytes: procKb('/proc/self/smaps_rollup', 'Pss'),
    baseline_rss_bytes: baseline,
    rss_per_session_bytes: Math.round((rssLoaded - baseline) / N),
  };
  if (opts.json) {
    console.log(JSON.stringify(r));
    return;
  }
  const mib = b => (b === null ? 'n/a' : `${(b / 1048576).toFixed(1)} MiB`);
  const cores = (cpu.user + cpu.system) / 1e6 / seconds;
  console.log(`${r.model}: ${N} stream(s), one session each, ${r.threads} intra-op thread(s)`);
  console.log(`  requests ${r.requests} in ${r.seconds} s: ${r.throughput_rps} req/s`);
  console.log(`  latency ms: p50 ${r.p50_ms}  p99 ${r.p99_ms}  max ${r.max_ms}`);
  console.log(`  cpu: ${cores.toFixed(2)} cores busy on average (runs overlap only if this exceeds ${r.threads})`);
  console.log(`  rss: baseline ${mib(r.baseline_rss_bytes)}, loaded ${mib(rssLoaded)}, ` +
    `end ${mib(r.rss_bytes)}, peak ${mib(r.peak_rss_bytes)} (max of ${nSamples} samples ${mib(maxSample)})`);
  console.log(`  pss ${mib(r.pss_bytes)}; rss growth per session ${mib(r.rss_per_session_bytes)}`);
}

main().catch(e => { console.error(`bench_streams: ${e.message}`); process.exit(1); });
