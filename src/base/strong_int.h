// StrongInt<Tag, T>: a domain integer (rank, job id, slot index, ...) that does not silently mix
// with other integers. Explicit construction, explicit .value(), comparison within the same type.
#pragma once

#include <compare>
#include <cstddef>
#include <functional>

namespace switchml {

template <typename Tag, typename T>
class StrongInt {
 public:
  using ValueType = T;
  constexpr StrongInt() = default;
  constexpr explicit StrongInt(T v) : v_(v) {}
  constexpr T value() const { return v_; }
  constexpr auto operator<=>(const StrongInt&) const = default;

 private:
  T v_{};
};

}  // namespace switchml

template <typename Tag, typename T>
struct std::hash<switchml::StrongInt<Tag, T>> {
  size_t operator()(const switchml::StrongInt<Tag, T>& v) const { return std::hash<T>()(v.value()); }
};
