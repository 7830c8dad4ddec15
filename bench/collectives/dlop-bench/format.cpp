#include "format.hpp"

#include <algorithm>
#include <cctype>

#include "core/error.hpp"

namespace dlop::bench {

std::size_t parse_size(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  std::size_t scale = 1;
  if (unit == "K" || unit == "k") scale = 1u << 10;
  else if (unit == "M" || unit == "m") scale = 1u << 20;
  else if (unit == "G" || unit == "g") scale = std::size_t{1} << 30;
  else if (!unit.empty()) digits = 0;  // an unknown unit makes the whole text invalid
  if (digits == 0) throw_error(Errc::kInvalidArgument, fmt::format("'{}' is not a size like 8, 4K, 256M or 1G", text));
  return std::stoull(text.substr(0, digits)) * scale;
}

std::string format_size(std::size_t bytes) {
  constexpr const char* kUnits[] = {"", "K", "M", "G"};
  int unit = 0;
  while (unit < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kUnits[unit];
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::vector<std::size_t> size_range(std::size_t min, std::size_t max, std::size_t factor) {
  if (factor < 2) throw_error(Errc::kInvalidArgument, "the size factor must be at least 2");
  std::vector<std::size_t> sizes;
  for (std::size_t size = std::max<std::size_t>(min, 1); size <= max; size *= factor) sizes.push_back(size);
  if (min == 0) sizes.insert(sizes.begin(), 0);
  return sizes;
}

}  // namespace dlop::bench
