#!/usr/bin/env bash
# Makes one gzipped man page from `switchml [COMMAND] --help` with help2man.
#   man_page.sh HELP2MAN SWITCHML COMMAND SUMMARY VERSION OUT.1.gz   (COMMAND "" = switchml(1))
set -euo pipefail
help2man=$1 bin=$2 command=$3 summary=$4 version=$5 out=$6
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# help2man runs "PROGRAM --help"; a subcommand is a wrapper that runs `switchml COMMAND`.
prog="$tmp/switchml${command:+-$command}"
printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$bin" "$command" >"$prog"
chmod +x "$prog"
"$help2man" --no-info --no-discard-stderr --section 1 --version-string "$version" \
  --name "$summary" --source "switchml $version" --output "$tmp/page.1" "$prog"
grep -q . "$tmp/page.1" || { echo "man_page.sh: help2man wrote nothing for '$command'" >&2; exit 1; }
gzip -9n <"$tmp/page.1" >"$out"
