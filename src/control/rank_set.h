// Sets of ranks as the registry keeps them, and as its errors name them.
#pragma once

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace switchml::control {

// Ranks per job at most (the data plane's worker bitmap is 256 bits wide).
inline constexpr size_t kMaxRanks = 256;
using RankSet = std::bitset<kMaxRanks>;

// "rank 3", "ranks 1, 2 and 5", "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 9 more".
inline std::string RankList(const std::vector<uint32_t>& ranks) {
  constexpr size_t kNamed = 8;
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < kNamed; ++i) {
    if (i > 0) text += (i + 1 == ranks.size()) ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  if (ranks.size() > kNamed) text += " and " + std::to_string(ranks.size() - kNamed) + " more";
  return text;
}

}  // namespace switchml::control
