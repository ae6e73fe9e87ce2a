// SWITCHML_EXPORT marks the declarations a shared libswitchml.so exports: the classes and
// functions of the public API (include/switchml/). Everything else in the library is built with
// hidden visibility (-fvisibility=hidden -fvisibility-inlines-hidden: cmake/SwitchmlHelpers.cmake)
// and linked with cmake/switchml_exports.map, so the library's internals (the worker, transport
// and control modules, gRPC, protobuf, the standard library's templates) are not part of its ABI
// and cannot clash with a program's own copies of them. tests/exported_symbols_test.sh checks
// what the built library exports.
#pragma once

#define SWITCHML_EXPORT [[gnu::visibility("default")]]
