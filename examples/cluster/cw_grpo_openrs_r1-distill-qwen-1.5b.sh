#!/usr/bin/env bash
# CW-GRPO on Open-RS with DeepSeek-R1-Distill-Qwen-1.5B (the CW-GRPO paper's Table 5).
#   one 8-GPU node:          bash examples/cluster/cw_grpo_openrs_r1-distill-qwen-1.5b.sh
#   N-node Ray cluster:      NODES=N bash examples/cluster/cw_grpo_openrs_r1-distill-qwen-1.5b.sh
#                            (on the Ray head, after examples/cluster/ray_start.sh on every node)
#   print the launch only:   DRY_RUN=1 bash examples/cluster/cw_grpo_openrs_r1-distill-qwen-1.5b.sh
# Extra arguments override the config, e.g. --task.path /data/... or --run.steps 10.
# RECIPE=other.yaml runs another recipe through this same launch (its GRPO baseline script does).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec bash "$here/launch.sh" "${RECIPE:-$here/cw_grpo_openrs_r1-distill-qwen-1.5b.yaml}" "$@"
