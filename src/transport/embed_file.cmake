# cmake -DIN=file -DOUT=file.cc -DNAME=symbol -P embed_file.cmake: writes a C++ source that
# defines `extern const unsigned char NAME[]` and `extern const unsigned long NAME_size` with the
# bytes of IN (for the AF_XDP transport's BPF object).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")

file(WRITE "${OUT}" "// Generated from ${IN} by embed_file.cmake; do not edit.\n"
  "extern const unsigned char ${NAME}[] = {\n${bytes}\n};\n"
  "extern const unsigned long ${NAME}_size = ${size};\n")
