// Scores the OCR benchmark (scripts/bench/bench_ocr.sh): character accuracy
// of each pipeline's text against the ground truth written for the image,
// and its latency, per image and per image class.
//
// Accuracy: 1 - (edit distance / length of the truth), at least 0, over the
// image's lines in reading order joined by one space, after NFKC
// normalisation (a full-width bracket is the ASCII one) and with every run
// of white space as one space: a missed line, a misread letter and a lost
// space between words each cost their characters. A class's accuracy is
// the sum of its images' distances over the sum of their lengths.
//   node ocr_score.js CASES ES.jsonl PEER.jsonl [--verbose]
// CASES: one image per line, "CLASS<TAB>IMAGE<TAB>TRUTH", the truth's
// lines separated by " | ". The JSONL files: {"image", "ms", "lines"}.
const fs = require('fs');
const { editDistance: lev } = require('./text_dist.js');
const [casesPath, esPath, peerPath] = process.argv.slice(2);
const verbose = process.argv.includes('--verbose');

const norm = (s) => s.normalize('NFKC').replace(/\s+/g, ' ').trim();
const load = (p) => {
  const m = new Map();
  for (const l of fs.readFileSync(p, 'utf8').split('\n'))
    if (l.trim()) {
      const j = JSON.parse(l);
      m.set(j.image, j);
    }
  return m;
};
const es = load(esPath), peer = load(peerPath);
const classes = new Map();
const f1 = (x) => (Number.isFinite(x) ? x.toFixed(1) : '-');
const pct = (x) => (Number.isFinite(x) ? (100 * x).toFixed(1) : '-');
for (const line of fs.readFileSync(casesPath, 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const [cls, image, truth] = line.split('\t');
  const t = norm(truth.split(' | ').join(' '));
  const n = Array.from(t).length;
  const c = classes.get(cls) || { n: 0, images: 0, d: { es: 0, peer: 0 }, ms: { es: [], peer: [] } };
  c.images++;
  c.n += n;
  for (const [who, m] of [['es', es], ['peer', peer]]) {
    const r = m.get(image);
    const got = r ? norm(r.lines.join(' ')) : '';
    const d = Math.min(lev(got, t), n);
    c.d[who] += d;
    if (r) c.ms[who].push(r.ms);
    if (verbose)
      console.log(`${cls}\t${image.split('/').pop()}\t${who}\t${pct(1 - d / n)}%\t${f1(r && r.ms)} ms\t${got}`);
  }
  classes.set(cls, c);
}
const med = (xs) => {
  xs = xs.slice().sort((a, b) => a - b);
  const k = xs.length;
  return k ? (k % 2 ? xs[(k - 1) / 2] : (xs[k / 2 - 1] + xs[k / 2]) / 2) : NaN;
};
console.log('| class | images | chars | edgeserve accuracy % | peer accuracy % | edgeserve ms (median) | peer ms (median) | edgeserve / peer latency |');
console.log('|---|---|---|---|---|---|---|---|');
let worst = Infinity, okAcc = true;
for (const [cls, c] of classes) {
  const ae = 1 - c.d.es / c.n, ap = 1 - c.d.peer / c.n, me = med(c.ms.es), mp = med(c.ms.peer);
  okAcc = okAcc && ae >= ap;
  worst = Math.min(worst, mp / me);
  console.log(`| ${cls} | ${c.images} | ${c.n} | ${pct(ae)} | ${pct(ap)} | ${f1(me)} | ${f1(mp)} | ${(me / mp).toFixed(2)} |`);
}
console.log(`(goals: edgeserve's accuracy at least the peer's in every class: ${okAcc ? 'met' : 'NOT met'};` +
            ` latency at most 0.5x the peer's: ${1 / worst <= 0.5 ? 'met' : 'NOT met'}, worst class ${(1 / worst).toFixed(2)}x)`);
