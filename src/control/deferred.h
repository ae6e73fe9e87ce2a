// Callbacks the registry's rooms collect under the registry's lock, run once it is released
// (a callback may call back into the registry).
#pragma once

#include <functional>
#include <vector>

namespace switchml::control {

using Deferred = std::vector<std::function<void()>>;

inline void RunAll(Deferred& deferred) {
  for (auto& f : deferred) f();
}

}  // namespace switchml::control
