#!/usr/bin/env bash
# Checks the deployment files offline, with no cluster and no image registry:
# every manifest under deploy/ against the Kubernetes schemas (the
# kubernetes-models package) or, for KServe's ServingRuntime and
# InferenceService, against deploy/schemas (no npm package ships KServe's),
# plus the project's rules and deploy/Containerfile
# (scripts/deploy/validate.mjs says which). Then proves the check can fail:
# the validator's --self-test breaks the files in memory one known way at a
# time, and a copy of deploy/ with a broken manifest on disk must be
# rejected. Under a minute once the packages are installed.
#   scripts/deploy-check.sh
# Needs node and npm (scripts/setup/deps.sh installs them). The packages go
# to .cache/deploy-check, pinned to exact versions (below), installed once
# with their install scripts off. Exits 0 when everything passed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned: the versions this check was written and verified with.
# kubernetes-models 5.1.0 declares node >= 22 but runs on Debian 12's
# node 18/20 for what is used here (the schemas are plain compiled code).
pkgs=(kubernetes-models@5.1.0 yaml@2.9.1 ajv@8.20.0)
mods=.cache/deploy-check
stamp="$mods/installed-${pkgs[*]// /+}"
stamp=${stamp//[@ ]/_}

command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "deploy-check: node and npm are needed (scripts/setup/deps.sh)" >&2; exit 2; }
if [ ! -f "$stamp" ]; then
  echo "deploy-check: installing ${pkgs[*]} into $mods"
  rm -rf "$mods"
  mkdir -p "$mods"
  npm install --ignore-scripts --no-audit --no-fund --loglevel=error --save-exact \
    --prefix "$mods" "${pkgs[@]}" >/dev/null
  touch "$stamp"
fi

rc=0
echo "== deploy/ as it is, and the validator's self-test"
node scripts/deploy/validate.mjs --modules "$mods/node_modules" --self-test || rc=1

# The same validator on a copy of the files with one manifest broken on disk
# (memory limit no longer equal to the request; a typo'd readiness path):
# it must exit 1 and name both problems.
echo
echo "== a broken copy on disk must be rejected"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/scripts/setup"
cp -r deploy "$tmp/deploy"
cp scripts/setup/deps.sh "$tmp/scripts/setup/deps.sh"
f="$tmp/deploy/k8s/deployment.yaml"
awk '/limits:/ { lim = 1 } lim && /memory:/ { sub(/memory: .*/, "memory: 2Gi"); lim = 0 } { print }' "$f" >"$f.new"
sed -i 's|path: /v2/health/ready|path: /v2/health/readyz|' "$f.new"
mv "$f.new" "$f"
if out=$(node scripts/deploy/validate.mjs --root "$tmp" --modules "$PWD/$mods/node_modules" 2>&1); then
  echo "$out"
  echo "FAILED  broken copy accepted (exit 0)"
  rc=1
elif grep -q "memory request 1Gi != limit 2Gi" <<<"$out" && grep -q "readinessProbe path /v2/health/readyz" <<<"$out"; then
  grep -E "FAILED|memory request|readinessProbe path" <<<"$out" | sed 's/^/  | /'
  echo "ok      broken copy rejected (exit 1, both problems named)"
else
  echo "$out"
  echo "FAILED  broken copy rejected, but not for the two problems made"
  rc=1
fi

echo
[ $rc -eq 0 ] && echo "deploy-check: all passed" || echo "deploy-check: FAILED"
exit $rc
