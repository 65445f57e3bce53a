// Prints the tables of scripts/bench/bench_runtime.sh from the JSON lines the
// benchmark commands wrote (one line per round); every number is the median
// over the rounds, so one disturbed round on a shared machine does not decide
// a claim.
//   node runtime_table.js streams NAME ES.jsonl NAIVE.jsonl ORT.jsonl [LABEL=FILE.jsonl]...
//       (the extra sets: other precisions, with their own weights and arena)
//   node runtime_table.js lane LANE.jsonl PRIVATE.jsonl ORT.jsonl
//   node runtime_table.js scaling W1.jsonl W2.jsonl
//   node runtime_table.js load LOAD80.jsonl LOAD80_PACED.jsonl LOAD300.jsonl BUDGET
'use strict';
const fs = require('fs');

const MB = 1024 * 1024;
function rows(file) {
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
}
function med(list, key) {
  const v = list.map((j) => (typeof key === 'function' ? key(j) : j[key]))
    .filter((x) => typeof x === 'number' && isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return NaN;
  return v.length % 2 ? v[v.length >> 1] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
}
const f = (x, d = 1) => (isFinite(x) ? x.toFixed(d) : '-');
const pad = (s, n) => String(s).padStart(n);

function streams(name, es, naive, ort, ...extra) {
  const sets = [['edgeserve', rows(es)], ['es --no-share', rows(naive)], ['onnxruntime', rows(ort)]];
  for (const x of extra) {
    const at = x.indexOf('=');
    if (rows(x.slice(at + 1)).length) sets.push([x.slice(0, at), rows(x.slice(at + 1))]);
  }
  console.log(`\n== ${name}: 6 concurrent streams (medians of ${sets[0][1].length} rounds)`);
  console.log(`${'engine'.padEnd(20)} ${pad('req/s', 7)} ${pad('p50 ms', 8)} ${pad('p99 ms', 8)} ` +
    `${pad('peak RSS MB', 11)} ${pad('PSS MB', 8)} ${pad('weights MB', 10)} ${pad('arena MB', 8)}`);
  const peak = {};
  for (const [label, r] of sets) {
    peak[label] = med(r, 'peak_rss_bytes');
    console.log(`${label.padEnd(20)} ${pad(f(med(r, 'throughput_rps')), 7)} ${pad(f(med(r, 'p50_ms')), 8)} ` +
      `${pad(f(med(r, 'p99_ms')), 8)} ${pad(f(peak[label] / MB), 11)} ${pad(f(med(r, 'pss_bytes') / MB), 8)} ` +
      `${pad(f(med(r, 'weights_bytes') / MB, 2), 10)} ${pad(f(med(r, 'planned_arena_bytes') / MB, 2), 8)}`);
  }
  const e = rows(es);
  const w = med(e, 'weights_bytes'), a = med(e, 'planned_arena_bytes');
  const goal = w + 6 * a + 30 * MB;
  console.log(`budget formula weights + 6 x planned arena + 30 MB = ${f(w / MB)} + 6 x ${f(a / MB)} + 30 = ` +
    `${f(goal / MB)} MB; edgeserve peak RSS ${f(peak.edgeserve / MB)} MB ` +
    `(${peak.edgeserve <= goal ? 'within' : 'OVER'}); ratio to ORT ${f(peak.edgeserve / peak.onnxruntime, 3)} ` +
    `(goal <= 0.25); to --no-share ${f(peak.edgeserve / peak['es --no-share'], 3)}`);
}

function lane(l, p, o) {
  const sets = [['lane (shared)', rows(l)], ['private arenas', rows(p)], ['onnxruntime', rows(o)]];
  console.log(`\n== BlazeFace back + det 640 + rec 320 on one lane, frames of the three (medians)`);
  console.log(`${'setup'.padEnd(15)} ${pad('frame p50', 9)} ${pad('p99', 7)} ${pad('scratch MB', 10)} ` +
    `${pad('arenas MB', 9)} ${pad('peak RSS MB', 11)} ${pad('PSS MB', 7)} ${pad('switch ns', 9)}`);
  for (const [label, r] of sets)
    console.log(`${label.padEnd(15)} ${pad(f(med(r, 'frame_p50_ms')), 9)} ${pad(f(med(r, 'frame_p99_ms')), 7)} ` +
      `${pad(f(med(r, 'scratch_bytes') / MB), 10)} ${pad(f(med(r, 'pool_bytes') / MB), 9)} ` +
      `${pad(f(med(r, 'peak_rss_bytes') / MB), 11)} ${pad(f(med(r, 'pss_bytes') / MB), 7)} ` +
      `${pad(f(med(r, 'switch_ns_mean'), 0), 9)}`);
  const r = rows(l);
  console.log(`scratchpad = max of planned arenas ${f(med(r, 'scratch_bytes') / MB, 2)} MB vs their sum ` +
    `${f(med(r, 'sum_planned_bytes') / MB, 2)} MB; switch max ${f(med(r, 'switch_ns_max'), 0)} ns (goal < 50,000)`);
}

function scaling(w1, w2) {
  const a = rows(w1), b = rows(w2);
  const r1 = med(a, 'throughput_rps'), r2 = med(b, 'throughput_rps');
  console.log(`\n== det 640, 2 streams: 1 worker ${f(r1, 2)} req/s (p50 ${f(med(a, 'p50_ms'))} ms), ` +
    `2 workers ${f(r2, 2)} req/s (p50 ${f(med(b, 'p50_ms'))} ms): ${f(r2 / r1, 2)}x (goal >= 1.9)`);
}

function load(l80, l80p, l300, budget) {
  const b = rows(l300);
  console.log(`\n== open loop, det 640, 2 workers (medians)`);
  for (const [label, file] of [['Poisson', l80], ['paced', l80p]]) {
    const a = rows(file);
    console.log(`80% of capacity, ${label} arrivals: ${f(med(a, 'throughput_rps'), 2)} req/s done, ` +
      `p50 ${f(med(a, 'p50_ms'))} ms, p99 ${f(med(a, 'p99_ms'))} ms, ` +
      `p99/p50 ${f(med(a, (j) => j.p99_ms / j.p50_ms), 2)} (goal <= 1.3); ` +
      `run only p50 ${f(med(a, 'run_p50_ms'))} p99 ${f(med(a, 'run_p99_ms'))} ms`);
  }
  const reasons = {};
  for (const j of b) for (const [k, v] of Object.entries(j.refused_by || {})) (reasons[k] = reasons[k] || []).push(v);
  const rs = Object.entries(reasons).map(([k, v]) => `${k} ${med(v.map((x) => ({ x })), 'x')}`).join(', ');
  console.log(`3x capacity: admitted ${med(b, 'admitted')}, refused ${med(b, 'refused')} (${rs}); ` +
    `refusal p99 ${f(med(b, 'refusal_p99_us'))} us, mean retry-after ${f(med(b, 'retry_after_ms_mean'))} ms; ` +
    `admitted p50 ${f(med(b, 'p50_ms'))} p99 ${f(med(b, 'p99_ms'))} ms (run p99 ${f(med(b, 'run_p99_ms'))} ms)`);
  const w = med(b, 'weights_bytes');
  console.log(`peak RSS ${f(med(b, 'peak_rss_bytes') / MB)} MB vs weights ${f(w / MB)} MB + budget ` +
    `${f(Number(budget) / MB)} MB (the rest is code, libraries and the plan; no allocation failed: ` +
    `completed ${med(b, 'requests')})`);
}

const [what, ...args] = process.argv.slice(2);
({ streams, lane, scaling, load })[what](...args);
