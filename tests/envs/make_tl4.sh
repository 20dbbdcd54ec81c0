#!/usr/bin/env bash
# A venv with TransformerLens 4.3 beside the main environment (which has TransformerLens 3.9, needed by
# HookedTransformer): tests/edges/test_edges_tl4.py runs its reference script there. Usage:
#   bash tests/envs/make_tl4.sh /opt/tl4 && export HOOKRUN_TL4_PYTHON=/opt/tl4/bin/python
set -euo pipefail
DIR=${1:-/opt/tl4}
python3 -m venv --system-site-packages "$DIR"
"$DIR/bin/pip" install --quiet "transformer-lens==4.3.0"
# the venv's own TransformerLens shadows the main environment's 3.9
"$DIR/bin/python" - <<'PY'
import transformer_lens, importlib.metadata as m
v = m.version("transformer-lens")
assert v.startswith("4.3"), v
from transformer_lens.tools.analysis.attribution_patching import attribution_patch, faithfulness  # noqa: F401
print("transformer-lens", v, "at", transformer_lens.__file__)
PY
