#include "reduction_check.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/error.hpp"

namespace dlop::coll::ref {
namespace {

// An exact integer as the dtype stores it (wrapping like the kernels).
std::int64_t wrap(DataType dtype, std::int64_t v) {
  switch (dtype) {
    case DataType::kInt8: return static_cast<std::int8_t>(v);
    case DataType::kUInt8: return static_cast<std::uint8_t>(v);
    case DataType::kInt16: return static_cast<std::int16_t>(v);
    case DataType::kInt32: return static_cast<std::int32_t>(v);
    default: return v;
  }
}

double avg_tolerance(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 1e-6;
    case DataType::kFloat64: return 1e-13;
    case DataType::kFloat16: return 2e-3;
    default: return 1e-2;  // bf16
  }
}

}  // namespace

std::string agree_on_name(transport::Bootstrap& b) {
  static std::atomic<int> made{0};
  if (b.rank() == 0) {
    const std::string name = fmt::format("test-{}-{}", ::getpid(), made.fetch_add(1));
    b.set("arena-name", transport::Bytes(name.begin(), name.end()));
  }
  const auto bytes = b.get("arena-name", 60s);
  return {bytes.begin(), bytes.end()};
}

void with_arena(int ranks, const ArenaBody& body, const transport::Mesh::Options& options) {
  test::run_ranks(ranks, [&](transport::Bootstrap& b) {
    transport::UcxWorker worker;
    transport::Mesh mesh(worker, b, options);
    std::vector<int> members(static_cast<std::size_t>(b.size()));
    std::iota(members.begin(), members.end(), 0);
    Group group(mesh, members);
    attach_host_arena(group, b, agree_on_name(b), 60s);
    body(group, b, mesh);
    mesh.fence(60s);
  });
}

Expected expected_value(DataType dtype, ReduceOp op, int n, std::size_t i, std::uint64_t seed) {
  std::int64_t acc = input_value(dtype, op, 0, i, seed);
  for (int r = 1; r < n; ++r) {
    const std::int64_t v = input_value(dtype, op, r, i, seed);
    if (dtype == DataType::kBool) {
      switch (op) {
        case ReduceOp::kProd: case ReduceOp::kMin: case ReduceOp::kBand: acc = acc & v; break;
        case ReduceOp::kBxor: acc = acc ^ v; break;
        default: acc = acc | v; break;  // sum, avg, max, bor
      }
      continue;
    }
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kBand: acc &= v; break;
      case ReduceOp::kBor: acc |= v; break;
      case ReduceOp::kBxor: acc ^= v; break;
    }
  }
  Expected e{.exact = acc};
  if (op == ReduceOp::kAvg && dtype != DataType::kBool) {
    if (is_floating(dtype)) {
      e.quotient = static_cast<double>(acc) / n;
    } else {
      e.exact = acc / n;  // truncating, as the kernels divide integers
    }
  }
  return e;
}

std::vector<std::byte> make_input(DataType dtype, ReduceOp op, int rank, std::size_t count, std::uint64_t seed,
                                  std::size_t extra_elements) {
  const std::size_t bytes = (count + extra_elements) * dtype_size(dtype);
  std::vector<std::byte> buffer(bytes + kGuardBytes, std::byte{kGuard});
  for (std::size_t i = 0; i < count; ++i) store(dtype, buffer.data(), i, input_value(dtype, op, rank, i, seed));
  return buffer;
}

void check_reduced(DataType dtype, ReduceOp op, int n, const void* got, std::size_t first, std::size_t count,
                   std::uint64_t seed, const std::string& what) {
  std::size_t wrong = 0;
  std::string first_wrong;
  for (std::size_t i = 0; i < count; ++i) {
    const Expected e = expected_value(dtype, op, n, first + i, seed);
    if (is_floating(dtype)) {
      const double g = load_float(dtype, got, i);
      const bool avg = op == ReduceOp::kAvg;
      const double want = avg ? e.quotient : static_cast<double>(e.exact);
      if (avg ? std::fabs(g - want) <= avg_tolerance(dtype) * std::max(1.0, std::fabs(want)) : g == want) continue;
      if (wrong++ == 0) first_wrong = fmt::format("element {}: got {}, expected {}", first + i, g, want);
    } else {
      const std::int64_t g = load_int(dtype, got, i);
      const std::int64_t want = wrap(dtype, e.exact);
      if (g == want) continue;
      if (wrong++ == 0) first_wrong = fmt::format("element {}: got {}, expected {}", first + i, g, want);
    }
  }
  EXPECT_EQ(wrong, 0u) << what << " " << pair_name(dtype, op) << ", n=" << n << ", count=" << count << ": "
                       << wrong << " wrong, first " << first_wrong;
}

void run(const Group& group, const CollArgs& args, std::string_view algorithm, transport::Tag base_tag) {
  const Algorithm& a = test::find_algorithm(args.kind, algorithm);
  if (!a.accepts(args, group)) {
    throw_error(Errc::kInvalidArgument, fmt::format("{} declines this {}", algorithm, kind_name(args.kind)));
  }
  auto task = a.create(args, group, base_tag);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (unsigned idle = 1; !task->progress(); ++idle) {
    if (idle % 16 != 0) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      throw_error(Errc::kTimeout, fmt::format("{} {} did not finish within 60 s", algorithm, kind_name(args.kind)));
    }
    std::this_thread::yield();
  }
}

bool guard_intact(const std::vector<std::byte>& buffer, std::size_t bytes) {
  return std::all_of(buffer.begin() + static_cast<long>(bytes), buffer.end(),
                     [](std::byte b) { return b == std::byte{kGuard}; });
}

std::vector<std::byte> checked_allreduce(const Group& group, transport::Tag base_tag, std::string_view algorithm,
                                         DataType dtype, ReduceOp op, std::size_t count, bool in_place) {
  const std::uint64_t seed = case_seed(dtype, op, count);
  const std::size_t bytes = count * dtype_size(dtype);
  auto input = make_input(dtype, op, group.rank(), count, seed);
  std::vector<std::byte> output(in_place ? 0 : bytes + kGuardBytes, std::byte{kGuard});
  CollArgs args = make_allreduce_args(dtype, op, count);
  args.send = input.data();
  args.recv = in_place ? input.data() : output.data();
  run(group, args, algorithm, base_tag);
  const std::string what = fmt::format("{} {} count {}", algorithm, in_place ? "in place" : "out of place", count);
  const auto& result = in_place ? input : output;
  check_reduced(dtype, op, group.size(), result.data(), 0, count, seed, what);
  EXPECT_TRUE(guard_intact(result, bytes)) << what << " " << pair_name(dtype, op) << ": wrote past the end";
  if (!in_place) {
    EXPECT_EQ(input, make_input(dtype, op, group.rank(), count, seed)) << what << ": input modified";
  }
  return in_place ? input : output;
}

void fill_random_floats(DataType dtype, void* data, std::size_t count, int rank) {
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t h = hash(0xF10A7, rank, i);
    const bool zero = h % 13 == 0;
    const std::uint64_t sign = (h >> 63) & 1;
    const std::uint64_t exp = (h >> 40) % 6;  // 2^-2 .. 2^3
    auto put = [&](auto bits) { std::memcpy(static_cast<std::byte*>(data) + i * sizeof(bits), &bits, sizeof(bits)); };
    switch (dtype) {
      case DataType::kFloat32:
        put(static_cast<std::uint32_t>(sign << 31 | (zero ? 0 : (125 + exp) << 23 | (h & 0x7FFFFF))));
        break;
      case DataType::kFloat64:
        put(static_cast<std::uint64_t>(sign << 63 | (zero ? 0 : (1021 + exp) << 52 | (h & 0xFFFFFFFFFFFFFull))));
        break;
      case DataType::kFloat16:
        put(static_cast<std::uint16_t>(sign << 15 | (zero ? 0 : (13 + exp) << 10 | (h & 0x3FF))));
        break;
      default:  // bf16
        put(static_cast<std::uint16_t>(sign << 15 | (zero ? 0 : (125 + exp) << 7 | (h & 0x7F))));
        break;
    }
  }
}

std::uint64_t fingerprint(const void* data, std::size_t bytes) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const std::uint8_t*>(data)[i]) * 0x100000001B3ull;
  return h;
}

void expect_same_bits_on_every_rank(transport::Bootstrap& b, const void* data, std::size_t bytes,
                                    const std::string& what) {
  const std::uint64_t mine = fingerprint(data, bytes);
  transport::Bytes published(sizeof(mine));
  std::memcpy(published.data(), &mine, sizeof(mine));
  const auto all = b.allgather(published, 60s);
  for (std::size_t r = 0; r < all.size(); ++r) {
    EXPECT_EQ(all[r], published) << what << ": rank " << r << " holds other bits than rank " << b.rank();
  }
}

void reduce_to_same_bits(transport::Bootstrap& b, const Group& group, std::string_view algorithm,
                         transport::Tag base_tag, DataType dtype, ReduceOp op, std::vector<std::byte>& data) {
  const std::size_t count = data.size() / dtype_size(dtype);
  CollArgs args = make_allreduce_args(dtype, op, count);
  args.send = args.recv = data.data();
  run(group, args, algorithm, base_tag);
  expect_same_bits_on_every_rank(b, data.data(), data.size(),
                                 fmt::format("{} {} x {}", algorithm, pair_name(dtype, op), count));
}

std::size_t wrong_in_int32_sum(const Group& group, std::string_view algorithm, int k, std::size_t count,
                               std::vector<std::int32_t>& data) {
  data.resize(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = seq_value(group.rank(), k, i);
  CollArgs args = make_allreduce_args(DataType::kInt32, ReduceOp::kSum, count);
  args.send = args.recv = data.data();
  run(group, args, algorithm, 0);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += data[i] != seq_sum(group.size(), k, i);
  return wrong;
}

void expect_in_flight_finish_in_order(const Group& group, const std::vector<std::size_t>& counts,
                                      const std::function<std::string_view(const CollArgs&)>& algorithm_for) {
  std::vector<std::vector<std::int32_t>> data;
  std::vector<std::unique_ptr<Task>> tasks;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    data.emplace_back(counts[k]);
    for (std::size_t i = 0; i < counts[k]; ++i) data[k][i] = seq_value(group.rank(), static_cast<int>(k), i);
    CollArgs args = make_allreduce_args(DataType::kInt32, ReduceOp::kSum, counts[k]);
    args.send = args.recv = data[k].data();
    tasks.push_back(test::find_algorithm(CollKind::kAllreduce, algorithm_for(args)).create(args, group, 0));
  }
  std::vector<bool> done(tasks.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::count(done.begin(), done.end(), false) > 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "operations in flight did not finish";
    for (std::size_t k = tasks.size(); k-- > 0;) {
      if (!done[k]) done[k] = tasks[k]->progress();
    }
    std::this_thread::yield();
  }
  for (std::size_t k = 0; k < counts.size(); ++k) {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < counts[k]; ++i) wrong += data[k][i] != seq_sum(group.size(), static_cast<int>(k), i);
    EXPECT_EQ(wrong, 0u) << "operation " << k << " of " << counts[k];
  }
}

void expect_declines_alone(std::string_view algorithm, std::size_t count) {
  with_arena(1, [&](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    EXPECT_EQ(g.host_arena(), nullptr);
    const CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, count);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, algorithm).accepts(args, g)) << algorithm;
    const std::string forced = "allreduce:" + std::string(algorithm);
    EXPECT_NE(select_algorithm(args, g, AlgorithmOverrides::parse(forced)).name, algorithm);
  });
}

void expect_refuses_bitwise_on_floats(std::string_view algorithm, std::size_t count, std::size_t then_count) {
  with_arena(2, [&](const Group& g, transport::Bootstrap&, transport::Mesh&) {
    std::vector<float> data(count, 1.0f);
    CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kBxor, data.size());
    args.send = args.recv = data.data();
    EXPECT_THROW(test::find_algorithm(CollKind::kAllreduce, algorithm).create(args, g, 0), Error);
    checked_allreduce(g, 0, algorithm, DataType::kFloat32, ReduceOp::kSum, then_count, false);
  });
}

void expect_declines_across_hosts(std::string_view algorithm, std::size_t count) {
  test::run_on_hosts({"host-0", "host-1"}, [&](transport::Bootstrap& b, const Group& all, const auto&) {
    Group group(all.mesh(), {0, 1});
    attach_host_arena(group, b, agree_on_name(b), 60s);
    EXPECT_EQ(group.host_arena(), nullptr);
    const CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, count);
    EXPECT_FALSE(test::find_algorithm(CollKind::kAllreduce, algorithm).accepts(args, group)) << algorithm;
  });
}

void expect_killed_rank_named(std::string_view algorithm, std::size_t count) {
  test::RankGroup ranks(3, [algorithm, count](transport::Bootstrap& b) {
    transport::Mesh::Options options;
    options.watchdog = 50ms;
    transport::UcxWorker worker;
    transport::Mesh mesh(worker, b, options);
    Group group(mesh, {0, 1, 2});
    attach_host_arena(group, b, agree_on_name(b), 60s);
    std::vector<float> data(count, 1.0f);
    CollArgs args = make_allreduce_args(DataType::kFloat32, ReduceOp::kSum, count);
    args.send = args.recv = data.data();
    run(group, args, algorithm, 0);  // one that works, so the arena's flags have moved
    ASSERT_EQ(data[0], 3.0f);
    b.barrier(60s);
    if (group.rank() == 2) ::raise(SIGKILL);  // dies before posting its next input
    const auto start = std::chrono::steady_clock::now();
    try {
      run(group, args, algorithm, 0);
      ADD_FAILURE() << "the all-reduce finished without rank 2";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kPeerDead) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  });
  const auto exits = ranks.wait(90s);
  for (int r = 0; r < 2; ++r) {
    const auto& exit = exits[static_cast<std::size_t>(r)];
    EXPECT_TRUE(exit.exited && exit.code == 0) << algorithm << " count " << count << ": rank " << r << " failed";
  }
  EXPECT_FALSE(exits[2].exited) << "rank 2 was to die by SIGKILL";
}

}  // namespace dlop::coll::ref
