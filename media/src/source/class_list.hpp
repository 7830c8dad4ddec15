// How written labels become classes, for every source that reads labels as
// text (manifests, WebDataset shards).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace dlop::media {

// Integers (all of them non-negative): the classes are "0" .. the largest;
// otherwise the sorted distinct names. `class_of` gets each name's class.
std::vector<std::string> class_list(const std::set<std::string>& names, std::map<std::string, std::int64_t>& class_of);

}  // namespace dlop::media
