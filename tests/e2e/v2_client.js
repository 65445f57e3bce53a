// A small KServe v2 (Open Inference Protocol) REST client for the server's
// end-to-end tests (tests/e2e/test_server.sh, test_server_overload.sh).
// Tensors come from and go to NumPy .npy files (scripts/ort/npy.js).
//
//   node v2_client.js infer URL MODEL [request options] [--out DIR]
//       POST URL/v2/models/MODEL/infer; prints one JSON line
//       {"status", "headers": {...}, "error"?, "outputs"?: [{name, datatype,
//       shape}]} and writes each output to DIR/NAME.npy (NAME with characters
//       outside [A-Za-z0-9._-] replaced by '_', as `edgeserve run` does).
//       Exit 0 whatever the status (the caller checks it); 2 on usage or
//       transport errors.
//   node v2_client.js build [request options] --body FILE
//       writes the request body to FILE and prints the value the
//       Inference-Header-Content-Length header must have (-1: pure JSON),
//       so that curl can send it, or a mangled copy of it.
//   node v2_client.js load URL MODEL [request options] --concurrency N
//       --seconds S [--max-requests M]
//       N loops posting the same body for S seconds (each loop waits for
//       its answer, and for nothing else: a refusal is retried at once, not
//       after Retry-After, to keep the pressure on). Prints one JSON line:
//       counts by status, refusals without Retry-After, transport errors,
//       latency percentiles of the 200s, refusals by status and message
//       ("aborted": stopped after 200 transport errors in a row). --expect-continue: send
//       "Expect: 100-continue" and the body only when the server says so.
//   node v2_client.js gen FILE.npy D,D,.. [SEED]
//       a float32 tensor of that shape, seeded uniform values in [-1, 1]
//       (for shapes scripts/ort/make_inputs.js does not make).
//   node v2_client.js get FILE 'EXPR'
//       prints the JavaScript expression EXPR over j, the JSON in FILE (or
//       "undefined"/"invalid JSON"): the test scripts' JSON checks.
//   node v2_client.js cmp DIR_A DIR_B [--tol X]
//       every .npy in A against the same name in B: same dtype and shape and
//       max abs diff <= X (default 0: bit-exact values); exit 1 otherwise.
//
// Request options:
//   --input NAME=FILE.npy   an input (repeatable), in the order given
//   --binary                inputs as binary data (default JSON "data")
//   --binary-output         parameters.binary_data_output = true
//   --output NAME[:bin|:json]  ask for this output only (repeatable)
//   --priority N, --timeout US, --id S   request parameters
//   --shape NAME=D,D,..     send this shape instead of the file's (the data
//                           stays the file's: a mismatch to provoke a 400)
//   --datatype NAME=DT      send this datatype instead of FP32 (data unchanged)
//   --rename OLD=NEW        send input OLD under the name NEW
//   --bds-add N             add N to the binary_data_size of the last input
'use strict';
const fs = require('fs');
const path = require('path');
const http = require('http');
const npy = require(path.join(__dirname, '..', '..', 'scripts', 'ort', 'npy.js'));

const DT = { float32: 'FP32', int64: 'INT64', int32: 'INT32', bool: 'BOOL', uint8: 'UINT8' };
const NP = { FP32: 'float32', INT64: 'int64', INT32: 'int32', BOOL: 'bool', UINT8: 'uint8' };
const ARR = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array, bool: Uint8Array, uint8: Uint8Array };

function die(msg) {
  process.stderr.write(`v2_client: ${msg}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const o = { inputs: [], outputs: [], shape: {}, datatype: {}, rename: {}, pos: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) die(`${a} needs a value`);
      return argv[++i];
    };
    const kv = s => {
      const k = s.indexOf('=');
      if (k <= 0) die(`${a} wants NAME=VALUE, got '${s}'`);
      return [s.slice(0, k), s.slice(k + 1)];
    };
    switch (a) {
      case '--input': o.inputs.push(kv(val())); break;
      case '--binary': o.binary = true; break;
      case '--binary-output': o.binaryOutput = true; break;
      case '--output': {
        const [n, m] = val().split(/:(bin|json)$/);
        o.outputs.push({ name: n, binary: m === undefined ? undefined : m === 'bin' });
        break;
      }
      case '--priority': o.priority = Number(val()); break;
      case '--timeout': o.timeout = Number(val()); break;
      case '--id': o.id = val(); break;
      case '--shape': { const [n, s] = kv(val()); o.shape[n] = s.split(',').map(Number); break; }
      case '--datatype': { const [n, d] = kv(val()); o.datatype[n] = d; break; }
      case '--rename': { const [n, m] = kv(val()); o.rename[n] = m; break; }
      case '--bds-add': o.bdsAdd = Number(val()); break;
      case '--body': o.body = val(); break;
      case '--out': o.out = val(); break;
      case '--concurrency': o.concurrency = Number(val()); break;
      case '--seconds': o.seconds = Number(val()); break;
      case '--max-requests': o.maxRequests = Number(val()); break;
      case '--tol': o.tol = Number(val()); break;
      case '--expect-continue': o.expect = true; break;
      default:
        if (a.startsWith('--')) die(`unknown option ${a}`);
        o.pos.push(a);
    }
  }
  return o;
}

// JSON numbers for a typed array, without building a 10 MB intermediate
// array of JS values (JSON.stringify of Array.from would, several times).
function dataText(arr) {
  const parts = [];
  const step = 65536;
  for (let i = 0; i < arr.length; i += step) {
    const sub = arr.subarray(i, Math.min(arr.length, i + step));
    let s = '';
    for (let k = 0; k < sub.length; k++) {
      const v = sub[k];
      s += (i + k ? ',' : '') + (typeof v === 'bigint' ? v.toString() : String(v));
    }
    parts.push(s);
  }
  return '[' + parts.join('') + ']';
}

// Returns {body: Buffer, headerLen: number (-1: JSON only)}.
function buildRequest(o) {
  const jin = [];
  const bins = [];
  const dataTexts = [];
  for (const [name, file] of o.inputs) {
    const t = npy.read(file);
    const sendName = o.rename[name] || name;
    const entry = {
      name: sendName,
      shape: o.shape[name] || t.shape,
      datatype: o.datatype[name] || DT[t.type],
    };
    if (o.binary) {
      const b = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
      entry.parameters = { binary_data_size: b.length };
      bins.push(b);
    } else {
      entry.data = `@@DATA${dataTexts.length}@@`;
      dataTexts.push(dataText(t.data));
    }
    jin.push(entry);
  }
  if (o.bdsAdd && o.binary && jin.length) jin[jin.length - 1].parameters.binary_data_size += o.bdsAdd;
  const req = { inputs: jin };
  if (o.id !== undefined) req.id = o.id;
  const params = {};
  if (o.binaryOutput) params.binary_data_output = true;
  if (o.priority !== undefined) params.priority = o.priority;
  if (o.timeout !== undefined) params.timeout = o.timeout;
  if (Object.keys(params).length) req.parameters = params;
  if (o.outputs.length)
    req.outputs = o.outputs.map(x => (x.binary === undefined ? { name: x.name }
                                                               : { name: x.name, parameters: { binary_data: x.binary } }));
  let json = JSON.stringify(req);
  // Splice the (large) data arrays in as text.
  const pieces = json.split(/"@@DATA(\d+)@@"/);
  const bufs = [];
  for (let i = 0; i < pieces.length; i++)
    bufs.push(Buffer.from(i % 2 ? dataTexts[Number(pieces[i])] : pieces[i], 'utf8'));
  const head = Buffer.concat(bufs);
  if (!o.binary) return { body: head, headerLen: -1 };
  return { body: Buffer.concat([head, ...bins]), headerLen: head.length };
}

// expect: send "Expect: 100-continue" and the body only after "100
// Continue", so that an early refusal (413, 503 before the body is read)
// arrives as a response instead of a reset while the body is being written.
function post(url, body, headerLen, agent, expect) {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const headers = { 'Content-Type': headerLen >= 0 ? 'application/octet-stream' : 'application/json',
                      'Content-Length': body.length };
    if (headerLen >= 0) headers['Inference-Header-Content-Length'] = String(headerLen);
    if (expect) headers.Expect = '100-continue';
    const rq = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers, agent },
      res => {
        const chunks = [];
        res.on('data', c => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      });
    rq.on('error', reject);
    if (expect) rq.on('continue', () => rq.end(body));
    else rq.end(body);
  });
}

function sanitize(name) {
  return name.replace(/[^A-Za-z0-9._-]/g, '_');
}

// Decodes a response into {json, outputs: [{name, datatype, shape, data}]}.
function decodeResponse(res) {
  const hl = res.headers['inference-header-content-length'];
  const headLen = hl === undefined ? res.body.length : Number(hl);
  if (!(headLen >= 0 && headLen <= res.body.length))
    throw new Error(`response Inference-Header-Content-Length ${hl} does not fit the body (${res.body.length} bytes)`);
  const json = JSON.parse(res.body.subarray(0, headLen).toString('utf8'));
  let off = headLen;
  const outs = [];
  for (const o of json.outputs || []) {
    const type = NP[o.datatype];
    if (!type) throw new Error(`output ${o.name}: unsupported datatype ${o.datatype}`);
    const Arr = ARR[type];
    const count = o.shape.reduce((a, b) => a * b, 1);
    let data;
    if (o.parameters && o.parameters.binary_data_size !== undefined) {
      const n = o.parameters.binary_data_size;
      if (off + n > res.body.length) throw new Error(`output ${o.name}: binary data past the end of the body`);
      if (n !== count * Arr.BYTES_PER_ELEMENT) throw new Error(`output ${o.name}: binary_data_size ${n} does not match shape [${o.shape}]`);
      const copy = new Uint8Array(n);
      copy.set(res.body.subarray(off, off + n));
      data = new Arr(copy.buffer);
      off += n;
    } else {
      if (!Array.isArray(o.data)) throw new Error(`output ${o.name}: no data`);
      const flat = o.data.flat(Infinity);
      if (flat.length !== count) throw new Error(`output ${o.name}: ${flat.length} values for shape [${o.shape}]`);
      data = type === 'int64' ? BigInt64Array.from(flat, BigInt) : Arr.from(flat, v => (typeof v === 'boolean' ? +v : v));
    }
    outs.push({ name: o.name, datatype: o.datatype, shape: o.shape, type, data });
  }
  if (off !== res.body.length) throw new Error(`${res.body.length - off} bytes left after the last binary output`);
  return { json, outputs: outs };
}

async function cmdInfer(o) {
  const [url, model] = o.pos;
  if (!url || !model || !o.inputs.length) die('infer URL MODEL --input NAME=FILE.npy ...');
  const { body, headerLen } = buildRequest(o);
  let res;
  try {
    res = await post(`${url}/v2/models/${model}/infer`, body, headerLen);
  } catch (e) {
    die(`POST failed: ${e.message}`);
  }
  const line = { status: res.status, headers: res.headers, bytes: res.body.length };
  if (res.status === 200) {
    try {
      const d = decodeResponse(res);
      line.outputs = d.outputs.map(x => ({ name: x.name, datatype: x.datatype, shape: x.shape }));
      line.binary = res.headers['inference-header-content-length'] !== undefined;
      if (o.out) {
        fs.mkdirSync(o.out, { recursive: true });
        for (const x of d.outputs) npy.write(path.join(o.out, sanitize(x.name) + '.npy'), x.type, x.shape, x.data);
      }
    } catch (e) {
      line.decode_error = e.message;
    }
  } else {
    try {
      line.error = JSON.parse(res.body.toString('utf8')).error;
    } catch (e) {
      line.error = `(not JSON) ${res.body.toString('utf8').slice(0, 200)}`;
    }
  }
  console.log(JSON.stringify(line));
}

function cmdBuild(o) {
  if (!o.body || !o.inputs.length) die('build --input NAME=FILE.npy ... --body FILE');
  const { body, headerLen } = buildRequest(o);
  fs.writeFileSync(o.body, body);
  console.log(String(headerLen));
}

async function cmdLoad(o) {
  const [url, model] = o.pos;
  if (!url || !model || !o.concurrency || !o.seconds) die('load URL MODEL --input ... --concurrency N --seconds S');
  const { body, headerLen } = buildRequest(o);
  const agent = new http.Agent({ keepAlive: true, maxSockets: o.concurrency });
  const target = `${url}/v2/models/${model}/infer`;
  const end = Date.now() + o.seconds * 1000;
  const counts = {};
  const lat = [];
  let sent = 0, noRetryAfter = 0, transport = 0, badOutput = 0, inARow = 0, aborted = false;
  const firstErr = {}, reasons = {};
  async function loop() {
    while (Date.now() < end && !aborted && (!o.maxRequests || sent < o.maxRequests)) {
      sent++;
      const t0 = process.hrtime.bigint();
      let res;
      try {
        res = await post(target, body, headerLen, agent, o.expect);
      } catch (e) {
        transport++;
        if (!firstErr.transport) firstErr.transport = e.message;
        if (++inARow >= 200) { // the server is gone: stop hammering the port
          aborted = true;
          break;
        }
        await new Promise(r => setTimeout(r, 5));
        continue;
      }
      inARow = 0;
      counts[res.status] = (counts[res.status] || 0) + 1;
      if (res.status === 200) {
        lat.push(Number(process.hrtime.bigint() - t0) / 1e6);
        if (res.headers['inference-header-content-length'] === undefined && headerLen >= 0 && o.binaryOutput) badOutput++;
      } else {
        if ((res.status === 429 || res.status === 503) && !/^\d+$/.test(res.headers['retry-after'] || '')) noRetryAfter++;
        if (!firstErr[res.status]) firstErr[res.status] = res.body.toString('utf8').slice(0, 200);
        let msg;
        try {
          msg = JSON.parse(res.body.toString('utf8')).error;
        } catch (e) {
          msg = '(not JSON)';
        }
        const key = `${res.status} ${String(msg).replace(/[0-9]+/g, 'N').slice(0, 80)}`;
        reasons[key] = (reasons[key] || 0) + 1;
      }
    }
  }
  const t0 = Date.now();
  await Promise.all(Array.from({ length: o.concurrency }, loop));
  agent.destroy();
  lat.sort((a, b) => a - b);
  const pct = p => (lat.length ? Number(lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(1)) : null);
  console.log(JSON.stringify({ sent, seconds: (Date.now() - t0) / 1000, counts, no_retry_after: noRetryAfter,
                               transport_errors: transport, aborted, bad_output: badOutput,
                               p50_ms: pct(0.5), p99_ms: pct(0.99), refusals: reasons, first_error: firstErr }));
}

function cmdCmp(o) {
  const [a, b] = o.pos;
  const tol = o.tol || 0;
  if (!a || !b) die('cmp DIR_A DIR_B [--tol X]');
  let bad = 0, n = 0;
  for (const f of fs.readdirSync(a).filter(f => f.endsWith('.npy')).sort()) {
    if (!fs.existsSync(path.join(b, f))) { console.log(`${f}: missing in ${b}`); bad++; continue; }
    const x = npy.read(path.join(a, f)), y = npy.read(path.join(b, f));
    n++;
    if (x.shape.join(',') !== y.shape.join(',') || x.type !== y.type) {
      console.log(`${f}: ${x.type}[${x.shape}] vs ${y.type}[${y.shape}]`);
      bad++;
      continue;
    }
    let maxerr = 0, diff = 0;
    for (let i = 0; i < x.data.length; i++) {
      const e = Math.abs(Number(x.data[i]) - Number(y.data[i]));
      if (!(e <= maxerr)) maxerr = e; // NaN counts
      if (x.data[i] !== y.data[i] && !(Number.isNaN(x.data[i]) && Number.isNaN(y.data[i]))) diff++;
    }
    const ok = maxerr <= tol;
    if (!ok) bad++;
    console.log(`${f}: [${x.shape}] max abs diff ${maxerr}, ${diff} of ${x.data.length} values differ${ok ? '' : ' (over ' + tol + ')'}`);
  }
  if (n === 0) { console.log('cmp: no outputs compared'); process.exit(1); }
  process.exit(bad ? 1 : 0);
}

function cmdGen(o) {
  const [file, shape, seed] = o.pos;
  if (!file || !shape) die('gen FILE.npy D,D,.. [SEED]');
  const dims = shape.split(',').map(Number);
  const n = dims.reduce((a, b) => a * b, 1);
  let s = (Number(seed) || 1) >>> 0;
  const d = new Float32Array(n);
  for (let i = 0; i < n; i++) { // xorshift32
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    d[i] = (s / 4294967296) * 2 - 1;
  }
  npy.write(file, 'float32', dims, d);
}

function cmdGet(o) {
  const [file, expr] = o.pos;
  let j;
  try {
    j = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    console.log('invalid JSON');
    return;
  }
  const v = new Function('j', `return (${expr});`)(j);
  console.log(typeof v === 'object' ? JSON.stringify(v) : String(v));
}

const [cmd, ...rest] = process.argv.slice(2);
const opts = parseArgs(rest);
const cmds = { infer: cmdInfer, build: cmdBuild, load: cmdLoad, cmp: cmdCmp, gen: cmdGen, get: cmdGet };
if (!cmds[cmd]) die('usage: v2_client.js infer|build|load|gen|get|cmp ... (see the comment at the top)');
Promise.resolve(cmds[cmd](opts)).catch(e => die(e.stack || e.message));
