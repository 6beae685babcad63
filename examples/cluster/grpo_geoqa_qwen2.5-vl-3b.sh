#!/usr/bin/env bash
# GRPO baseline of gpg_geoqa_qwen2.5-vl-3b.sh (the GPG paper's Table 5's GRPO row (47.48)).
# The same launch as gpg_geoqa_qwen2.5-vl-3b.sh
# (its flags, GPU count and environment variables apply), with grpo_geoqa_qwen2.5-vl-3b.yaml.
#   bash examples/cluster/grpo_geoqa_qwen2.5-vl-3b.sh [extra flags]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RECIPE="$here/grpo_geoqa_qwen2.5-vl-3b.yaml" exec bash "$here/gpg_geoqa_qwen2.5-vl-3b.sh" "$@"
