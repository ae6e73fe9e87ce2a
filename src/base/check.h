// CHECK(cond) << "context": aborts the process when an invariant of the code itself is broken.
// Never used for bad input (that is a Status, or a counted drop on the packet path).
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace switchml::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": CHECK failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace switchml::internal

#define CHECK(cond) \
  if (cond) {       \
  } else            \
    ::switchml::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define CHECK_EQ(a, b) CHECK((a) == (b))
#define CHECK_LT(a, b) CHECK((a) < (b))
#define CHECK_LE(a, b) CHECK((a) <= (b))
