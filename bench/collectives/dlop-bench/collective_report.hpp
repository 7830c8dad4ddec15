// The table (nccl-tests' columns, dlop then MPI, their ratios) and the JSON
// file of the collective benchmarks. Used on rank 0 only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coll_case.hpp"
#include "collective_bench.hpp"
#include "membw.hpp"

namespace dlop::bench {

// One implementation's figures for one row.
struct ImplResult {
  bool ran = false;         // measured on every rank
  std::string error;        // why not, when it was tried and failed
  double time_us = 0;       // median repetition, slowest rank
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  std::int64_t wrong = -1;  // summed over ranks; -1: not checked
};

struct RowResult {
  CollLayout layout;
  bool in_place = false;
  ImplResult dlop;
  ImplResult mpi;
};

struct RankMemory {
  double peak_rss_mib = 0;  // getrusage ru_maxrss
  double buffers_mib = 0;   // the bench's own buffers, all touched
};

struct ReportSetup {
  CollectiveOptions options;
  int ranks = 0;
  int hosts = 0;
  MemoryBandwidth membw;
  std::optional<std::string> mpi;  // the library's version when it runs; else nullopt
  std::string mpi_note;            // why MPI is absent, or how it runs
};

class Report {
 public:
  explicit Report(ReportSetup setup);

  void header() const;
  // Prints the row (and a new error once) and keeps it for the JSON and the averages.
  void row(const RowResult& row);
  // Out-of-bounds totals, memory per rank, then the average bus bandwidth (last line).
  void footer(const std::vector<RankMemory>& memory);
  void write_json(const std::string& path) const;

 private:
  double ceiling_busbw() const;  // 0 when not applicable (not all-reduce on 2 ranks, or not measured)

  ReportSetup s_;
  std::vector<RowResult> rows_;
  std::vector<RankMemory> memory_;
  std::string last_error_[2];
};

}  // namespace dlop::bench
