#!/bin/bash
# Prepare a same-call A/B of the megakernel against another revision (run on the development machine,
# from the repo root):
#   bash backend/megakernel/ab_tree.sh REV [DIR]  # e.g. HEAD~3, a commit id; DIR: ab_base (default) or
#                                                 # another ab_* folder, for several trees in one call
# exports REV's tree into ab_base/ (git-ignored) and builds its kernel object into ab_base/.mkcache
# (nvcc, no GPU needed), so that the device call only compiles the two small bindings. Then, with the
# device tool, carry both kernel caches and the tree:
#   run(command="bash backend/megakernel/gpu_run.sh ab", carry=[".mkcache", "ab_base"])
# whose `ab` stage runs the engine harness (mkcode bench decode, graph + megakernel, BS 1 and 8 at
# 8K) on REV and on the working tree, alternating twice (B, A, B, A): between device calls the
# harness varied by up to ~6 % (2026-11-29); within one call the order effects stay visible.
set -eu
rev=${1:?usage: ab_tree.sh REV [DIR]}
dir=${2:-ab_base}
[[ $dir == ab_* && $dir != */* ]] || { echo "DIR must be a top-level ab_* folder (git-ignored)"; exit 2; }
root=$(git rev-parse --show-toplevel)
cd "$root"
rm -rf "$dir"
mkdir "$dir"
git archive "$rev" | tar -x -C "$dir"
echo "$rev $(git rev-parse "$rev")" > "$dir/REV"
# build REV's kernel object with REV's own build code (its csrc/, its cache key)
shim=$(mktemp -d)
mkdir -p "$shim/mkcode"
for d in app backend tools; do ln -sfn "$root/$dir/$d" "$shim/mkcode/$d"; done
touch "$shim/mkcode/__init__.py"
(cd "$shim" && PYTHONPATH="$shim" MKCODE_KERNEL_CACHE="$root/$dir/.mkcache" \
  "${PYTHON:-$root/.venv/bin/python}" -m mkcode.app.cli kernels build --compile-only)
rm -rf "$shim"
echo "$dir/ holds $(cat "$dir/REV"); carry [\".mkcache\", \"$dir\"] (ab_base: and run bash backend/megakernel/gpu_run.sh ab)"
