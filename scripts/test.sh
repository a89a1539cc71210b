#!/usr/bin/env bash
# Set up a fresh virtual environment from the project's own files and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# The browser tests drive Debian's Chromium (nothing is downloaded by Playwright).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi

python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q '.[test]'
# Lint, format and types first: they take seconds (mypy ~1 min cold) and name the line at fault.
ruff check --quiet .
ruff format --check --quiet .
mypy
# The tests import the installed package (not the source folders), as a user would. They run
# on one worker per CPU (pytest-xdist); every test that reads the shared fault-scenario runs
# goes to one worker (tests/conftest.py), so each scenario runs once, and that worker lowers
# the others to nice 19 so they do not read as a fault of their own.
pytest -n auto --dist loadgroup "$@"
