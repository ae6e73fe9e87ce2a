// Durations as the control plane's errors print them.
#pragma once

#include <chrono>
#include <string>

namespace switchml::control {

// "30 s", "1.5 s", "200 ms".
inline std::string FormatTimeout(std::chrono::milliseconds t) {
  const auto ms = t.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  std::string frac = std::to_string(ms % 1000);
  frac.insert(0, 3 - frac.size(), '0');
  while (frac.back() == '0') frac.pop_back();
  return std::to_string(ms / 1000) + "." + frac + " s";
}

}  // namespace switchml::control
