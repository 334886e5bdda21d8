# Sourced by branches.sh and rms_peers_order.sh (NOTES item 63), from the repository root:
# the device scripts' common start, and patched_tree NAME PATCH_DIR, which copies this
# tree to /tmp/branch-NAME with PATCH_DIR/0001-*.patch applied (git apply) and exits 2
# if it does not apply.
set -u
unset PEERS
nvidia-smi -L
BASE_OUT=${OUT:-$PWD/.out}
HERE=$PWD
patched_tree() {
  local dir=/tmp/branch-$1
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$HERE" --exclude=./.out -cf - . | tar -C "$dir" -xf - &&
    (cd "$dir" && git apply "$HERE"/$2/0001-*.patch) || { echo "patch $2 does not apply"; exit 2; }
}
