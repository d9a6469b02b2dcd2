#!/usr/bin/env bash
# The test suite: etprop's own tests, then every property under the
# deterministic `ci` Hypothesis profile. Extra arguments go to pytest.
source "$(dirname "$0")/venv.sh"
# A hung example (finding COREAI-004) costs at most this long in CI.
export ETPROP_EXAMPLE_TIMEOUT="${ETPROP_EXAMPLE_TIMEOUT:-240}"
# worksteal: an idle worker takes queued tests from the busy one, so a few long
# tests at the end of one worker's share do not leave the other waiting.
# --durations: the slowest tests, printed every run (the suite's speed is watched).
exec python -m pytest tests properties --etprop-profile ci --etprop-artifacts artifacts/ci \
  -n 2 --dist worksteal --durations 25 --timeout 900 -q -rfEx "$@"
