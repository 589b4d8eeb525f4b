#!/bin/bash
# Prepare a same-call A/B of the megakernel against another revision (run on the development machine,
# from the repo root):
#   bash backend/megakernel/ab_tree.sh REV      # e.g. HEAD~3, a commit id
# exports REV's tree into ab_base/ (git-ignored) and builds its kernel object into ab_base/.mkcache
# (nvcc, no GPU needed), so that the device call only compiles the two small bindings. Then, with the
# device tool, carry both kernel caches and the tree:
#   run(command="bash backend/megakernel/gpu_run.sh ab", carry=[".mkcache", "ab_base"])
# whose `ab` stage runs the engine harness (mkcode bench decode, graph + megakernel, BS 1 and 8 at
# 8K) on REV and on the working tree, alternating twice (B, A, B, A): between device calls the
# harness varied by up to ~6 % in session 4, within one call the order effects stay visible.
set -eu
rev=${1:?usage: ab_tree.sh REV}
root=$(git rev-parse --show-toplevel)
cd "$root"
rm -rf ab_base
mkdir ab_base
git archive "$rev" | tar -x -C ab_base
echo "$rev $(git rev-parse "$rev")" > ab_base/REV
# build REV's kernel object with REV's own build code (its csrc/, its cache key)
shim=$(mktemp -d)
mkdir -p "$shim/mkcode"
for d in app backend tools; do ln -sfn "$root/ab_base/$d" "$shim/mkcode/$d"; done
touch "$shim/mkcode/__init__.py"
(cd "$shim" && PYTHONPATH="$shim" MKCODE_KERNEL_CACHE="$root/ab_base/.mkcache" \
  "${PYTHON:-$root/.venv/bin/python}" -m mkcode.app.cli kernels build --compile-only)
rm -rf "$shim"
echo "ab_base/ holds $(cat ab_base/REV); carry [\".mkcache\", \"ab_base\"] and run: bash backend/megakernel/gpu_run.sh ab"
