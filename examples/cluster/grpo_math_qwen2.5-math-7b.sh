#!/usr/bin/env bash
# GRPO baseline of gvpo_math_qwen2.5-math-7b.sh (the GVPO paper's Table 1's GRPO row).
# The same launch as gvpo_math_qwen2.5-math-7b.sh
# (its flags, GPU count and environment variables apply), with grpo_math_qwen2.5-math-7b.yaml.
#   bash examples/cluster/grpo_math_qwen2.5-math-7b.sh [extra flags]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RECIPE="$here/grpo_math_qwen2.5-math-7b.yaml" exec bash "$here/gvpo_math_qwen2.5-math-7b.sh" "$@"
