#!/usr/bin/env bash
# The GPU check: cetlab's real paths on a machine with NVIDIA GPUs, in one run.
#
#   bench/gpu_check.sh [--dir DIR] [--python PY] [--gpu INDEX] [--window-s S] [--overhead-only]
#
# doctor; an agent with `gpus: nvml` on loopback and `cetlab status --json` idle and under a
# matmul load; a LoRA through the agent (precision: auto) on a ~150M-parameter random Llama
# made on the spot; a transformers model warm -> completion -> cold; costs from the measured
# power; the agent's CPU and RSS beside an nvitop-style NVML loop and `nvidia-smi -l 1`, as
# ratios. Needs nothing from the network. Without an NVIDIA GPU it stops at once (exit 3).
set -euo pipefail

usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "options:"
    echo "  --dir DIR       where the lab, the model and the runs go (default: a new temp dir)"
    echo "  --python PY     the Python with cetlab[train] installed (default: .venv/bin/python, else python3)"
    echo "  --gpu INDEX     the GPU to load and train on (NVML/PCI order; default 0)"
    echo "  --window-s S    the overhead measuring window (default 30)"
    echo "  --overhead-only only the agent beside the nvitop-style loop: bench_agent_overhead.py --nvml (3 rounds of S)"
    echo "exit: 0 done, 1 a step failed, 2 usage, 3 no NVIDIA GPU here"
}

here="$(cd "$(dirname "$0")/.." && pwd)"
dir="" python="" gpu=0 window=30 overhead_only=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --dir) dir="${2:?--dir needs a folder}"; shift 2 ;;
        --python) python="${2:?--python needs a path}"; shift 2 ;;
        --gpu) gpu="${2:?--gpu needs an index}"; shift 2 ;;
        --window-s) window="${2:?--window-s needs seconds}"; shift 2 ;;
        --overhead-only) overhead_only=1; shift ;;
        *) echo "gpu_check: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$gpu" =~ ^[0-9]+$ ]] || { echo "gpu_check: --gpu must be a GPU index, not '$gpu'" >&2; exit 2; }
[[ "$window" =~ ^[0-9]+$ && "$window" -gt 0 ]] || { echo "gpu_check: --window-s must be a whole number of seconds" >&2; exit 2; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here: nvidia-smi is not installed (no NVIDIA driver); nothing was run" >&2
    exit 3
fi
if ! listed="$(nvidia-smi -L 2>&1)" || ! grep -q '^GPU [0-9]' <<<"$listed"; then
    echo "gpu_check: no NVIDIA GPU here: nvidia-smi -L lists none (${listed:-no output}); nothing was run" >&2
    exit 3
fi
if ! grep -q "^GPU $gpu:" <<<"$listed"; then
    echo "gpu_check: --gpu $gpu: no such GPU; nvidia-smi -L lists:" >&2
    echo "$listed" >&2
    exit 2
fi

if [[ -z "$python" ]]; then
    python="$here/.venv/bin/python"
    [[ -x "$python" ]] || python="$(command -v python3)"
fi
dir="${dir:-$(mktemp -d -t cetlab-gpu-check-XXXXXX)}"
echo "gpu_check: $(wc -l <<<"$listed") GPU(s); using GPU $gpu, $python, $dir"
echo "$listed" | sed 's/^/  /'
cd "$here"
if [[ "$overhead_only" == 1 ]]; then
    exec "$python" bench/bench_agent_overhead.py --nvml --window-s "$window"
fi
exec "$python" -m bench.gpu_check --dir "$dir" --gpu "$gpu" --window-s "$window"
