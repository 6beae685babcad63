#!/usr/bin/env bash
# GiGPO on ALFWorld with Qwen2.5-1.5B-Instruct (the GiGPO paper's ALFWorld run, arXiv 2505.10978); needs the mmrl:alfworld image.
#   one 8-GPU node:          bash examples/cluster/gigpo_alfworld_qwen2.5-1.5b-instruct.sh
#   N-node Ray cluster:      NODES=N bash examples/cluster/gigpo_alfworld_qwen2.5-1.5b-instruct.sh
#                            (on the Ray head, after examples/cluster/ray_start.sh on every node)
#   print the launch only:   DRY_RUN=1 bash examples/cluster/gigpo_alfworld_qwen2.5-1.5b-instruct.sh
# Extra arguments override the config, e.g. --task.path /data/... or --run.steps 10.
# RECIPE=other.yaml runs another recipe through this same launch.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec bash "$here/launch.sh" "${RECIPE:-$here/gigpo_alfworld_qwen2.5-1.5b-instruct.yaml}" "$@"
