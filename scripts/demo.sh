#!/usr/bin/env bash
# The live demo: Airflow federating jobs between a CPU cluster and two GPU peers on this machine.
# Stops on Ctrl-C. Options: --exit-when-done, --port N, --home DIR (see devtools/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m devtools.demo "$@"
