// The edge-gateway scenario of BRIEF §1 as a load driver for `edgeserve serve`:
// several camera streams, each sending frames to its model over KServe v2
// HTTP at its own frame rate, for a bounded time, with a live table of what
// each stream gets and what the server processes hold.
//
//   node scripts/demo/scenario.js [--url URL | --port N] [--stream-url STREAM=URL|PORT]...
//        [--streams FILE] [--setup NAME] [--assets DIR] [--duration S] [--warmup N]
//        [--pid PID[,PID...]]... [--budget BYTES] [--fps STREAM=F]... [--timeout-ms MS]
//        [--label TEXT] [--about TEXT] [--out FILE]
//   node scripts/demo/scenario.js --compare SUMMARY.json SUMMARY.json...
//
// Servers: every stream talks to --url (default http://127.0.0.1:8000)
// unless --stream-url maps it to its own server (a URL, or a port on
// 127.0.0.1): that is how one process per stream is driven. --pid names the
// server processes to measure (repeat it, or give a comma list); their
// memory and CPU are summed, and /metrics is read from every server the
// streams use and summed too, so a setup of several processes is compared
// with a single one on the same quantities.
//
// Streams (--streams, default scripts/demo/streams.json): a JSON object
// {"streams": [{"name", "kind", "fps", "priority", "model", and "tensor" or
// "image", optionally "timeout_ms": the request's deadline}]}. model is a served model name, or {"SETUP": name, ...} chosen by
// --setup (default "shared"). priority is the request's KServe/Triton
// parameter (1 highest, absent or 0: the model's own level). A stream sends:
//   "tensor": {"input": "x", "ppm": "cam0.ppm"}   an 8-bit binary PPM turned
//       into a float32 NCHW tensor [1,3,H,W] normalised as PP-OCR's detector
//       wants it (RGB/255, mean 0.485 0.456 0.406, std 0.229 0.224 0.225),
//       sent with the binary tensor extension, binary outputs asked for;
//   "tensor": {"input": "x", "npy": "FILE.npy"}   a float32 .npy as is;
//   "image": {"input": "image", "file": "door.jpg"}   the encoded file as one
//       BYTES element (shape [1], binary extension: 4-byte little-endian
//       length then the bytes), the JSON answer's outputs[0].data[0] read as
//       the pipeline's JSON result (faces or text lines).
// Files are relative to --assets (default .cache/scenario of the repository).
//
// Timing is open loop, as a camera: stream i's frame k is due at
// t0 + phase_i + k/fps. A due frame is sent when the stream has nothing in
// flight, otherwise it is dropped and counted as skipped (a camera does not
// queue frames; neither does it wait for Retry-After: the next frame is sent
// when it is due). Each stream has its own keep-alive connection. Before the
// clock starts, every stream sends --warmup requests (default 2) one after
// the other, not counted, so plans and first runs are out of the numbers. A
// model the server does not serve (404 at GET /v2/models/NAME/ready or at
// infer) marks its stream "unavailable"; the others go on.
//
// Every second the table is redrawn (cleared on a terminal, reprinted
// otherwise): per stream target fps, achieved fps (200 answers in the last
// second and over the run), p50/p99 latency of the 200s (send to last byte
// of the answer, whole run), frames sent and skipped, refusals (429 and 503,
// with the last Retry-After) and errors, and the last result (and the
// server's port when there are several). Below it, the server: VmRSS and
// VmHWM from /proc/PID/status (--pid) against the budget (--budget, else the
// servers' edgeserve_admission_budget_bytes), and from GET /metrics the
// admission's reserved bytes, the distinct weight bytes, the queued and
// admitted requests; the server's CPU (/proc/PID/stat, cores used in the
// last second) and the driver's own (it shares the machine). With several
// processes these are sums, and one more line gives each process's RSS.
//
// At the end one JSON line goes to --out (to stdout when --out is absent):
// per stream and per kind (streams of one kind pooled) fps, p50, p99,
// refusals, errors, skipped; the server's peak RSS (VmHWM and the highest
// sample), PSS and RSS from /proc/PID/smaps_rollup at the end, the peak of
// reserved bytes and queue depth, the CPU cores the server and the driver
// used on average. With several processes: the sum of the VmHWMs (each
// process's own peak; an upper bound of the peak of the sum), the highest
// sampled sum of RSS, the sums of PSS and RSS at the end (PSS splits the
// pages processes share, such as the binary and the libraries, between
// them, so it is the fair sum), the summed CPU, and each process's numbers
// under server.processes.
//
// --compare prints summaries side by side, one column per setup, with BRIEF
// §1's quantities: resident memory (VmHWM, highest RSS while streaming, PSS;
// summed over a setup's processes), latency per stream kind, fps achieved vs
// target, refusals, server CPU, and each setup's memory relative to the
// first; then a legend (each summary's --about).
// Node 20, no dependencies. Exit 0 when the run finished (whatever the
// streams got), 2 on usage errors, 1 when the server cannot be reached.
'use strict';
const fs = require('fs');
const path = require('path');
const http = require('http');
const os = require('os');

const ROOT = path.join(__dirname, '..', '..');
const USAGE =
  'usage: node scripts/demo/scenario.js [--url URL | --port N] [--streams FILE] [--setup NAME] [--assets DIR]\n' +
  '         [--stream-url STREAM=URL|PORT]... [--duration S] [--warmup N] [--pid PID[,PID...]]...\n' +
  '         [--budget BYTES] [--fps STREAM=F]... [--timeout-ms MS] [--label TEXT] [--about TEXT] [--out FILE]\n' +
  '       node scripts/demo/scenario.js --compare SUMMARY.json SUMMARY.json...';

function usage(msg) {
  if (msg) process.stderr.write(`scenario: ${msg}\n`);
  process.stderr.write(USAGE + '\n');
  process.exit(2);
}

function bytesOf(s) {
  const m = /^(\d+(?:\.\d+)?)\s*([KMG]?)i?B?$/i.exec(String(s));
  if (!m) return NaN;
  const mul = { '': 1, K: 1024, M: 1024 ** 2, G: 1024 ** 3 }[m[2].toUpperCase()];
  return Math.round(Number(m[1]) * mul);
}

function parseArgs(argv) {
  const o = {
    url: 'http://127.0.0.1:8000', streams: path.join(ROOT, 'scripts', 'demo', 'streams.json'),
    setup: 'shared', assets: path.join(ROOT, '.cache', 'scenario'), duration: 30, warmup: 2,
    streamUrl: {}, pids: [], budget: 0, fps: {}, timeoutMs: 10000, out: null, label: null, about: null,
    compare: null,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    const num = (min) => {
      const x = Number(v());
      if (!Number.isFinite(x) || x < min) usage(`${a} wants a number >= ${min}`);
      return x;
    };
    switch (a) {
      case '--url': o.url = v().replace(/\/+$/, ''); break;
      case '--port': o.url = `http://127.0.0.1:${num(1)}`; break;
      case '--streams': o.streams = v(); break;
      case '--setup': o.setup = v(); break;
      case '--assets': o.assets = v(); break;
      case '--duration': o.duration = num(1); break;
      case '--warmup': o.warmup = Math.floor(num(0)); break;
      case '--stream-url': {
        const s = v(), eq = s.indexOf('=');
        const u = s.slice(eq + 1);
        if (eq < 1 || !u) usage(`--stream-url wants STREAM=URL or STREAM=PORT, got '${s}'`);
        o.streamUrl[s.slice(0, eq)] = /^\d+$/.test(u) ? `http://127.0.0.1:${u}` : u.replace(/\/+$/, '');
        break;
      }
      case '--pid':
        for (const p of v().split(',')) {
          const n = Number(p);
          if (!Number.isInteger(n) || n < 1) usage(`--pid wants process ids, got '${p}'`);
          if (!o.pids.includes(n)) o.pids.push(n);
        }
        break;
      case '--budget': {
        const s = v();
        o.budget = bytesOf(s);
        if (!Number.isFinite(o.budget)) usage(`--budget wants BYTES (K/M/G suffixes), got '${s}'`);
        break;
      }
      case '--fps': {
        const s = v(), eq = s.indexOf('=');
        const f = Number(s.slice(eq + 1));
        if (eq < 1 || !(f > 0)) usage(`--fps wants STREAM=F with F > 0, got '${s}'`);
        o.fps[s.slice(0, eq)] = f;
        break;
      }
      case '--timeout-ms': o.timeoutMs = num(1); break;
      case '--out': o.out = v(); break;
      case '--label': o.label = v(); break;
      case '--about': o.about = v(); break;
      case '--compare': o.compare = argv.slice(i + 1); i = argv.length; break;
      case '-h': case '--help': process.stdout.write(USAGE + '\n'); process.exit(0); break;
      default: usage(`unknown option '${a}'`);
    }
  }
  if (o.compare && o.compare.length < 1) usage('--compare needs summary files');
  return o;
}

// ---- request bodies ------------------------------------------------------------

function readPpm(file) {
  const buf = fs.readFileSync(file);
  const tok = [];
  let i = 0;
  const ws = (c) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
  while (tok.length < 4) {
    while (i < buf.length && ws(buf[i])) i++;
    if (buf[i] === 0x23) { while (i < buf.length && buf[i] !== 0x0a) i++; continue; }
    let t = '';
    while (i < buf.length && !ws(buf[i])) t += String.fromCharCode(buf[i++]);
    if (!t) throw new Error(`${file}: truncated PPM header`);
    tok.push(t);
  }
  i++;
  if (tok[0] !== 'P6' || Number(tok[3]) !== 255) throw new Error(`${file}: not an 8-bit binary PPM (P6)`);
  const w = Number(tok[1]), h = Number(tok[2]);
  if (buf.length - i < w * h * 3) throw new Error(`${file}: truncated pixel data`);
  return { w, h, px: buf.subarray(i, i + w * h * 3) };
}

function detTensor(file) {
  const { w, h, px } = readPpm(file);
  const mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225];
  const out = new Float32Array(3 * h * w);
  for (let c = 0; c < 3; c++) {
    const base = c * h * w;
    for (let p = 0; p < h * w; p++) out[base + p] = (px[p * 3 + c] / 255 - mean[c]) / std[c];
  }
  return { shape: [1, 3, h, w], data: Buffer.from(out.buffer) };
}

function npyTensor(file) {
  const buf = fs.readFileSync(file);
  if (buf[0] !== 0x93 || buf.toString('latin1', 1, 6) !== 'NUMPY') throw new Error(`${file}: not a .npy file`);
  const major = buf[6];
  const hlen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = buf.toString('latin1', start, start + hlen);
  if (!/'descr':\s*'<f4'/.test(header)) throw new Error(`${file}: only float32 .npy files are sent`);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim()).filter((s) => s).map(Number);
  return { shape, data: buf.subarray(start + hlen) };
}

// The whole body (JSON header + binary data) and the header's length.
function buildBody(st, assets) {
  const params = {};
  if (st.priority) params.priority = st.priority;
  if (st.timeout_ms) params.timeout = Math.round(st.timeout_ms * 1000); /* KServe's, in us: a deadline */
  if (st.tensor) {
    const t = st.tensor;
    const file = path.resolve(assets, t.ppm || t.npy);
    const { shape, data } = t.ppm ? detTensor(file) : npyTensor(file);
    const header = {
      inputs: [{ name: t.input, shape, datatype: 'FP32', parameters: { binary_data_size: data.length } }],
      parameters: { ...params, binary_data_output: true },
    };
    const hb = Buffer.from(JSON.stringify(header));
    return { body: Buffer.concat([hb, data]), hlen: hb.length, what: `${shape.join('x')} FP32` };
  }
  if (st.image) {
    const file = path.resolve(assets, st.image.file);
    const img = fs.readFileSync(file);
    const len = Buffer.alloc(4);
    len.writeUInt32LE(img.length, 0);
    const header = {
      inputs: [{ name: st.image.input || 'image', shape: [1], datatype: 'BYTES',
                 parameters: { binary_data_size: 4 + img.length } }],
    };
    if (Object.keys(params).length) header.parameters = params;
    const hb = Buffer.from(JSON.stringify(header));
    return { body: Buffer.concat([hb, len, img]), hlen: hb.length,
             what: `${path.basename(file)} ${(img.length / 1024).toFixed(0)} KiB` };
  }
  throw new Error(`stream ${st.name}: needs "tensor" or "image"`);
}

// ---- answers -------------------------------------------------------------------

// A short description of a 200 answer, and whether it looks right.
function describe(st, res, buf) {
  const hl = res.headers['inference-header-content-length'];
  let head, rest = null;
  if (hl !== undefined) {
    const n = Number(hl);
    head = JSON.parse(buf.toString('utf8', 0, n));
    rest = buf.subarray(n);
  } else {
    head = JSON.parse(buf.toString('utf8'));
  }
  const out = (head.outputs || [])[0];
  if (!out) return 'no outputs';
  if (st.tensor) {
    // det's probability map: the share of pixels above PP-OCR's 0.3 threshold
    const n = out.parameters && out.parameters.binary_data_size;
    if (rest && n && out.datatype === 'FP32') {
      const f = new Float32Array(rest.buffer.slice(rest.byteOffset, rest.byteOffset + n));
      let hot = 0;
      for (let i = 0; i < f.length; i++) if (f[i] > 0.3) hot++;
      return `${out.shape.join('x')} text ${(100 * hot / f.length).toFixed(1)}%`;
    }
    return `${out.name} ${(out.shape || []).join('x')}`;
  }
  let s;
  if (Array.isArray(out.data)) s = out.data[0];
  else if (rest) {
    const len = rest.readUInt32LE(0);
    s = rest.toString('utf8', 4, 4 + len);
  }
  let j;
  try { j = JSON.parse(s); } catch { return `result not JSON: ${String(s).slice(0, 40)}`; }
  if (Array.isArray(j.faces)) {
    if (!j.faces.length) return '0 faces';
    return `${j.faces.length} face${j.faces.length > 1 ? 's' : ''} ${Number(j.faces[0].score).toFixed(2)}`;
  }
  if (Array.isArray(j.lines)) {
    if (!j.lines.length) return 'no text';
    return j.lines.map((l) => `"${l.text}" ${Number(l.confidence).toFixed(2)}`).join(' ').slice(0, 40);
  }
  return JSON.stringify(j).slice(0, 40);
}

function errorText(buf) {
  try { return String(JSON.parse(buf.toString('utf8')).error || '').slice(0, 60); } catch { return buf.toString('utf8', 0, 60); }
}

// ---- HTTP ------------------------------------------------------------------------

function request(agent, url, method, p, headers, body, timeoutMs) {
  return new Promise((resolve) => {
    const u = new URL(url + p);
    const req = http.request({ agent, hostname: u.hostname, port: u.port, path: u.pathname, method, headers });
    let done = false;
    const finish = (r) => { if (!done) { done = true; resolve(r); } };
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer in ${timeoutMs} ms`)));
    req.on('error', (e) => finish({ status: 0, error: e.code || e.message }));
    req.on('response', (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => finish({ status: res.statusCode, res, buf: Buffer.concat(chunks) }));
      res.on('error', (e) => finish({ status: 0, error: e.code || e.message }));
    });
    req.end(body);
  });
}

// ---- statistics ------------------------------------------------------------------

function pct(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))];
}

function procStatus(pid) {
  try {
    const t = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (k) => { const m = new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(t); return m ? Number(m[1]) * 1024 : null; };
    return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
  } catch { return null; }
}

// CPU seconds the process has used (utime + stime; USER_HZ is 100 on Linux).
function procCpu(pid) {
  try {
    const t = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = t.slice(t.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch { return null; }
}

function smapsRollup(pid) {
  try {
    const t = fs.readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
    const kb = (k) => { const m = new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(t); return m ? Number(m[1]) * 1024 : null; };
    return { rss: kb('Rss'), pss: kb('Pss') };
  } catch { return null; }
}

function parseMetrics(text) {
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const r = /^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!r) continue;
    const v = Number(r[3]);
    (m[r[1]] = m[r[1]] || []).push({ labels: r[2] || '', v });
  }
  const one = (k) => (m[k] ? m[k][0].v : null);
  const sum = (k) => (m[k] ? m[k].reduce((a, x) => a + x.v, 0) : null);
  return {
    reserved: one('edgeserve_admission_reserved_bytes'),
    budget: one('edgeserve_admission_budget_bytes'),
    weights: one('edgeserve_weights_bytes'),
    queued: sum('edgeserve_queue_depth'),
    inflight: one('edgeserve_inflight_requests'),
    running: one('edgeserve_running_requests'),
    rss: one('edgeserve_process_resident_bytes'),
  };
}

const MiB = (b) => (b === null || b === undefined ? '-' : (b / 1048576).toFixed(1));
const ms = (x) => (x === null || x === undefined ? '-' : x < 10 ? x.toFixed(2) : x.toFixed(1));

// ---- the run ---------------------------------------------------------------------

class Stream {
  constructor(def, o, index, count) {
    this.def = def;
    this.name = def.name;
    this.kind = def.kind || 'other';
    this.fps = o.fps[def.name] || def.fps;
    const m = def.model;
    this.model = typeof m === 'string' ? m : m && (m[o.setup] || m.default);
    if (!this.model) throw new Error(`stream ${def.name}: no model for setup '${o.setup}'`);
    this.url = o.streamUrl[def.name] || o.url;
    this.phase = (index / count) * (1000 / this.fps); // ms: cameras are not in step
    this.agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    this.built = buildBody(def, o.assets);
    this.headers = {
      'Content-Type': 'application/octet-stream',
      'Inference-Header-Content-Length': String(this.built.hlen),
      'Content-Length': String(this.built.body.length),
    };
    this.unavailable = null;
    this.inflight = false;
    this.sent = 0; this.skipped = 0; this.ok = 0;
    this.r429 = 0; this.r503 = 0; this.retryAfter = null;
    this.errors = 0; this.lastError = null; this.lastRefusal = null; this.last = '';
    this.lat = []; this.okTimes = [];
  }

  async send(o, counted) {
    this.inflight = true;
    const t = process.hrtime.bigint();
    const r = await request(this.agent, this.url, 'POST', `/v2/models/${encodeURIComponent(this.model)}/infer`,
                            this.headers, this.built.body, o.timeoutMs);
    const lat = Number(process.hrtime.bigint() - t) / 1e6;
    this.inflight = false;
    if (r.status === 404) {
      this.unavailable = `404: ${errorText(r.buf)}`;
      return r;
    }
    if (!counted) return r;
    if (r.status === 200) {
      this.ok++;
      this.lat.push(lat);
      this.okTimes.push(Date.now());
      try { this.last = describe(this.def, r.res, r.buf); } catch (e) { this.last = `bad answer: ${e.message}`; }
    } else if (r.status === 429 || r.status === 503) {
      if (r.status === 429) this.r429++; else this.r503++;
      this.lastRefusal = `${r.status}: ${errorText(r.buf)}`;
      const ra = r.res.headers['retry-after'];
      if (ra !== undefined) this.retryAfter = ra;
    } else {
      this.errors++;
      this.lastError = r.status ? `${r.status}: ${errorText(r.buf)}` : r.error;
    }
    return r;
  }
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  if (o.compare) return compare(o.compare);

  let spec;
  try { spec = JSON.parse(fs.readFileSync(o.streams, 'utf8')); } catch (e) { usage(`--streams ${o.streams}: ${e.message}`); }
  const defs = spec.streams || [];
  for (const n of Object.keys(o.fps)) if (!defs.some((d) => d.name === n)) usage(`--fps: no stream '${n}' in ${o.streams}`);
  for (const n of Object.keys(o.streamUrl)) if (!defs.some((d) => d.name === n)) usage(`--stream-url: no stream '${n}' in ${o.streams}`);
  let streams;
  try { streams = defs.map((d, i) => new Stream(d, o, i, defs.length)); } catch (e) {
    process.stderr.write(`scenario: ${e.message}\n`);
    process.exit(2);
  }
  // The servers the streams use (one, or one per stream with --stream-url).
  const urls = [...new Set(streams.map((s) => s.url))];
  const side = new http.Agent({ keepAlive: true, maxSockets: 2 });
  const get = (url, p) => request(side, url, 'GET', p, {}, undefined, 5000);

  for (const u of urls) {
    const ready = await get(u, '/v2/health/ready');
    if (ready.status !== 200) {
      process.stderr.write(`scenario: ${u}/v2/health/ready: ${ready.status || ready.error}\n`);
      process.exit(1);
    }
  }
  await Promise.all(streams.map(async (s) => {
    const r = await get(s.url, `/v2/models/${encodeURIComponent(s.model)}/ready`);
    if (r.status !== 200) s.unavailable = r.status === 404 ? 'not served (404)' : `not ready (${r.status || r.error})`;
  }));
  // Warm-up: not counted; a model that answers 404 here is unavailable too.
  await Promise.all(streams.map(async (s) => {
    for (let i = 0; i < o.warmup && !s.unavailable; i++) {
      const r = await s.send(o, false);
      if (r.status !== 200 && r.status !== 404) { s.lastError = r.status ? `warm-up ${r.status}: ${errorText(r.buf)}` : r.error; break; }
    }
  }));

  // Sums over the servers' metrics and the processes; null when nothing is known.
  // (allOf: null unless every one is known, for the end numbers.)
  const sumOf = (xs) => (xs.some((x) => x !== null && x !== undefined) ? xs.reduce((a, x) => a + (x ?? 0), 0) : null);
  const allOf = (xs) => (xs.length && xs.every((x) => x !== null && x !== undefined) ? xs.reduce((a, x) => a + x, 0) : null);
  const srv = { hwm: null, rssMax: null, reservedMax: null, queuedMax: null, weights: null, budget: o.budget || null };
  const procs = o.pids.map((pid) => ({
    pid, status: null, hwm: null, rssMax: null, cpuSec: null, cpuAt: 0, cpuLast: null, cpu0: null, roll: null, cpuCores: null,
  }));
  let metrics = {};
  let status = null;
  let cpuLast = null;
  const sample = async () => {
    const all = await Promise.all(urls.map(async (u) => {
      const r = await get(u, '/metrics');
      return r.status === 200 ? parseMetrics(r.buf.toString('utf8')) : {};
    }));
    metrics = {};
    for (const k of ['reserved', 'budget', 'weights', 'queued', 'inflight', 'running', 'rss']) metrics[k] = sumOf(all.map((m) => m[k]));
    const now = Date.now();
    for (const p of procs) {
      p.status = procStatus(p.pid);
      if (p.status && p.status.rss !== null) p.rssMax = Math.max(p.rssMax || 0, p.status.rss);
      if (p.status && p.status.hwm !== null) p.hwm = Math.max(p.hwm || 0, p.status.hwm); // kept if it exits
      const c = procCpu(p.pid);
      if (c !== null && p.cpuAt) p.cpuLast = (c - p.cpuSec) / ((now - p.cpuAt) / 1000);
      if (c !== null) { p.cpuSec = c; p.cpuAt = now; }
    }
    status = procs.some((p) => p.status)
      ? { rss: sumOf(procs.map((p) => p.status && p.status.rss)), hwm: sumOf(procs.map((p) => p.hwm)) }
      : null;
    cpuLast = sumOf(procs.map((p) => p.cpuLast));
    const rss = status ? status.rss : metrics.rss;
    if (rss !== null && rss !== undefined) srv.rssMax = Math.max(srv.rssMax || 0, rss);
    if (status && status.hwm !== null) srv.hwm = status.hwm;
    if (metrics.reserved !== null) srv.reservedMax = Math.max(srv.reservedMax || 0, metrics.reserved);
    if (metrics.queued !== null) srv.queuedMax = Math.max(srv.queuedMax || 0, metrics.queued);
    if (metrics.weights !== null) srv.weights = metrics.weights;
    if (!o.budget && metrics.budget) srv.budget = metrics.budget;
  };
  await sample();

  const t0 = Date.now() + 50;
  const cpu0 = { at: 0, driver: process.cpuUsage() };
  setTimeout(() => {
    for (const p of procs) p.cpu0 = procCpu(p.pid);
    cpu0.at = Date.now();
  }, Math.max(0, t0 - Date.now()));
  // CPU cores a process used on average since t0 (null when it cannot be read).
  const avgCpu = (p, now) => {
    const c = p.cpu0 === null ? null : procCpu(p.pid);
    return c === null ? null : (c - p.cpu0) / ((now - cpu0.at) / 1000);
  };
  const tEnd = t0 + o.duration * 1000;
  const label = o.label || o.setup;
  const tty = process.stdout.isTTY;
  const many = procs.length > 1 || urls.length > 1;
  const port = (u) => { try { return `:${new URL(u).port}`; } catch { return u; } };

  const draw = (final) => {
    const now = Date.now();
    const el = Math.max(0, Math.min(now, tEnd) - t0) / 1000;
    const L = [];
    const where = urls.length > 1 ? `${urls.length} servers (${urls.map(port).join(' ')})` : urls[0];
    const pids = procs.length > 1 ? `  server pids ${procs.map((p) => p.pid).join(' ')}` : procs.length ? `  server pid ${procs[0].pid}` : '';
    L.push(`scenario '${label}' on ${where}  ${final ? 'done' : 'running'}: ${el.toFixed(0)}/${o.duration} s${pids}`);
    const hdr = ['stream', 'model', 'target', 'fps 1s', 'fps all', 'p50 ms', 'p99 ms', 'sent', 'skipped', '429', '503', 'retry-after', 'errors', 'last result'];
    if (urls.length > 1) hdr.splice(2, 0, 'server');
    const rows = streams.map((s) => {
      const sorted = s.lat.slice().sort((a, b) => a - b);
      const last1 = s.okTimes.filter((t) => t > now - 1000).length;
      const r = s.unavailable
        ? [s.name, s.model, s.fps.toFixed(0), '-', '-', '-', '-', '-', '-', '-', '-', '-', '-', `unavailable: ${s.unavailable}`.slice(0, 60)]
        : [s.name, s.model, String(s.fps), final ? '-' : String(last1), el > 0 ? (s.ok / el).toFixed(1) : '-',
           ms(pct(sorted, 0.5)), ms(pct(sorted, 0.99)), String(s.sent), String(s.skipped), String(s.r429), String(s.r503),
           s.retryAfter === null ? '-' : `${s.retryAfter} s`, String(s.errors),
           (s.errors && s.lastError ? `ERR ${s.lastError}` : s.last || s.lastError || (s.lastRefusal ? `refused ${s.lastRefusal}` : '')).slice(0, 60)];
      if (urls.length > 1) r.splice(2, 0, port(s.url));
      return r;
    });
    const w = hdr.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
    const fmt = (r) => r.map((c, i) => (i < 2 || i === r.length - 1 ? c.padEnd(w[i]) : c.padStart(w[i]))).join('  ');
    L.push(fmt(hdr));
    for (const r of rows) L.push(fmt(r));
    const rss = status ? status.rss : metrics.rss;
    const share = srv.budget && rss ? ` (${(100 * rss / srv.budget).toFixed(0)}% of it)` : '';
    const who = procs.length > 1 ? `servers (${procs.length} processes, summed)` : urls.length > 1 ? `servers (${urls.length}, summed)` : 'server';
    L.push(`${who}: RSS ${MiB(rss)} MiB, peak ${MiB(srv.hwm !== null ? srv.hwm : srv.rssMax)} MiB` +
           `${procs.length ? ' (VmHWM)' : ''}; budget ${srv.budget ? MiB(srv.budget) + ' MiB' : 'none'}${share}`);
    if (procs.length > 1) {
      L.push('        per process RSS/VmHWM MiB: ' +
             procs.map((p) => `${p.pid} ${p.status ? `${MiB(p.status.rss)}/${MiB(p.status.hwm)}` : 'gone'}`).join(', '));
    }
    const drv = process.cpuUsage(cpu0.driver);
    const span = Math.max(1e-3, (Math.min(now, tEnd) - t0) / 1000);
    let srvCpu = cpuLast === null ? '-' : `${cpuLast.toFixed(2)} cores (last second)`;
    if (final && procs.length && cpu0.at) {
      const c = sumOf(procs.map((p) => avgCpu(p, now)));
      if (c !== null) srvCpu = `${c.toFixed(2)} cores (average)`;
    }
    L.push(`        CPU: server${many ? 's' : ''} ${srvCpu}, ` +
           `driver ${((drv.user + drv.system) / 1e6 / span).toFixed(2)} cores (average); machine ${os.availableParallelism()} cores`);
    L.push(`        admission reserved ${MiB(metrics.reserved)} MiB (peak ${MiB(srv.reservedMax)}), weights ${MiB(metrics.weights)} MiB, ` +
           `queued ${metrics.queued ?? '-'} (peak ${srv.queuedMax ?? '-'}), admitted ${metrics.inflight ?? '-'}, running ${metrics.running ?? '-'}`);
    const text = L.join('\n') + '\n';
    if (tty && !final) process.stdout.write('\x1b[H\x1b[2J' + text);
    else process.stdout.write(text + '\n');
  };

  // The cameras.
  const tick = (s, k) => {
    const now = Date.now();
    if (now >= tEnd || s.unavailable) return;
    // frames that fell due while the event loop was busy count as skipped
    const due = Math.floor((now - t0 - s.phase) * s.fps / 1000);
    if (due > k) { s.skipped += due - k; k = due; }
    if (s.inflight) s.skipped++;
    else { s.sent++; s.send(o, true); }
    const next = t0 + s.phase + (k + 1) * 1000 / s.fps;
    setTimeout(() => tick(s, k + 1), Math.max(0, next - Date.now()));
  };
  for (const s of streams) setTimeout(() => tick(s, 0), Math.max(0, t0 + s.phase - Date.now()));

  await new Promise((resolve) => {
    const every = setInterval(async () => {
      await sample();
      if (Date.now() >= tEnd) { clearInterval(every); resolve(); return; }
      draw(false);
    }, 1000);
  });
  // Let the last requests finish (their answers count), then the final table.
  const stop = Date.now() + o.timeoutMs;
  while (streams.some((s) => s.inflight) && Date.now() < stop) await new Promise((r) => setTimeout(r, 20));
  await sample();
  const endAt = Date.now();
  for (const p of procs) {
    p.roll = smapsRollup(p.pid);
    p.cpuCores = cpu0.at ? avgCpu(p, endAt) : null;
  }
  const drvCpu = process.cpuUsage(cpu0.driver);
  const cpuSpan = (endAt - (cpu0.at || t0)) / 1000;
  if (tty) process.stdout.write('\x1b[H\x1b[2J');
  draw(true);

  const dur = o.duration;
  const perStream = streams.map((s) => {
    const sorted = s.lat.slice().sort((a, b) => a - b);
    return {
      name: s.name, kind: s.kind, model: s.model, target_fps: s.fps, unavailable: s.unavailable,
      fps: s.unavailable ? 0 : +(s.ok / dur).toFixed(2), ok: s.ok, sent: s.sent, skipped: s.skipped,
      refused: s.r429 + s.r503, refused_429: s.r429, refused_503: s.r503, retry_after: s.retryAfter,
      errors: s.errors, last_error: s.lastError, last_refusal: s.lastRefusal, p50_ms: pct(sorted, 0.5), p99_ms: pct(sorted, 0.99), last: s.last,
    };
  });
  const kinds = {};
  for (const s of streams) {
    const k = kinds[s.kind] || (kinds[s.kind] = { streams: 0, available: 0, target_fps: 0, fps: 0, lat: [], refused: 0, errors: 0, skipped: 0 });
    k.streams++;
    k.target_fps += s.fps;
    if (s.unavailable) continue;
    k.available++;
    k.fps += s.ok / dur;
    k.lat.push(...s.lat);
    k.refused += s.r429 + s.r503;
    k.errors += s.errors;
    k.skipped += s.skipped;
  }
  for (const k of Object.values(kinds)) {
    const sorted = k.lat.sort((a, b) => a - b);
    k.p50_ms = pct(sorted, 0.5);
    k.p99_ms = pct(sorted, 0.99);
    k.fps = +k.fps.toFixed(2);
    delete k.lat;
  }
  const summary = {
    setup: o.setup, label, about: o.about, url: urls.length === 1 ? urls[0] : null, urls, duration_s: dur, warmup: o.warmup,
    streams: perStream, kinds,
    // sums over the processes (and the servers' metrics) when there are several
    server: {
      pid: procs.length === 1 ? procs[0].pid : null, pids: procs.map((p) => p.pid),
      vmhwm_bytes: srv.hwm, rss_peak_sampled_bytes: srv.rssMax,
      rss_end_bytes: allOf(procs.map((p) => p.roll && p.roll.rss)), pss_end_bytes: allOf(procs.map((p) => p.roll && p.roll.pss)),
      budget_bytes: srv.budget, weights_bytes: srv.weights, reserved_peak_bytes: srv.reservedMax,
      queued_peak: srv.queuedMax,
      cpu_cores: allOf(procs.map((p) => p.cpuCores)) === null ? null : +allOf(procs.map((p) => p.cpuCores)).toFixed(3),
      processes: procs.map((p) => ({
        pid: p.pid, vmhwm_bytes: p.hwm, rss_peak_sampled_bytes: p.rssMax,
        rss_end_bytes: p.roll ? p.roll.rss : null, pss_end_bytes: p.roll ? p.roll.pss : null,
        cpu_cores: p.cpuCores === null ? null : +p.cpuCores.toFixed(3),
      })),
    },
    driver_cpu_cores: +((drvCpu.user + drvCpu.system) / 1e6 / cpuSpan).toFixed(3),
    machine_cores: os.availableParallelism(),
  };
  const line = JSON.stringify(summary) + '\n';
  if (o.out) fs.writeFileSync(o.out, line);
  else process.stdout.write(line);
  for (const s of streams) s.agent.destroy();
  side.destroy();
}

// ---- side by side ------------------------------------------------------------------

function compare(files) {
  const runs = files.map((f) => JSON.parse(fs.readFileSync(f, 'utf8')));
  const kinds = [];
  for (const r of runs) for (const k of Object.keys(r.kinds)) if (!kinds.includes(k)) kinds.push(k);
  const name = (r) => r.label || r.setup;
  const peak = (r) => r.server.vmhwm_bytes ?? r.server.rss_peak_sampled_bytes;
  const vsFirst = (r, i, v) => (i > 0 && v && v(runs[0]) && v(r) ? ` (${(v(r) / v(runs[0])).toFixed(2)}x)` : '');
  const mem = (v) => (r, i) => (v(r) ? `${MiB(v(r))} MiB${vsFirst(r, i, v)}` : '-');
  const kind = (k, f) => (r) => {
    const x = r.kinds[k];
    return !x ? '-' : !x.available ? 'unavailable' : f(x);
  };
  const tot = (r, f) => Object.values(r.kinds).reduce((a, x) => a + (x[f] || 0), 0);
  const nproc = (r) => (r.server.pids ? r.server.pids.length : r.server.pid ? 1 : 0);
  const rows = [
    ['server processes', (r) => (nproc(r) ? String(nproc(r)) : '-')],
    ['resident memory: peak RSS (VmHWM)', mem(peak)],
    ['  highest RSS while streaming', mem((r) => r.server.rss_peak_sampled_bytes)],
    ['  PSS after the run', mem((r) => r.server.pss_end_bytes)],
    ['  distinct weights (metrics)', mem((r) => r.server.weights_bytes)],
  ];
  for (const k of kinds) {
    const n = Math.max(...runs.map((r) => (r.kinds[k] ? r.kinds[k].streams : 0)));
    rows.push([`${k} latency p50 / p99 (${n} stream${n > 1 ? 's' : ''})`, kind(k, (x) => `${ms(x.p50_ms)} / ${ms(x.p99_ms)} ms`)]);
  }
  for (const k of kinds) rows.push([`${k} fps achieved / target`, kind(k, (x) => `${x.fps.toFixed(1)} / ${x.target_fps}`)]);
  rows.push(['refused (429+503) / errors', (r) => `${tot(r, 'refused')} / ${tot(r, 'errors')}`]);
  rows.push(['frames skipped (stream busy)', (r) => String(tot(r, 'skipped'))]);
  rows.push(['server CPU (cores)', (r) => (r.server.cpu_cores === null || r.server.cpu_cores === undefined ? '-' : r.server.cpu_cores.toFixed(2))]);
  const hdr = ['', ...runs.map(name)];
  const body = rows.map(([label, f]) => [label, ...runs.map((r, i) => f(r, i))]);
  const w = hdr.map((h, i) => Math.max(h.length, ...body.map((r) => r[i].length)));
  const line = (r) => '| ' + r.map((c, i) => (i ? c.padStart(w[i]) : c.padEnd(w[i]))).join(' | ') + ' |';
  const out = [line(hdr), '|' + w.map((n, i) => (i ? '-'.repeat(n + 1) + ':' : '-'.repeat(n + 2))).join('|') + '|', ...body.map(line)];
  const a = runs[0], pa = peak(a);
  for (const r of runs.slice(1)) {
    const p = peak(r);
    if (!p || !pa) continue;
    /* naive and procs are the setups without sharing; others (int8) share too */
    const unshared = r.setup === 'naive' || r.setup === 'procs';
    const pss = a.server.pss_end_bytes && r.server.pss_end_bytes
      ? `; PSS ${MiB(a.server.pss_end_bytes)} vs ${MiB(r.server.pss_end_bytes)} MiB` +
        (unshared ? `, ${(100 * (1 - a.server.pss_end_bytes / r.server.pss_end_bytes)).toFixed(0)}% less` : '')
      : '';
    const what = unshared
      ? `sharing saves ${(100 * (1 - pa / p)).toFixed(0)}%`
      : `${name(r)} takes ${Math.abs(100 * (1 - p / pa)).toFixed(0)}% ${p <= pa ? 'less' : 'more'}`;
    out.push(`memory: ${name(a)} ${MiB(pa)} MiB at its peak vs ${name(r)} ${MiB(p)} MiB: ` +
             `${(p / pa).toFixed(2)}x, ${what}${pss}.`);
  }
  for (const r of runs) if (r.about) out.push(`${name(r)}: ${r.about}`);
  const unavailable = [];
  for (const r of runs) for (const s of r.streams) if (s.unavailable) unavailable.push(`${name(r)}/${s.name} (${s.model}): ${s.unavailable}`);
  if (unavailable.length) out.push('unavailable streams: ' + unavailable.join('; '));
  out.push(`Same streams, ${runs.map((r) => `${r.duration_s} s`).join(' / ')}; latency: request sent to the last byte of ` +
           'the answer, 200s only, streams of a kind pooled; fps: 200 answers per second, streams of a kind summed; ' +
           'VmHWM includes loading the models, the highest RSS while streaming is from 1 s samples; ' +
           'with several processes, memory and CPU are sums over them (VmHWM: of each one\'s own peak; ' +
           'PSS splits the pages they share), and so are the weights.');
  process.stdout.write(out.join('\n') + '\n');
}

main().catch((e) => {
  process.stderr.write(`scenario: ${e.stack || e}\n`);
  process.exit(1);
});
