#!/usr/bin/env bash
# GRPO baseline of cw_grpo_openrs_r1-distill-qwen-1.5b.sh (the CW-GRPO paper's Table 2's GRPO row (52.6)).
# The same launch as cw_grpo_openrs_r1-distill-qwen-1.5b.sh
# (its flags, GPU count and environment variables apply), with grpo_openrs_r1-distill-qwen-1.5b.yaml.
#   bash examples/cluster/grpo_openrs_r1-distill-qwen-1.5b.sh [extra flags]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RECIPE="$here/grpo_openrs_r1-distill-qwen-1.5b.yaml" exec bash "$here/cw_grpo_openrs_r1-distill-qwen-1.5b.sh" "$@"
