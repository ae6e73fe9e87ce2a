// What the `switchml` tools and the baseline benchmarks (bench/) measure the same way.
#pragma once

#include <vector>

namespace switchml::testing {

// The median of v (0 for an empty v; the mean of the two middle values for an even count).
double Median(std::vector<double> v);

// CPU seconds used so far by this whole process (all its threads).
double ProcessCpuSeconds();

}  // namespace switchml::testing
