// dlop-bench: dlop's benchmarks, in the style of nccl-tests and ucx_perftest.
#include <CLI/CLI.hpp>
#include <iostream>

#include "core/error.hpp"
#include "format.hpp"
#include "launch.hpp"
#include "exchange.hpp"
#include "p2p.hpp"

namespace {

void add_launch_options(CLI::App& app, dlop::bench::LaunchOptions& launch) {
  app.add_option("--rank", launch.rank, "this process's rank (with --store)");
  app.add_option("--size", launch.size, "number of ranks (with --store)");
  app.add_option("--store", launch.store, "host:port of the TCP store that rank 0 serves");
  app.add_option("--local", launch.local, "fork this many ranks on this host");
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

  CLI11_PARSE(app, argc, argv);
  try {
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
