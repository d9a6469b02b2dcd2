#!/usr/bin/env bash
# The gate across Python environments on four real cases (outside the test
# command: about 45 minutes on 2 cores). Usage: bash ci/gate_demo.sh [CASE...]
# with CASE among upgrade, plugin, broken, same (default: all four).
#   upgrade: coreai-torch 0.4.2 / coreai-core 1.0.0b2 against the newest release (0.4.3 / 1.0.0b3): FAIL
#   plugin:  stock xnnpack against the fold candidate installed as an outside package: PASS, improvements listed
#   broken:  an XNNPACK relu deliberately wrong (gate_demo/broken_relu_sitecustomize.py): FAIL, shrunk repro
#   same:    the same environment on both sides: PASS, no differences
# Environments go to artifacts/gate-demo/envs (layered over .venv, made by `etprop env` each run),
# each case's output to artifacts/gate-demo/CASE.log, the times to artifacts/gate-demo/times.txt.
source "$(dirname "$0")/venv.sh"
# venv.sh stops on the first failing command; a failing gate is an expected outcome here.
set +e -uo pipefail
out="$root/artifacts/gate-demo"
envs="$out/envs"
mkdir -p "$envs"
base="$root/.venv/bin/python"
layer() {  # layer NAME ARGS...: a layered environment, made anew (a few seconds) with this checkout's etprop
  rm -rf "${envs:?}/$1"
  etprop env "$envs/$1" "${@:2}" >/dev/null
  echo "$envs/$1/bin/python"
}
gate() {  # gate CASE ARGS...: run one case, keep its output and time
  rm -rf "$out/$1"
  local started=$SECONDS
  (cd "$out" && etprop gate --artifacts "$out/$1" "${@:2}") 2>&1 | grep --line-buffered -v -E "Warning|warn\(|return func" \
    | tee "$out/$1.log"
  local code=${PIPESTATUS[0]}
  echo "$1: exit $code in $((SECONDS - started)) s" | tee -a "$out/times.txt"
}
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(upgrade plugin broken same)
for case in "${cases[@]}"; do
  case "$case" in
    upgrade) gate upgrade --baseline-env "$base" --flow coreai \
               --candidate-env "$(layer coreai-torch-0.4.3 --install coreai-torch==0.4.3 --install coreai-core==1.0.0b3)" ;;
    plugin)  gate plugin --baseline-env "$base" --baseline xnnpack --candidate xnnpack+fold-pkg \
               --candidate-env "$(layer fold-plugin --install "$root/ci/gate_demo/fold_plugin")" ;;
    broken)  gate broken --baseline-env "$base" --flow xnnpack \
               --candidate-env "$(layer broken-relu --sitecustomize "$root/ci/gate_demo/broken_relu_sitecustomize.py")" ;;
    same)    gate same --baseline-env "$base" --candidate-env "$base" --flow xnnpack ;;
    *) echo "unknown case '$case'; the cases are: upgrade plugin broken same" >&2; exit 2 ;;
  esac
done
