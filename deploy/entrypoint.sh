#!/bin/sh
# The container's entrypoint: `serve` checks that there are models to serve
# (fetching them first in the image's fetch variant), then the server
# replaces this shell (exec) so that it is PID 1 and gets SIGTERM itself.
# Any other command (run, plan, --help, ...) goes to edgeserve unchanged.
#
# Where the models are: the folder after --model-repository when given (a
# repository, one sub-folder per model), else $ES_MODEL_DIR (the flat folder
# of the five target models, default /models). With --config the config
# names them, and nothing is checked here.
#
# An empty model folder: in the fetch variant (npm and the fetch script are
# in the image) the target models are fetched into it, so it must be
# writable (an emptyDir, not the read-only volume); otherwise the container
# stops at once with a message, rather than serve nothing and look healthy.
set -eu
fetch=/usr/local/share/edgeserve/fetch-models.sh

[ "${1:-}" = serve ] || exec /usr/local/bin/edgeserve "$@"

dir=${ES_MODEL_DIR:-/models}
prev="" config=0
for a in "$@"; do
  case $prev in
    --model-repository) dir=$a ;;
    --config) config=1 ;;
  esac
  prev=$a
done

has_models() {
  [ -d "$1" ] && [ -n "$(find "$1" -maxdepth 2 \( -name '*.onnx' -o -name '*.esm' \) -print 2>/dev/null | head -n 1)" ]
}

if [ $config -eq 0 ] && ! has_models "$dir"; then
  if [ -x "$fetch" ] && command -v npm >/dev/null 2>&1; then
    echo "edgeserve-entrypoint: no models in $dir: fetching the target models" >&2
    # npm wants a writable cache and home; the image's user has neither.
    export HOME="${TMPDIR:-/tmp}" npm_config_cache="${TMPDIR:-/tmp}/npm-cache"
    "$fetch" "$dir"
  else
    echo "edgeserve-entrypoint: no models (.onnx/.esm) in $dir: mount a model folder there" \
         "(or build the image with --target fetch to fetch them at start)" >&2
    exit 1
  fi
fi
exec /usr/local/bin/edgeserve "$@"
