#!/usr/bin/env bash
# The test suite: etprop's own tests, then every property under the
# deterministic `ci` Hypothesis profile. Extra arguments go to pytest.
source "$(dirname "$0")/venv.sh"
exec python -m pytest tests properties --etprop-profile ci --etprop-artifacts artifacts/ci \
  -n 2 --timeout 900 -q -rfEx "$@"
