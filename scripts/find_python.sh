#!/usr/bin/env bash
# Prints the path of a Python >= 3.12 interpreter (PATH first, then pyenv's versions), or fails.
set -u
ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }
for c in python3.12 python3.13 python3; do
  p=$(command -v "$c" 2>/dev/null) && ok "$p" && { echo "$p"; exit 0; }
done
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for p in $(ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V); do
  ok "$p" && { echo "$p"; exit 0; }
done
echo "find_python.sh: no Python >= 3.12 found (install one, or set PYTHON=/path/to/python3.12)" >&2
exit 1
