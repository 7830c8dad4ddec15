// dlop-bench: dlop's benchmarks, in the style of nccl-tests and ucx_perftest.
#include <CLI/CLI.hpp>
#include <iostream>

#include "coll_case.hpp"
#include "collective_bench.hpp"
#include "core/error.hpp"
#include "exchange.hpp"
#include "format.hpp"
#include "launch.hpp"
#include "p2p.hpp"

namespace {

void add_launch_options(CLI::App& app, dlop::bench::LaunchOptions& launch) {
  app.add_option("--rank", launch.rank, "this process's rank (with --store)");
  app.add_option("--size", launch.size, "number of ranks (with --store)");
  app.add_option("--store", launch.store, "host:port of the TCP store that rank 0 serves");
  app.add_option("--local", launch.local, "fork this many ranks on this host");
}

// The text options of the collective subcommands, turned into CollectiveOptions after parsing.
struct CollectiveText {
  std::string min_size = "8", max_size = "256M", rotate = "8M", dtype = "float", op = "sum";
};

void add_collective(CLI::App& app, std::vector<CLI::App*>& commands, const char* name, const char* what,
                    dlop::bench::LaunchOptions& launch, dlop::bench::CollectiveOptions& o, CollectiveText& text) {
  CLI::App* cmd = app.add_subcommand(name, what);
  commands.push_back(cmd);
  // The last of a repeated option wins (scripts append overrides to their defaults).
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_launch_options(*cmd, launch);
  cmd->add_option("-b,--minbytes", text.min_size, "smallest size S (8, 4K, 1M, ...; the full array for allgather, "
                                                  "reducescatter, alltoall)");
  cmd->add_option("-e,--maxbytes", text.max_size, "largest size S");
  cmd->add_option("-f,--stepfactor", o.factor, "size multiplier between rows");
  cmd->add_option("-d,--datatype", text.dtype, "float, double, half, bfloat16, int8, uint8, int16, int32, int64, bool");
  cmd->add_option("-o,--op", text.op, "sum, avg, prod, min, max, band, bor, bxor");
  cmd->add_option("-r,--root", o.root, "root rank of broadcast and reduce");
  cmd->add_option("-w,--warmup_iters", o.warmup, "warm-up calls per row and implementation (-1: auto)");
  cmd->add_option("-n,--iters", o.iterations, "timed calls per repetition (0: auto, 32 MiB / S in [3, 1000])");
  cmd->add_option("--reps", o.repetitions, "repetitions per row (the median is shown)")->check(CLI::PositiveNumber);
  cmd->add_option("-c,--check", o.check, "count wrong elements after timing (0 or 1)");
  cmd->add_option("--inplace", o.inplace, "0 out-of-place, 1 in-place, 2 both")->check(CLI::Range(0, 2));
  cmd->add_option("--rotate", text.rotate, "rotate buffers through 64 MiB for S up to this (0: never)");
  cmd->add_option("--membw", o.membw, "measure the memory-bandwidth ceiling first (0 or 1)");
  cmd->add_option("--mpi", o.mpi, "under mpirun, also run MPI's own collective (0 or 1)");
  cmd->add_option("--json", o.json, "also write the header and rows as JSON to this file");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dlop-bench: dlop's benchmarks. Run under mpirun, with --rank/--size/--store, or with --local N."};
  app.require_subcommand(1);

  dlop::bench::LaunchOptions launch;
  dlop::bench::P2pOptions p2p;
  std::string min_size = "8", max_size = "256M", progress = "spin";
  CLI::App* p2p_cmd = app.add_subcommand("p2p", "ping-pong latency and streaming bandwidth between 2 ranks");
  add_launch_options(*p2p_cmd, launch);
  p2p_cmd->add_option("-b,--minbytes", min_size, "smallest message (8, 4K, 1M, ...)");
  p2p_cmd->add_option("-e,--maxbytes", max_size, "largest message");
  p2p_cmd->add_option("-f,--stepfactor", p2p.factor, "size multiplier between rows");
  p2p_cmd->add_option("-r,--repetitions", p2p.repetitions, "repetitions per size (median reported)");
  p2p_cmd->add_option("--progress", progress, "spin, sleep or auto")->check(CLI::IsMember({"spin", "sleep", "auto"}));
  p2p_cmd->add_option("--json", p2p.json, "also write the rows as JSON to this file");

  dlop::bench::ExchangeOptions exchange;
  std::string exchange_min = "8", exchange_max = "4M";
  CLI::App* exchange_cmd = app.add_subcommand("exchange", "every rank sends a message to every other at once");
  add_launch_options(*exchange_cmd, launch);
  exchange_cmd->add_option("-b,--minbytes", exchange_min, "smallest message");
  exchange_cmd->add_option("-e,--maxbytes", exchange_max, "largest message");
  exchange_cmd->add_option("-f,--stepfactor", exchange.factor, "size multiplier between rows");
  exchange_cmd->add_option("-r,--repetitions", exchange.repetitions, "repetitions per size (median reported)");

  dlop::bench::CollectiveOptions collective;
  CollectiveText collective_text;
  std::vector<CLI::App*> collective_cmds;
  add_collective(app, collective_cmds, "allreduce", "all-reduce (MPI_Allreduce)", launch, collective, collective_text);
  add_collective(app, collective_cmds, "allgather", "all-gather (MPI_Allgather)", launch, collective, collective_text);
  add_collective(app, collective_cmds, "reducescatter", "reduce-scatter (MPI_Reduce_scatter_block)", launch,
                 collective, collective_text);
  add_collective(app, collective_cmds, "broadcast", "broadcast (MPI_Bcast)", launch, collective, collective_text);
  add_collective(app, collective_cmds, "reduce", "reduce to a root (MPI_Reduce)", launch, collective, collective_text);
  add_collective(app, collective_cmds, "alltoall", "all-to-all (MPI_Alltoall)", launch, collective, collective_text);
  add_collective(app, collective_cmds, "barrier", "barrier (MPI_Barrier)", launch, collective, collective_text);

  CLI11_PARSE(app, argc, argv);
  try {
    for (CLI::App* cmd : collective_cmds) {
      if (!cmd->parsed()) continue;
      collective.kind = dlop::coll::parse_kind(cmd->get_name());
      collective.min_bytes = dlop::bench::parse_size(collective_text.min_size);
      collective.max_bytes = dlop::bench::parse_size(collective_text.max_size);
      collective.rotate_bytes = dlop::bench::parse_size(collective_text.rotate);
      collective.dtype = dlop::coll::parse_dtype(collective_text.dtype);
      collective.op = dlop::coll::parse_op(collective_text.op);
      if (dlop::bench::reduces(collective.kind)) dlop::coll::check_reduction(collective.op, collective.dtype);
      for (int i = 0; i < argc; ++i) collective.command_line += (i > 0 ? " " : "") + std::string(argv[i]);
      return dlop::bench::launch(launch, [&](dlop::transport::Bootstrap& b) {
        return dlop::bench::run_collective(b, collective);
      });
    }
    p2p.min_bytes = dlop::bench::parse_size(min_size);
    p2p.max_bytes = dlop::bench::parse_size(max_size);
    p2p.progress = progress == "spin"    ? dlop::ProgressMode::kSpin
                   : progress == "sleep" ? dlop::ProgressMode::kSleep
                                         : dlop::ProgressMode::kAuto;
    if (exchange_cmd->parsed()) {
      exchange.min_bytes = dlop::bench::parse_size(exchange_min);
      exchange.max_bytes = dlop::bench::parse_size(exchange_max);
      return dlop::bench::launch(launch, [&](dlop::transport::Bootstrap& b) { return dlop::bench::run_exchange(b, exchange); });
    }
    return dlop::bench::launch(launch, [&](dlop::transport::Bootstrap& b) { return dlop::bench::run_p2p(b, p2p); });
  } catch (const std::exception& e) {
    std::cerr << "dlop-bench: " << e.what() << std::endl;
    return 2;
  }
}
