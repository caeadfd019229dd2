#!/usr/bin/env bash
# GPU check (run on a CUDA machine from the repository root): 5 bf16 GRPO steps of a Qwen2.5-0.5B-shaped
# random model at 16 x 8 x 512 under a token budget (step-time breakdown, peak CUDA memory, tokens/s), the
# same with rollouts from vLLM (bf16 mismatch metrics), then the quickstart on CUDA. CPU path of the same logic: python benchmarks/gpu_check.py --tiny --device cpu
set -euo pipefail
PY=${PY:-python}
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONPATH=${PYTHONPATH:-$PWD}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$PY benchmarks/gpu_check.py --device cuda "$@"
# the same steps with rollouts from vLLM in bf16 (the extra: pip install -e '.[vllm]'): speed, and the
# bf16 engine-vs-trainer mismatch (offpolicy/*) that TIS corrects
if $PY -c "import vllm" 2>/dev/null; then
  $PY benchmarks/gpu_check.py --device cuda --engine vllm "$@"
else
  echo "vllm is not installed: pip install -e '.[vllm]' to measure rollout.engine=vllm on this GPU"
fi
out=$(mktemp -d)
$PY -c "from ablate.cli.main import main; main()" train configs/quickstart.yaml --set device=cuda --set steps=50 --out "$out/quickstart" --quiet
$PY -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; print('quickstart on CUDA:', {k: round(v, 4) for k, v in r.items() if k.startswith('eval/pass')})" "$out/quickstart/evals.jsonl"
