#!/usr/bin/env bash
# The QOperator format (ONNX Runtime's quantizer's other form): a model of
# every com.microsoft QLinear operator the engine runs (QLinearSigmoid,
# QLinearAdd with broadcasting, QLinearMul, QLinearConcat,
# QLinearGlobalAveragePool, QLinearAveragePool; written by es_qop_model),
# in uint8 and in int8,
# run by edgeserve and by ONNX Runtime on the same input: every 8-bit output
# within one step of ONNX Runtime's (a float product rounding the other way
# is the only allowed difference), the steps that differ counted. A
# com.microsoft operator the engine does not run is listed by name.
#   test_qoperator.sh EDGESERVE_BINARY ES_QOP_MODEL SOURCE_DIR
set -uo pipefail
es=$1
gen=$2
src=$3
ort="$src/scripts/ort"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v node >/dev/null || { echo "test_qoperator: node is missing: skipped"; exit 77; }
node -e "require('$src/.cache/ort/node_modules/onnxruntime-node')" 2>/dev/null ||
  { echo "test_qoperator: onnxruntime-node missing (scripts/setup/install-ort.sh): skipped"; exit 77; }

fail=0
node -e '
  const npy = require(process.argv[1] + "/npy.js");
  const x = new Float32Array(4 * 36);
  for (let i = 0; i < x.length; i++) x[i] = Math.sin(i * 0.37) * 2.2 + ((i * 7919) % 13) / 40;
  npy.write(process.argv[2], "float32", [1, 4, 6, 6], x);
' "$ort" "$work/x.npy" || exit 1
for t in u8 s8; do
  "$gen" $t "$work/q$t.onnx" || { echo "FAIL es_qop_model $t"; fail=1; continue; }
  if ! "$es" run "$work/q$t.onnx" "$work/x.npy" --output-dir "$work/es_$t" >"$work/run.log" 2>&1; then
    echo "FAIL edgeserve run ($t):"; cat "$work/run.log"; fail=1; continue
  fi
  node "$ort/ort_run.js" "$work/q$t.onnx" "$work/ort_$t" "$work/x.npy" >"$work/ort.log" 2>&1 ||
    { echo "FAIL onnxruntime ($t):"; cat "$work/ort.log"; fail=1; continue; }
  node -e '
    const npy = require(process.argv[1] + "/npy.js");
    let bad = 0;
    for (const name of ["d", "e", "f"]) {
      const a = npy.read(`${process.argv[2]}/${name}.npy`), b = npy.read(`${process.argv[3]}/${name}.npy`);
      if (a.type !== b.type || a.data.length !== b.data.length || a.shape.join() !== b.shape.join()) {
        console.log(`${name}: ${a.type} [${a.shape}] vs ${b.type} [${b.shape}]`);
        bad = 1;
        continue;
      }
      let max = 0, off = 0;
      for (let i = 0; i < a.data.length; i++) {
        const d = Math.abs(a.data[i] - b.data[i]);
        max = Math.max(max, d);
        off += d > 0;
      }
      console.log(`${process.argv[4]} ${name} ${a.type} [${a.shape}]: ${off} of ${a.data.length} one step apart, max ${max}`);
      if (max > 1) bad = 1;
    }
    process.exit(bad);
  ' "$ort" "$work/es_$t" "$work/ort_$t" "$t" || { echo "FAIL $t: more than one step from ONNX Runtime"; fail=1; }
done
ops=$("$es" inspect "$work/qu8.onnx" | grep -cE '^  QLinear(Sigmoid|Add|Mul|Concat|GlobalAveragePool|AveragePool) ')
[ "$ops" = 6 ] && echo "inspect: the six com.microsoft operators" ||
  { echo "FAIL inspect lists $ops of the 6 operators"; "$es" inspect "$work/qu8.onnx"; fail=1; }
# an operator of the domain the engine does not run: named, exit 1
sed 's/QLinearSigmoid/QLinearSoftmax/' "$work/qu8.onnx" >"$work/bad.onnx"
"$es" inspect "$work/bad.onnx" >"$work/bad.log" 2>&1
if [ $? -eq 1 ] && grep -q "QLinearSoftmax (domain 'com.microsoft')" "$work/bad.log"; then
  echo "refused: $(grep -m1 "QLinearSoftmax" "$work/bad.log" | sed 's/^ *//')"
else
  echo "FAIL an unknown com.microsoft operator:"; cat "$work/bad.log"; fail=1
fi
[ $fail -eq 0 ] && echo "QOperator models agree with ONNX Runtime"
exit $fail
