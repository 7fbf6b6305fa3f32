#!/usr/bin/env bash
# Snakemake (--sdm conda) runs this inside the environment it has just created from
# envs/workflow.yaml, from the workflow's working directory (the repository root, where the rules'
# paths start). It installs the workflow's package, editable: jobs run the checkout's code, whose
# files are the rules' inputs; and envs/no-deps.txt, which a conda file cannot install without
# dependencies. No build isolation: setuptools is pinned in the environment.
set -euo pipefail
lib="$PWD/workflow/lib"
if [ ! -f "$lib/pyproject.toml" ]; then
    echo "envs/workflow.post-deploy.sh: no $lib/pyproject.toml; run snakemake from the repository root" >&2
    exit 1
fi
python -m pip install --no-deps --no-build-isolation -r "$PWD/envs/no-deps.txt" -e "$lib"
