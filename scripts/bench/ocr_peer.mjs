// The peer of the OCR benchmark (scripts/bench/bench_ocr.sh): npm's
// @gutenye/ocr-node, installed by scripts/setup/install-ocr-peer.sh, reads
// each image given. The pipeline is created once and warmed up on the
// first image; then each image is read R times and the median time is
// reported (its models already loaded, as edgeserve's `ocr --repeat`
// reports). One JSON line per image: {"image", "ms", "lines": [text...]}.
//   node ocr_peer.mjs PEER_DIR R IMAGE...
import { createRequire } from 'module';
import path from 'path';

const [dir, reps, ...images] = process.argv.slice(2);
const require = createRequire(path.resolve(dir, 'package.json'));
const { default: Ocr } = await import(require.resolve('@gutenye/ocr-node'));
const ocr = await Ocr.create();
if (images.length) await ocr.detect(images[0]);
for (const image of images) {
  const times = [];
  let lines = [];
  for (let r = 0; r < Number(reps); r++) {
    const t0 = performance.now();
    const res = await ocr.detect(image);
    times.push(performance.now() - t0);
    lines = res.map((l) => l.text);
  }
  times.sort((a, b) => a - b);
  const ms = times.length % 2 ? times[(times.length - 1) / 2]
                              : (times[times.length / 2 - 1] + times[times.length / 2]) / 2;
  console.log(JSON.stringify({ image, ms, lines }));
}
