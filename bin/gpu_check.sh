#!/usr/bin/env bash
# The GPU check moved to tools/gpu_check.sh (a maintainer tool); this old name forwards to it for
# one release, with a line that says so.
echo "bin/gpu_check.sh moved to tools/gpu_check.sh; the old name goes in 0.2.0" >&2
exec bash "$(dirname "$0")/../tools/gpu_check.sh" "$@"
