#!/usr/bin/env bash
# The main job: what the federation does with a realistic state (see examples/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
example=${1:-examples/simulate-contention.json}
echo "== iris-federation simulate $example" >&2
.venv/bin/iris-federation simulate "$example"
