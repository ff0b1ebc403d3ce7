#!/usr/bin/env bash
# Checks that the repository holds no symbolic link that leaves it (an absolute target, or a
# relative one resolving outside the tree) or that dangles: such a link builds on one machine and
# breaks, or ships another copy of the package, everywhere else. CTest runs it (label packaging).
#   scripts/check-tree.sh [ROOT]   (default: the repository holding this script)
set -euo pipefail
root="$(cd "${1:-$(dirname "$0")/..}" && pwd -P)"
bad=0
# Tracked links when git knows the tree (what a clone gets), else every link outside build trees.
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  links=$(git -C "$root" ls-files -s | awk '$1 == "120000" { $1 = $2 = $3 = ""; sub(/^ +/, ""); print }')
else
  links=$(cd "$root" && find . -path ./build -prune -o -type l -print | sed 's|^\./||')
fi
while IFS= read -r link; do
  [ -n "$link" ] || continue
  target=$(readlink "$root/$link" || true)
  resolved=$(realpath -m "$root/$link" 2>/dev/null || true)
  if [ -z "$target" ]; then
    echo "check-tree: $link: tracked as a link but absent from the work tree"
    bad=1
  elif [ "${target#/}" != "$target" ]; then
    echo "check-tree: $link -> $target: an absolute path (valid on one machine only)"
    bad=1
  elif [ "${resolved#"$root"/}" = "$resolved" ]; then
    echo "check-tree: $link -> $target: resolves outside the repository ($resolved)"
    bad=1
  elif [ ! -e "$root/$link" ]; then
    echo "check-tree: $link -> $target: dangles"
    bad=1
  fi
done <<<"$links"
if ((bad)); then
  echo "check-tree: FAILED"
  exit 1
fi
echo "check-tree: no link leaves the tree"
