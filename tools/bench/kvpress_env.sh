#!/usr/bin/env bash
# kvpress's own environment for the side-by-side KV-cache bench (issue 36): kvpress 0.5.5 pins transformers < 5.3,
# which pins huggingface_hub < 2, below what the project runs, so it never enters the project's venv. The torch
# build is the project's, shared through a folder of links (torch, its CUDA libraries, triton) on a .pth line, so
# nothing of several GB is downloaded or copied; the rest comes from the package index.
#   tools/bench/kvpress_env.sh PROJECT_VENV OUT_VENV
set -euo pipefail
project=${1:?project venv}; out=${2:?kvpress venv}
site=$(ls -d "$project"/lib/python3*/site-packages)
python3 -m venv "$out"
mkdir -p "$out/torch_only"
for p in "$site"/torch "$site"/torch-*.dist-info "$site"/torchgen "$site"/functorch "$site"/triton "$site"/triton-*.dist-info \
         "$site"/nvidia "$site"/nvidia_*.dist-info "$site"/cuda*; do
  [ -e "$p" ] && ln -sfn "$p" "$out/torch_only/"
done
echo "$(cd "$out/torch_only" && pwd)" > "$(ls -d "$out"/lib/python3*/site-packages)/zz_project_torch.pth"
"$out/bin/pip" install --quiet --disable-pip-version-check "kvpress==0.5.5" sympy networkx jinja2 fsspec filelock \
  typing_extensions
"$out/bin/python" -c "import torch, transformers, kvpress; print('kvpress', kvpress.__name__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
