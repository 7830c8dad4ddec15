#include "common/coll_harness.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "common/multiprocess.hpp"
#include "core/error.hpp"

#include <numeric>

namespace dlop::test {

const coll::Algorithm& find_algorithm(coll::CollKind kind, std::string_view name) {
  for (const coll::Algorithm& a : coll::all_algorithms()) {
    if (a.kind == kind && a.name == name) return a;
  }
  throw_error(Errc::kInvalidArgument, fmt::format("no algorithm '{}' for {}", name, coll::kind_name(kind)));
}

void run_collective(const coll::Group& group, const coll::CollArgs& args, std::string_view algorithm,
                    transport::Tag base_tag, std::chrono::milliseconds timeout) {
  const coll::Algorithm& a = find_algorithm(args.kind, algorithm);
  if (!a.accepts(args, group)) {
    throw_error(Errc::kInvalidArgument, fmt::format("{} declines this {}", algorithm, coll::kind_name(args.kind)));
  }
  auto task = a.create(args, group, base_tag);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (unsigned idle = 0; !task->progress(); ++idle) {
    // Tests run more ranks than cores: let the peer we wait for have the CPU.
    if ((idle & 15u) == 15u) std::this_thread::yield();
    if (std::chrono::steady_clock::now() > deadline) {
      throw_error(Errc::kTimeout, fmt::format("{} {} did not finish within {} ms", algorithm,
                                              coll::kind_name(args.kind), timeout.count()));
    }
  }
}

void run_interleaved(const coll::Group& group, const std::vector<InFlight>& ops, transport::Tag first_tag,
                     std::size_t first, std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<coll::Task>> tasks;
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const coll::CollArgs& args = ops[k].args;
    tasks.push_back(find_algorithm(args.kind, ops[k].algorithm).create(args, group, (first_tag + k) << coll::kStepBits));
  }
  std::vector<bool> done(tasks.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::size_t i = first; std::count(done.begin(), done.end(), false) > 0; ++i) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw_error(Errc::kTimeout, fmt::format("{} tasks in flight not done within {} ms", tasks.size(), timeout.count()));
    }
    const std::size_t t = i % tasks.size();
    if (!done[t]) done[t] = tasks[t]->progress();
  }
}

namespace {

void run_with_options(int ranks, const std::function<transport::Mesh::Options(int rank)>& options,
                      const GroupBody& body) {
  run_ranks(ranks, [&](transport::Bootstrap& b) {
    transport::UcxWorker worker;
    transport::Mesh mesh(worker, b, options(b.rank()));
    std::vector<int> members(static_cast<std::size_t>(b.size()));
    std::iota(members.begin(), members.end(), 0);
    const coll::Group group(mesh, members);
    transport::Tag seq = 0;
    body(b, group, [&seq] { return ++seq << coll::kStepBits; });
    mesh.fence(std::chrono::seconds(60));
  });
}

}  // namespace

void run_on_group(int ranks, const GroupBody& body) {
  run_with_options(ranks, [](int) { return transport::Mesh::Options{}; }, body);
}

void run_on_hosts(const std::vector<std::string>& hosts, const GroupBody& body) {
  run_with_options(
      static_cast<int>(hosts.size()),
      [&hosts](int rank) {
        transport::Mesh::Options options;
        options.host = hosts.at(static_cast<std::size_t>(rank));
        return options;
      },
      body);
}

}  // namespace dlop::test
