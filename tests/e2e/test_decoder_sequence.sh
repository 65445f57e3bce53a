#!/usr/bin/env bash
# A decoder-only transformer exported by torch.onnx (scripts/zoo/export_decoder.py:
# 3 layers, a KV cache of 6 tensors as its state) served as a sequence over
# KServe v2: 40 steps of one token each, the server feeding every present_*
# back as the next past_*, each step's logits against PyTorch's own cached
# decode (<= 1e-4 x the logits' range); then no sequence live and no state
# byte held. Skipped (77) without the export (scripts/zoo/export.sh), node or
# curl.
#   test_decoder_sequence.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
zoo=${ES_ZOO_DIR:-$src/.cache/zoo}
client="$src/tests/e2e/seq_client.js"
for need in node curl; do
  command -v $need >/dev/null || { echo "# skipped: '$need' is missing"; exit 77; }
done
[ -f "$zoo/decoder_tiny.onnx" ] && [ -f "$zoo/data/decoder_tiny/logits.npy" ] ||
  { echo "# skipped: no decoder export in $zoo (scripts/zoo/export.sh)"; exit 77; }
work=$(mktemp -d)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
pid=
trap '[ -n "$pid" ] && kill -KILL $pid 2>/dev/null; rm -rf "$work"' EXIT
. "$src/tests/e2e/serve_lib.sh"
mkdir -p "$work/repo/decoder"
cp "$zoo/decoder_tiny.onnx" "$work/repo/decoder/model.onnx"
cat >"$work/repo/decoder/config.json" <<'JSON'
{"plans": 64, "sequence": {"states": {"past_k0": "present_k0", "past_v0": "present_v0",
  "past_k1": "present_k1", "past_v1": "present_v1", "past_k2": "present_k2",
  "past_v2": "present_v2"}}}
JSON
"$es" serve --model-repository "$work/repo" --port 0 --workers 2 --memory 64M --quiet \
  2>"$work/err" &
pid=$!
await_server decoder "$pid" "$work/err" || exit 1
res=$(node "$client" replay "$url" decoder "$zoo/data/decoder_tiny/ids.npy" \
  "$zoo/data/decoder_tiny/logits.npy" --sequence 9)
echo "# $res"
node -e 'process.exit(JSON.parse(process.argv[1]).ok ? 0 : 1)' "$res" &&
  ok "40 steps as one sequence match PyTorch's cached decode" ||
  notok "40 steps as one sequence match PyTorch's cached decode"
m=$(curl -s "$url/metrics")
live=$(sed -n 's/^edgeserve_sequences_live{model="decoder"} //p' <<<"$m")
bytes=$(sed -n 's/^edgeserve_sequence_state_bytes{model="decoder"} //p' <<<"$m")
[ "$live" = 0 ] && [ "$bytes" = 0 ] && ok "ended: no sequence live, no state byte held" ||
  notok "ended: $live live, $bytes state bytes"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc = 0 ] && ok "exit 0 on SIGTERM" || notok "exit status $rc on SIGTERM"
if grep -Eq 'AddressSanitizer|LeakSanitizer|runtime error:' "$work/err"; then
  notok "sanitizer report"
  head -40 "$work/err" | sed 's/^/#   /'
fi
[ $n_fail = 0 ]
