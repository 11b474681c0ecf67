#!/usr/bin/env bash
# Trains the embedded defaults (plain and LoRA, experts split over 2 processes) with the LOWEST versions
# pyproject.toml declares for transformers, trl, peft, accelerate and datasets, so a lower bound is a version that
# was run, not a guess (issue 48). Not a unit test: it downloads those wheels. Run it whenever a bound moves.
#
#   bash bench/lowest_versions.sh                         # the declared lower bounds
#   PINS="transformers==5.18.0 peft==0.19.0" bash bench/lowest_versions.sh   # try other versions (bisecting)
#   CONFIGS=tiny-qwen3-moe-lora ...                     # one of the two defaults only
#
# The fresh venv holds only the pinned libraries (and whatever they need that the base lacks); everything else,
# torch included (a CPU wheel is 200 MB, a CUDA one several GB), comes from BASE's site-packages, appended after
# the venv's own through a .pth line, so the pinned versions win. BASE defaults to this checkout's .venv
# (install.sh). PYTHONPATH points at this checkout, so its halo_core and plugins run whatever BASE installed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
base_python=${BASE_PYTHON:-$repo/.venv/bin/python}
venv=${VENV:-${TMPDIR:-/tmp}/halo-lowest-versions}
# The declared lower bound of each library, read from pyproject.toml (">=X" becomes "==X").
declared=$("$base_python" - <<'EOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for dep in deps:
    m = re.match(r"(transformers|trl|peft|accelerate|datasets)>=([\w.]+)", dep)
    if m:
        print(f"{m[1]}=={m[2]}")
EOF
)
pins=$(echo $declared ${PINS:-} | tr ' ' '\n' | awk -F'==' '{v[$1]=$0} END {for (k in v) print v[k]}' | sort)
echo "pins: $(echo $pins)"
base_site=$("$base_python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf "$venv"
"$base_python" -m venv "$venv"
venv_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# addsitedir (not a bare path) so BASE's own .pth files (its editable installs) are read too.
echo "import site; site.addsitedir('$base_site')" > "$venv_site/zz_halo_base.pth"
# pip sees BASE's packages as installed; those outside the venv it leaves alone ("outside environment").
if ! log=$("$venv/bin/python" -m pip install -q --disable-pip-version-check $pins 2>&1); then
  echo "$log" | grep -E "ERROR|conflict|requires" >&2
  exit 1
fi
"$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
  | grep -iE '^(torch|transformers|trl|peft|accelerate|datasets|sentence-transformers) ' | sed 's/^/  /'
export PYTHONPATH="$repo:$(ls -d "$repo"/plugins/*/ | tr '\n' ':')"
out=$(mktemp -d)
status=0
for config in ${CONFIGS:-tiny-qwen3-moe tiny-qwen3-moe-lora}; do
  start=$(date +%s)
  if "$venv/bin/python" -m halo_cli launch sft "templates/configs/$config.yaml" --nproc 2 \
      -- --output_dir="$out/$config" >"$out/$config.log" 2>&1; then
    echo "$config: trained in $(( $(date +%s) - start )) s; $(grep -oE "train_loss[^,}]*" "$out/$config.log" | tail -1)"
  else
    status=1
    echo "$config: FAILED after $(( $(date +%s) - start )) s; last lines:"
    tail -5 "$out/$config.log" | sed 's/^/  /'
  fi
done
rm -rf "$out"
exit $status
