#!/usr/bin/env bash
# GVPO on MATH with Qwen2.5-Math-7B (the GVPO paper's §4, App. A.1).
#   one 8-GPU node:          bash examples/cluster/gvpo_math_qwen2.5-math-7b.sh
#   N-node Ray cluster:      NODES=N bash examples/cluster/gvpo_math_qwen2.5-math-7b.sh
#                            (on the Ray head, after examples/cluster/ray_start.sh on every node)
#   print the launch only:   DRY_RUN=1 bash examples/cluster/gvpo_math_qwen2.5-math-7b.sh
# Extra arguments override the config, e.g. --task.path /data/... or --run.steps 10.
# RECIPE=other.yaml runs another recipe through this same launch (its GRPO baseline script does).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec bash "$here/launch.sh" "${RECIPE:-$here/gvpo_math_qwen2.5-math-7b.yaml}" "$@"
