# Sourced by the README's commands: create .venv if needed and (re)install
# etprop with every extra whenever pyproject.toml changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
fi
stamp="$venv/.etprop-installed"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  # torch first, pinned: this machine serves the 2.13.0 CPU build from disk.
  "$venv/bin/python" -m pip install -q "torch==2.13.0"
  "$venv/bin/python" -m pip install -q -e "$root[coreai,redis,models,dev,mutation]"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
