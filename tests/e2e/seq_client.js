// Sequences over KServe v2 (tests/e2e/test_server_sequence.sh): a stateful
// LSTM (tests/e2e/seq_model.c: x [T, 1, 8], states h0/c0 -> hn/cn of
// [1, 1, 16]) streamed in chunks by many interleaved sequences against one
// whole-sequence run of each.
//
//   node seq_client.js stream URL MODEL --sequences N --chunks C --chunk T
//       [--first ID]
//     For each sequence s (its own input, seeded by s): one request with the
//     whole sequence (C*T steps, h0 and c0 zeros, no sequence_id), then the
//     same input in C chunks of T steps as sequence FIRST+s (start on the
//     first chunk, end on the last; only x sent). The sequences run at once,
//     each waiting for its previous answer. Prints one JSON line: {"ok",
//     "requests", "statuses": {...}, "max_diff": of y chunk by chunk and hn,
//     cn at the end against the whole run}. Exit 0 whatever the result (the
//     caller checks it), 2 on usage or transport errors.
//   node seq_client.js load URL MODEL --streams N --steps S --seconds T
//       [--abandon P] [--first ID] [--dim E]
//     Growing state under load (tests/e2e/test_server_sequence_memory.sh):
//     N streams, each starting sequence after sequence of the decoder step
//     (x [1, 1, E], E 16; its KV cache is the state) and sending S steps,
//     then sequence_end, or, with probability P, nothing more (left to the
//     idle timeout). A refused request (429/503) is sent again after its
//     Retry-After, at most 0.2 s (the state is untouched by a refusal); a
//     step refused 5 times in a row gives its sequence up (left to the idle
//     timeout, as a client that stops waiting), which is how sequences that
//     all grow at once in a full budget make room again. For T seconds;
//     then one JSON line: statuses, refusals without Retry-After, transport
//     errors, sequences completed, abandoned and given up, steps answered.
//   node seq_client.js replay URL MODEL IDS.npy LOGITS.npy [--sequence ID]
//     A decoder with a KV cache as its state (scripts/zoo/export_decoder.py:
//     ids [1, 1] int64 a step): the tokens of IDS fed one request at a time
//     as one sequence (start on the first, end on the last), each step's
//     logits against LOGITS [steps, vocab] (PyTorch's). Prints {"ok",
//     "steps", "statuses", "max_diff", "range"}: ok when every step is 200
//     and max |diff| <= 1e-4 x max(1, range of the reference).
//   node seq_client.js infer URL MODEL T SEED [--sequence ID] [--start] [--end]
//       [--with-state]
//     one request (x of T steps from SEED; --with-state: h0 and c0 zeros
//     too; ID all digits is sent as a number, else as a string); prints
//     {"status", "retry_after", "error"?, "y"?: the first 4 values of y}.
'use strict';
const http = require('http');

const F = 8, H = 16;

function die(msg) {
  process.stderr.write(`seq_client: ${msg}\n`);
  process.exit(2);
}

function xOf(steps, seed) {
  const x = new Array(steps * F);
  for (let i = 0; i < x.length; i++) x[i] = Math.sin(i * 0.37 + seed * 1.7);
  return x;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

function post(url, body) {
  return new Promise((resolve, reject) => {
    const data = Buffer.from(JSON.stringify(body));
    const req = http.request(url, {
      method: 'POST', agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': data.length },
    }, (res) => {
      const parts = [];
      res.on('data', (c) => parts.push(c));
      res.on('end', () => {
        let j = null;
        try { j = JSON.parse(Buffer.concat(parts).toString()); } catch (e) { j = null; }
        resolve({ status: res.statusCode, retryAfter: res.headers['retry-after'], json: j });
      });
    });
    req.on('error', reject);
    req.end(data);
  });
}

function request(x, steps, opts) {
  const inputs = [{ name: 'x', shape: [steps, 1, F], datatype: 'FP32', data: x }];
  if (opts.withState)
    for (const n of ['h0', 'c0'])
      inputs.push({ name: n, shape: [1, 1, H], datatype: 'FP32', data: new Array(H).fill(0) });
  const body = { inputs };
  if (opts.sequence) {
    body.parameters = { sequence_id: opts.sequence };
    if (opts.start) body.parameters.sequence_start = true;
    if (opts.end) body.parameters.sequence_end = true;
  }
  return body;
}

function output(res, name) {
  const o = res.json && res.json.outputs && res.json.outputs.find((t) => t.name === name);
  return o ? o.data : null;
}

function maxDiff(a, b, off) {
  if (!a || !b) return Infinity;
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[off + i]));
  return m;
}

async function stream(url, o) {
  const statuses = {};
  let requests = 0, maxd = 0;
  const count = (r) => { statuses[r.status] = (statuses[r.status] || 0) + 1; requests++; };
  async function one(s) {
    const steps = o.chunks * o.chunk;
    const x = xOf(steps, s);
    const whole = await post(url, request(x, steps, { withState: true }));
    count(whole);
    const wy = output(whole, 'y');
    for (let c = 0; c < o.chunks; c++) {
      const xc = x.slice(c * o.chunk * F, (c + 1) * o.chunk * F);
      const r = await post(url, request(xc, o.chunk, {
        sequence: o.first + s, start: c === 0, end: c === o.chunks - 1,
      }));
      count(r);
      if (r.status !== 200) { maxd = Infinity; return; }
      maxd = Math.max(maxd, maxDiff(output(r, 'y'), wy, c * o.chunk * H));
      if (c === o.chunks - 1)
        for (const n of ['hn', 'cn']) maxd = Math.max(maxd, maxDiff(output(r, n), output(whole, n), 0));
    }
  }
  const all = [];
  for (let s = 0; s < o.sequences; s++) all.push(one(s));
  await Promise.all(all);
  const ok = maxd <= 1e-5 && statuses[200] === requests;
  console.log(JSON.stringify({ ok, requests, statuses, max_diff: maxd }));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function load(url, o) {
  const statuses = {};
  let noRetryAfter = 0, transport = 0, completed = 0, abandoned = 0, gaveUp = 0, steps = 0;
  const until = Date.now() + o.seconds * 1000;
  let nextId = o.first;
  let rng = 12345;
  const rand = () => { rng = (rng * 1103515245 + 12345) % 2147483648; return rng / 2147483648; };
  async function send(body, tries) { // until answered with something else than a refusal
    for (let t = 1; ; t++) {
      let r;
      try { r = await post(url, body); } catch (e) {
        transport++;
        if (Date.now() > until) return { status: 0 };
        await sleep(50);
        continue;
      }
      statuses[r.status] = (statuses[r.status] || 0) + 1;
      if (r.status !== 429 && r.status !== 503) return r;
      if (!r.retryAfter) noRetryAfter++;
      if (Date.now() > until || t >= tries) return r;
      await sleep(Math.min(200, 1000 * Number(r.retryAfter || 0.05)));
    }
  }
  async function stream() {
    while (Date.now() < until) {
      const id = nextId++;
      const abandon = rand() < o.abandon;
      let ok = true;
      for (let k = 0; k < o.steps && ok; k++) {
        const body = {
          inputs: [{ name: 'x', shape: [1, 1, o.dim], datatype: 'FP32',
                     data: Array.from({ length: o.dim }, (_, i) => Math.sin(id + k + i)) }],
          // only y back: the server keeps the state, and present_k/v (up to
          // 2 x 512 KiB as JSON text each step) would make this one node
          // process the slowest part of the test, its streams' steps further
          // apart than the idle timeout on a busy machine
          outputs: [{ name: 'y' }],
          parameters: { sequence_id: id },
        };
        if (k === 0) body.parameters.sequence_start = true;
        if (k === o.steps - 1 && !abandon) body.parameters.sequence_end = true;
        const r = await send(body, k === 0 ? Infinity : 5);
        ok = r.status === 200;
        if (ok) steps++;
        else if (k > 0 && Date.now() < until && (r.status === 429 || r.status === 503)) gaveUp++;
      }
      if (!ok) continue; // given up, cut off by the end of the run, or an error (counted)
      if (abandon) abandoned++; else completed++;
    }
  }
  const all = [];
  for (let i = 0; i < o.streams; i++) all.push(stream());
  await Promise.all(all);
  console.log(JSON.stringify({ statuses, no_retry_after: noRetryAfter, transport, completed,
                               abandoned, gave_up: gaveUp, steps }));
}

async function replay(url, idsPath, logitsPath, sequence) {
  const npy = require('../../scripts/ort/npy.js');
  const ids = npy.read(idsPath), ref = npy.read(logitsPath);
  const steps = ids.shape[0], vocab = ref.shape[1];
  let lo = Infinity, hi = -Infinity, maxd = 0;
  for (const v of ref.data) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const statuses = {};
  for (let k = 0; k < steps; k++) {
    const body = {
      inputs: [{ name: 'ids', shape: [1, 1], datatype: 'INT64', data: [Number(ids.data[k])] }],
      parameters: { sequence_id: sequence },
    };
    if (k === 0) body.parameters.sequence_start = true;
    if (k === steps - 1) body.parameters.sequence_end = true;
    const r = await post(url, body);
    statuses[r.status] = (statuses[r.status] || 0) + 1;
    const got = output(r, 'logits');
    if (r.status !== 200 || !got || got.length !== vocab) { maxd = Infinity; break; }
    for (let i = 0; i < vocab; i++) maxd = Math.max(maxd, Math.abs(got[i] - ref.data[k * vocab + i]));
  }
  const range = hi - lo;
  const ok = maxd <= 1e-4 * Math.max(1, range) && statuses[200] === steps;
  console.log(JSON.stringify({ ok, steps, statuses, max_diff: maxd, range }));
}

// --name N pairs over the defaults (every option a number).
function numberOptions(args, defaults) {
  const o = { ...defaults };
  for (let i = 0; i < args.length; i += 2) {
    const k = args[i].replace(/^--/, ''), v = Number(args[i + 1]);
    if (!(k in o) || !Number.isFinite(v)) die(`bad option ${args[i]}`);
    o[k] = v;
  }
  return o;
}

async function main() {
  const [cmd, base, model, ...rest] = process.argv.slice(2);
  if (!cmd || !base || !model) die('usage: see the top of the file');
  const url = `${base}/v2/models/${model}/infer`;
  if (cmd === 'stream') {
    await stream(url, numberOptions(rest, { sequences: 4, chunks: 5, chunk: 4, first: 1 }));
  } else if (cmd === 'load') {
    await load(url, numberOptions(rest,
      { streams: 8, steps: 16, seconds: 10, abandon: 0, first: 1, dim: 16 }));
  } else if (cmd === 'replay') {
    const [ids, logits, flag, id] = rest;
    if (!ids || !logits || (flag && flag !== '--sequence')) die('usage: replay URL MODEL IDS LOGITS');
    await replay(url, ids, logits, id ? Number(id) : 1);
  } else if (cmd === 'infer') {
    const [steps, seed, ...flags] = rest;
    const opts = { withState: false };
    for (let i = 0; i < flags.length; i++) {
      if (flags[i] === '--sequence') { // a number, or else a string id
        const v = flags[++i];
        opts.sequence = /^[0-9]+$/.test(v) ? Number(v) : v;
      }
      else if (flags[i] === '--start') opts.start = true;
      else if (flags[i] === '--end') opts.end = true;
      else if (flags[i] === '--with-state') opts.withState = true;
      else die(`bad option ${flags[i]}`);
    }
    const r = await post(url, request(xOf(Number(steps), Number(seed)), Number(steps), opts));
    const out = { status: r.status, retry_after: r.retryAfter || null };
    if (r.json && r.json.error) out.error = r.json.error;
    const y = output(r, 'y');
    if (y) out.y = y.slice(0, 4);
    console.log(JSON.stringify(out));
  } else {
    die(`unknown command ${cmd}`);
  }
  agent.destroy();
}

main().catch((e) => die(e.message));
