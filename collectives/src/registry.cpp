#include "collectives/registry.hpp"
#include "collectives/select_reason.hpp"

#include <fmt/format.h>

#include <limits>

#include "core/error.hpp"

namespace dlop::coll {
namespace {

constexpr std::size_t kAny = std::numeric_limits<std::size_t>::max();

// The tuning table: for each operation, candidates in order of preference up
// to a size (bytes of one rank's contribution). The first that accepts wins.
// Names not (yet) registered are skipped.
struct TuningRule {
  CollKind kind;
  std::size_t max_bytes;
  std::string_view algorithm;
};

constexpr TuningRule kTuning[] = {
    {CollKind::kAllreduce, 4u << 10, "inline"},
    {CollKind::kAllreduce, 256u << 10, "shm"},
    {CollKind::kAllreduce, 16u << 10, "recursive_doubling"},
    {CollKind::kAllreduce, kAny, "cma"},
    {CollKind::kAllreduce, kAny, "hierarchical"},
    {CollKind::kAllreduce, 1u << 20, "rabenseifner"},
    {CollKind::kAllreduce, kAny, "ring"},
    {CollKind::kReduceScatter, kAny, "ring"},
    {CollKind::kReduceScatterv, kAny, "ring"},
    {CollKind::kAllgather, 64u << 10, "bruck"},
    {CollKind::kAllgather, kAny, "ring"},
    {CollKind::kAllgatherv, kAny, "ring"},
    {CollKind::kBroadcast, kAny, "binomial"},
    {CollKind::kReduce, kAny, "binomial"},
    {CollKind::kGather, kAny, "linear"},
    {CollKind::kScatter, kAny, "linear"},
    {CollKind::kAlltoall, kAny, "pairwise"},
    {CollKind::kAlltoallv, kAny, "pairwise"},
    {CollKind::kBarrier, kAny, "dissemination"},
};

std::vector<Algorithm> build_registry() {
  std::vector<Algorithm> all;
  register_allreduce_family(all);
  register_rooted_family(all);
  register_exchange_family(all);
  register_shm_family(all);
  return all;
}

const Algorithm* find(CollKind kind, std::string_view name) {
  for (const Algorithm& a : all_algorithms()) {
    if (a.kind == kind && a.name == name) return &a;
  }
  return nullptr;
}

}  // namespace

const std::vector<Algorithm>& all_algorithms() {
  static const std::vector<Algorithm> registry = build_registry();
  return registry;
}

AlgorithmOverrides AlgorithmOverrides::parse(std::string_view text) {
  AlgorithmOverrides overrides;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view entry = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (entry.empty()) continue;
    const auto colon = entry.find(':');
    if (colon == std::string_view::npos) {
      throw_error(Errc::kInvalidArgument, fmt::format("DLOP_ALGO entry '{}' is not op:algorithm", entry));
    }
    const CollKind kind = parse_kind(entry.substr(0, colon));
    const std::string_view name = entry.substr(colon + 1);
    if (find(kind, name) == nullptr) {
      throw_error(Errc::kInvalidArgument, fmt::format("DLOP_ALGO: no algorithm '{}' for {}", name, kind_name(kind)));
    }
    overrides.forced.emplace_back(kind, std::string(name));
  }
  return overrides;
}

namespace {

const Algorithm& choose(const CollArgs& args, const Group& group, const AlgorithmOverrides& overrides,
                        std::string* why) {
  std::string declined;  // only filled when the caller asks why
  const auto decline = [&](std::string_view name) {
    if (why != nullptr) declined += fmt::format("{}{}", declined.empty() ? "" : ", ", name);
  };
  const auto chose = [&](const Algorithm& a, std::string_view reason) -> const Algorithm& {
    if (why != nullptr) *why = declined.empty() ? std::string(reason) : fmt::format("{}; declined: {}", reason, declined);
    return a;
  };
  for (const auto& [kind, name] : overrides.forced) {
    if (kind != args.kind) continue;
    const Algorithm* forced = find(kind, name);
    if (forced != nullptr && forced->accepts(args, group)) return chose(*forced, "forced by DLOP_ALGO");
    // A forced algorithm that cannot serve this case declines to the table.
    decline(fmt::format("{} (forced by DLOP_ALGO)", name));
    break;
  }
  const std::size_t bytes = args.bytes();
  for (const TuningRule& rule : kTuning) {
    if (rule.kind != args.kind || bytes > rule.max_bytes) continue;
    const Algorithm* candidate = find(rule.kind, rule.algorithm);
    if (candidate == nullptr) continue;
    if (candidate->accepts(args, group)) return chose(*candidate, "tuning table");
    decline(candidate->name);
  }
  // Anything registered for the operation that accepts, as a last resort.
  for (const Algorithm& a : all_algorithms()) {
    if (a.kind == args.kind && a.accepts(args, group)) return chose(a, "no table entry accepted: first registered that does");
  }
  throw_error(Errc::kInvalidArgument, fmt::format("no algorithm can run {} of {} B on {} ranks", kind_name(args.kind),
                                                  bytes, group.size()));
}

}  // namespace

const Algorithm& select_algorithm(const CollArgs& args, const Group& group, const AlgorithmOverrides& overrides) {
  return choose(args, group, overrides, nullptr);
}

const Algorithm& select_algorithm(const CollArgs& args, const Group& group, const AlgorithmOverrides& overrides,
                                  std::string& why) {
  return choose(args, group, overrides, &why);
}

}  // namespace dlop::coll
