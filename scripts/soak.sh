#!/usr/bin/env bash
# Soak: a million requests against one `edgeserve serve`, and its memory
# must not drift.
#
# Starts the server (release build, the embedded default set: the five
# models and the face and ocr pipelines) and drives it with es_hostile's
# soak mode (tests/e2e/hostile.c): C keep-alive clients (default 4) send N
# requests (default 1,000,000) of a weighted mix, mostly small models so
# that the run takes minutes on two cores, and enough dynamic shapes (ppocr_det
# at 64..128, ppocr_rec at widths other than 320) to keep the buddy pool busy:
#     40 front   blazeface_front 128x128, binary      1 front-json  the same, JSON
#     20 cls     ppocr_cls 48x192                     5 back        blazeface_back 256x256
#      4 each    ppocr_rec at widths 80, 160, 240, 320, and 1 at 480
#      4 each    ppocr_det at 64x64, 96x96, and 2 at 128x128, 1 at 96x160
#      0.4       face pipeline, a JPEG of astronaut.png  0.2 face, coffee.png as is
#      0.2       ocr pipeline on a rendered text line (ImageMagick; coffee.png without it)
# Every 10,000 answers it prints the answers so far, req/s over the last
# interval, the statuses, the server's VmRSS, the bytes its counting layer
# holds (the sum of edgeserve_memory_tag_bytes: RSS growing while this stays
# flat is the allocator keeping freed memory, or reserved memory touched for
# the first time) and the buddy pool's bytes in use, its historic peak (a
# higher peak touches pages of the pool never touched before) and its
# fragmentation (GET /metrics). At each line the clients pause: RSS is read
# once nothing is in flight (load_rssK) and again --idle-wait seconds later
# (rss_KiB; default 13: the server's buddy_decay_ms of 10 s, after which the
# pool's pages it no longer uses have gone back, and two of its 1 s passes;
# then up to 5 s more while RSS still falls). That idle RSS
# is the one checked: under load RSS moves with the requests in flight and
# the pool's working set, which say nothing about a leak (--idle-wait 0
# checks RSS under load instead). After warm-up (the first 10% of the
# requests) the RSS must stay within 2% of its post-warm-up value; at the
# end, with nothing in flight, the buddy pool must hold nothing and be
# unfragmented; every answer must be 200, 429 or 503 (with Retry-After)
# with no transport failure. Exits 1 when a check fails (the summary says
# which), 2 on usage errors. Not part of CI.
#   scripts/soak.sh [--requests N] [--max-seconds S] [--clients C] [--report-every N]
#                   [--warmup F] [--rss-tolerance F] [--idle-wait S] [--mix "W:KIND ..."]
#                   [--serve-args "..."]
# --max-seconds bounds the run (the request count check then fails if it
# was not reached); --mix replaces the mix (es_hostile's request kinds:
# front, front-json, back, cls, rec:W, det:S, det:HxW, face:FILE,
# face-jpeg:FILE, ocr:FILE, ocr-jpeg:FILE, health). ES_BIN overrides the
# server binary (default build-release/edgeserve), ES_HOSTILE the client
# (default build-release/tests/es_hostile); both are built when missing.
# ES_SOAK_SMAPS=DIR keeps the server's /proc/PID/smaps at each idle sample
# (DIR/smaps.<answers>), to see which mapping grows when RSS creeps.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=1000000 max_seconds=0 clients=4 report_every=10000 warmup=0.1 tolerance=0.02 idle_wait=13
mix="" serve_args=""
usage() {
  echo "usage: $0 [--requests N] [--max-seconds S] [--clients C] [--report-every N]" \
       "[--warmup F] [--rss-tolerance F] [--idle-wait S] [--mix \"W:KIND ...\"]" \
       "[--serve-args \"...\"]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case $1 in
    --requests) requests=$2 ;;
    --max-seconds) max_seconds=$2 ;;
    --clients) clients=$2 ;;
    --report-every) report_every=$2 ;;
    --warmup) warmup=$2 ;;
    --rss-tolerance) tolerance=$2 ;;
    --idle-wait) idle_wait=$2 ;;
    --mix) mix=$2 ;;
    --serve-args) serve_args=$2 ;;
    *) usage ;;
  esac
  shift 2
done

es=${ES_BIN:-build-release/edgeserve}
hostile=${ES_HOSTILE:-build-release/tests/es_hostile}
if [ ! -x "$es" ] || [ ! -x "$hostile" ]; then
  cmake -S . -B build-release -DES_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON >/dev/null
  cmake --build build-release -j"$(nproc)" --target edgeserve_cli es_hostile >/dev/null
  [ -x "$es" ] || es=build-release/edgeserve
  [ -x "$hostile" ] || hostile=build-release/tests/es_hostile
fi
scripts/setup/fetch-models.sh >/dev/null
scripts/setup/fetch-images.sh >/dev/null
img=.cache/images
work=$(mktemp -d -t es-soak.XXXXXX)
srv_pid=""
cleanup() {
  if [ -n "$srv_pid" ] && kill -0 "$srv_pid" 2>/dev/null; then
    kill "$srv_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$srv_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The ocr pipeline reads a rendered line of text when ImageMagick can draw
# one; coffee.png (no text: det alone) otherwise.
ocr_img=$img/coffee.png
font=$(fc-match -f '%{file}' DejaVuSans 2>/dev/null || true)
if command -v convert >/dev/null && [ -f "$font" ] &&
   convert -size 720x120 xc:white -font "$font" -pointsize 44 -fill black \
     -annotate +20+80 "Serial AB-2024-7731 OK" "$work/plate.png" 2>/dev/null; then
  ocr_img=$work/plate.png
fi
if [ -z "$mix" ]; then
  mix="40:front 1:front-json 20:cls 5:back 4:rec:80 4:rec:160 4:rec:240 4:rec:320 1:rec:480
       4:det:64 4:det:96 2:det:128 1:det:96x160 0.4:face-jpeg:$img/astronaut.png
       0.2:face:$img/coffee.png 0.2:ocr:$ocr_img"
fi
reqs=()
for m in $mix; do reqs+=(--req "$m"); done

# ---- the server ---------------------------------------------------------------
# shellcheck disable=SC2086 # options
"$es" serve --quiet --port 0 $serve_args 2>"$work/serve.log" &
srv_pid=$!
port=""
for _ in $(seq 600); do
  kill -0 "$srv_pid" 2>/dev/null || { cat "$work/serve.log" >&2; echo "soak: the server exited" >&2; exit 1; }
  port=$(sed -nE 's|.*serving .* on http://[^:]+:([0-9]+)/v2.*|\1|p' "$work/serve.log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
  port=""
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/serve.log" >&2; echo "soak: the server did not get ready" >&2; exit 1; }
echo "# $(grep '^edgeserve: serving' "$work/serve.log") (pid $srv_pid)"
echo "# machine: $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"

st=0
"$hostile" soak --port "$port" --src 127.0.10.1 --clients "$clients" --requests "$requests" \
  --max-seconds "$max_seconds" --server-pid "$srv_pid" --report-every "$report_every" \
  --warmup "$warmup" --rss-tolerance "$tolerance" --idle-wait "$idle_wait" "${reqs[@]}" || st=$?
echo "# server: peak RSS $(awk '/^VmHWM/ {print $2, $3}' "/proc/$srv_pid/status")," \
     "CPU $(awk -v tk="$(getconf CLK_TCK)" '{printf "%.0f s", ($14 + $15) / tk}' "/proc/$srv_pid/stat")"
kill -TERM "$srv_pid"
wait "$srv_pid" || { echo "soak: the server exited with status $? on SIGTERM" >&2; st=1; }
grep '^edgeserve: stopped' "$work/serve.log" | sed 's/^/# /' || true
srv_pid=""
exit $st
