# Sourced by the end-to-end accuracy tests (quantize, precision), after they
# set $work (a scratch folder) and fail=0.
#   check NAME COMMAND...: runs a check, prints its lines prefixed by NAME,
#     sets fail=1 when it fails.
#   bad WANT_STATUS WANT_TEXT COMMAND...: a refusal: the command must exit
#     WANT_STATUS with WANT_TEXT in its output, else fail=1.
#   text_ppm OUT.ppm WIDTH HEIGHT POINTSIZE X Y TEXT: black text on white.
#   serve_start LOG SERVE_OPTIONS...: `$es serve --port 0` in the background;
#     sets spid, and port once it answers /v2/health/ready (empty if it
#     died or took over a minute; the caller's checks then fail).
check() {
  local name=$1
  shift
  if "$@" >"$work/check.log" 2>&1; then
    sed "s/^/  $name: /" "$work/check.log"
  else
    sed "s/^/  $name: /" "$work/check.log"
    echo "FAIL $name"
    fail=1
  fi
}
bad() {
  local want=$1 text=$2
  shift 2
  "$@" >"$work/bad.log" 2>&1
  local st=$?
  if [ $st -ne "$want" ] || ! grep -q -- "$text" "$work/bad.log"; then
    echo "FAIL refusal ($*): status $st, wanted $want and '$text':"; cat "$work/bad.log"; fail=1
  else
    echo "  ok: $(head -1 "$work/bad.log")"
  fi
}
text_ppm() {
  convert -size "$2x$3" xc:white -font DejaVu-Sans -fill black -pointsize "$4" \
    -annotate "+$5+$6" "$7" -depth 8 "$1"
}
serve_start() {
  local log=$1
  shift
  "$es" serve --port 0 "$@" >"$log" 2>&1 &
  spid=$!
  port=""
  for _ in $(seq 600); do
    port=$(sed -n 's#.*serving .* on http://[0-9.]*:\([0-9]*\)/v2.*#\1#p' "$log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && return 0
    kill -0 $spid 2>/dev/null || break
    sleep 0.1
  done
  return 1
}
