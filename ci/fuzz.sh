#!/usr/bin/env bash
# The main job: a fuzz campaign over every available flow (default budget
# 5 minutes; extra arguments go to `etprop fuzz`, e.g. --minutes 30 --workers 2).
source "$(dirname "$0")/venv.sh"
exec etprop fuzz --minutes 5 "$@"
