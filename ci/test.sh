#!/usr/bin/env bash
# The test suite: etprop's own tests, then every property under the
# deterministic `ci` Hypothesis profile. Extra arguments go to pytest.
source "$(dirname "$0")/venv.sh"
# A hung example (finding COREAI-004) costs at most this long in CI; its
# memory grows about 0.1 GB/s, so the worker's 3 GB (workers of the test
# command's programs hold under 1 GB) stops it first, in about 25 s.
export ETPROP_EXAMPLE_TIMEOUT="${ETPROP_EXAMPLE_TIMEOUT:-240}"
export ETPROP_WORKER_MEMORY_GB="${ETPROP_WORKER_MEMORY_GB:-3}"
# worksteal: an idle worker takes queued tests from the busy one, so a few long
# tests at the end of one worker's share do not leave the other waiting.
# --durations: the slowest tests, printed every run (the suite's speed is watched).
exec python -m pytest tests properties --etprop-profile ci --etprop-artifacts artifacts/ci \
  -n 2 --dist worksteal --durations 25 --timeout 900 -q -rfEx "$@"
