#!/usr/bin/env bash
# What a shared library of the modules exports (include/switchml/export.h,
# cmake/switchml_exports.map): exactly the API its headers mark SWITCHML_EXPORT, all of it.
#   exported_symbols_test.sh LIBRARY NAMESPACE:HEADER... [NAMESPACE:HEADER...]
# e.g. libswitchml.so switchml:include/switchml/context.h ...; libswitchml_bindings.so adds
# switchml::python:bindings/python/software_switch.h.
#
# Fails when a defined dynamic symbol (nm -D --defined-only, demangled) is not a member of a
# class, or a function, that one of the headers marks SWITCHML_EXPORT in its namespace (the
# modules' namespaces such as switchml::worker:: or switchml::transport::, nested internals such
# as switchml::Context::Impl, gRPC, protobuf, the standard library's templates), and when such a
# class or function has no symbol at all (its mark was lost).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: exported_symbols_test.sh LIBRARY NAMESPACE:HEADER..." >&2
  exit 2
fi
lib=$1
shift
[ -f "$lib" ] || { echo "FAIL: no library $lib"; exit 1; }

# The exported API: "namespace::Name" for each class and function the headers mark.
api=()
for spec in "$@"; do
  ns=${spec%:*}
  header=${spec##*:}
  [ -f "$header" ] || { echo "FAIL: no header $header"; exit 1; }
  while read -r name; do
    api+=("$ns::$name")
  done < <(sed -n -E \
    -e 's/^(class|struct)( \[\[[a-z_]+\]\])? SWITCHML_EXPORT ([A-Za-z_][A-Za-z0-9_]*).*/\3/p' \
    -e 's/^SWITCHML_EXPORT .*[ *&]([A-Za-z_][A-Za-z0-9_]*)\(.*/\1/p' "$header")
done
if [ ${#api[@]} -eq 0 ]; then
  echo "FAIL: the headers mark nothing SWITCHML_EXPORT: $*"
  exit 1
fi

# Each defined dynamic symbol's qualified name: without "typeinfo for " and the like, without
# the parameter list, without [abi:cxx11] tags.
nm -D --defined-only -C "$lib" | cut -d' ' -f3- |
  sed -E -e 's/^(typeinfo name for|typeinfo for|vtable for|VTT for) //' \
         -e 's/\(.*//' -e 's/\[abi:[a-z0-9]+\]//g' | sort -u >"${TMPDIR:-/tmp}/exported.$$"
trap 'rm -f "${TMPDIR:-/tmp}/exported.$$"' EXIT
names="${TMPDIR:-/tmp}/exported.$$"

# Allowed: an API name itself (a function, or a class's typeinfo and vtable), or one member of
# an API class (not a member of a class nested in it).
alternatives=$(printf '%s\n' "${api[@]}" | paste -sd'|')  # identifiers and ::, nothing to escape
allowed="^(${alternatives})(::(~?[A-Za-z_][A-Za-z0-9_]*|operator[^:]*))?$"
if bad=$(grep -Ev "$allowed" "$names"); then
  echo "FAIL: $lib exports $(wc -l <<<"$bad") symbols outside its API (${api[*]}):"
  head -n 30 <<<"$bad"
  exit 1
fi
for name in "${api[@]}"; do
  if ! grep -Eq "^${name}(::|$)" "$names"; then
    echo "FAIL: $lib exports nothing of $name (is it still marked SWITCHML_EXPORT and defined?)"
    exit 1
  fi
done
echo "$lib: $(wc -l <"$names") exported names, all of the API: ${api[*]}"
