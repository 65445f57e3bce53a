#!/usr/bin/env bash
# Exports the model zoo: torchvision's architectures with random weights, to
# ONNX, into .cache/zoo (scripts/zoo/export.py; its options pass through, e.g.
# --all for the extra models, --models a,b), then the tiny decoder with a KV
# cache (scripts/zoo/export_decoder.py) and torchvision's detectors with
# their post-processing (scripts/zoo/export_detectors.py, into
# .cache/zoo/detectors, checked against ONNX Runtime; about two minutes and
# 680 MB the first time). Installs Debian's PyTorch and
# torchvision first (scripts/setup/deps.sh --zoo). Models already exported
# with the same torch version, opset and variant are skipped.
#   scripts/zoo/export.sh [export.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup/deps.sh --zoo
# Debian's interpreter: its dist-packages hold python3-torch, whatever
# python3 comes first on PATH.
/usr/bin/python3 scripts/zoo/export.py "$@"
# The decoder with a KV cache the sequence tests serve (a few seconds).
/usr/bin/python3 scripts/zoo/export_decoder.py
# The detectors test_detectors runs (ONNX Runtime checks them when it is
# installed: scripts/setup/install-ort.sh).
exec /usr/bin/python3 scripts/zoo/export_detectors.py
