#!/usr/bin/env bash
# Formats every C++ file with the project's .clang-format; with --check, only reports files that
# are not formatted (exit 1 if any).
#
#   scripts/format.sh [--check]
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case "${1:-}" in
  "" | --check) ;;
  -h | --help) usage; exit 0 ;;
  *) echo "format: unknown argument '$1': use --check or nothing (see --help)" >&2; exit 2 ;;
esac
if [ $# -gt 1 ]; then
  echo "format: one argument at most (--check), not $# (see --help)" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format: install clang-format (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cc' '*.h')
if [ "${1:-}" = "--check" ]; then
  clang-format --dry-run -Werror "${files[@]}"
  echo "format: ${#files[@]} files formatted"
else
  clang-format -i "${files[@]}"
fi
