#!/usr/bin/env bash
# Formats every C++ file with the project's .clang-format; with --check, only reports files that
# are not formatted (exit 1 if any).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format: install clang-format (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cc' '*.h')
if [ "${1:-}" = "--check" ]; then
  clang-format --dry-run -Werror "${files[@]}"
  echo "format: ${#files[@]} files formatted"
else
  clang-format -i "${files[@]}"
fi
