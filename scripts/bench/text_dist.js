// The edit distance between two strings in Unicode code points (one
// insertion, deletion or substitution each): the character accuracy the
// OCR benchmark (ocr_score.js) and the int8 and bf16 OCR checks
// (tests/e2e/accuracy_lib.sh) count.
function editDistance(a, b) {
  a = Array.from(a);
  b = Array.from(b);
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++)
      cur[j] = Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = cur;
  }
  return prev[b.length];
}
module.exports = { editDistance };
