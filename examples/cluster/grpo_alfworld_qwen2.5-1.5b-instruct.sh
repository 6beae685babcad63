#!/usr/bin/env bash
# GRPO baseline of gmpo_alfworld_qwen2.5-1.5b-instruct.sh (the GMPO paper's Table 6's GRPO row (72.8)).
# The same launch as gmpo_alfworld_qwen2.5-1.5b-instruct.sh
# (its flags, GPU count and environment variables apply), with grpo_alfworld_qwen2.5-1.5b-instruct.yaml.
#   bash examples/cluster/grpo_alfworld_qwen2.5-1.5b-instruct.sh [extra flags]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RECIPE="$here/grpo_alfworld_qwen2.5-1.5b-instruct.yaml" exec bash "$here/gmpo_alfworld_qwen2.5-1.5b-instruct.sh" "$@"
