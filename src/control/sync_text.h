// Texts both sides of the control plane use: durations as their errors print them, and the
// phrases by which a client tells the switch's own end of a waiting Barrier or Broadcast
// (Registry::ExpireWait, which names the missing ranks) from its own deadline passing.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

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

// Every text Registry::ExpireWait ends a wait with holds one of these; ControlClient passes
// such a text on instead of its own "a peer worker did not arrive".
inline constexpr std::string_view kRanksDidNotArrive = " did not arrive within ";
inline constexpr std::string_view kRanksCameApart = "every rank arrived, but not together";

}  // namespace switchml::control
