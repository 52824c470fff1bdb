#!/usr/bin/env bash
# The whole test suite: lint, format, types, then pytest (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# PostgreSQL on 127.0.0.1:5432 (installed and started when missing); without it those tests skip (CI requires it).
scripts/postgres.sh || echo "test: could not set up PostgreSQL; its tests will skip" >&2
# Redis on 127.0.0.1:6379, the Celery broker of the high-availability test; without it that test skips (CI requires it).
scripts/redis.sh || echo "test: could not set up Redis; the high-availability test will skip" >&2
# The UI's browser test drives Debian's Chromium; without it that one test skips (CI requires it).
scripts/install-browser.sh || echo "test: could not install chromium; the browser test will skip" >&2

echo "== ruff check" && .venv/bin/ruff check .
echo "== ruff format --check" && .venv/bin/ruff format --check .
echo "== mypy" && .venv/bin/mypy
echo "== lint-imports (the layers of CONTRIBUTING.md)" && .venv/bin/lint-imports --no-cache
echo "== pytest" && .venv/bin/python -m pytest "$@"

# The whole suite (no pytest arguments) ends with the live demo, with the Airflow peer, as a new
# user runs it: it exits 1 unless every example job ends where and how the README says.
# IRIS_SKIP_DEMO=1 leaves it out.
if [ "$#" -eq 0 ] && [ "${IRIS_SKIP_DEMO:-0}" != "1" ]; then
    echo "== demo (scripts/demo.sh --with-airflow-peer --exit-when-done)"
    started=$SECONDS
    scripts/demo.sh --with-airflow-peer --exit-when-done --home .artifacts/demo
    echo "demo: $((SECONDS - started)) s"
fi
