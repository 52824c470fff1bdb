#!/usr/bin/env bash
# Re-resolves requirements/dev.lock from pyproject.toml (run after changing dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/uv pip compile pyproject.toml --extra dev --python-version 3.11 --generate-hashes \
    --no-header --output-file requirements/dev.lock "$@"
