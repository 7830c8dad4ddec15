// Small helpers shared by dlop-bench's tables.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dlop::bench {

// "8", "4K", "256M", "1G" (binary units) to bytes; throws naming the text.
std::size_t parse_size(const std::string& text);
// Bytes to "8", "4K", "1M", ... when exact, else the plain number.
std::string format_size(std::size_t bytes);
// Median of the values (sorted copy); 0 for none.
double median(std::vector<double> values);
// The sizes min, min*factor, ... up to max inclusive.
std::vector<std::size_t> size_range(std::size_t min, std::size_t max, std::size_t factor);

}  // namespace dlop::bench
