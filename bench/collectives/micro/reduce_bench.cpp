// Micro-benchmark of the reduction kernels: dst[i] = dst[i] op src[i] for every
// dtype x op, with each instruction set this CPU runs ("scalar", "avx2",
// "avx512") and a plain C++ loop ("loop", what a first implementation would
// write), at 4 KiB per buffer (in L1) and 64 MiB per buffer (from DRAM).
//
// Throughput counts the bytes of dst and src (2 x the buffer size) per call:
// bytes_per_second (SetBytesProcessed, printed in binary units) and "GB/s"
// (10^9 bytes per second).
//
//   dlop-reduce-bench --benchmark_min_time=0.05 --benchmark_filter='float/sum/'
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "reduce_kernels.hpp"  // private to collectives: white-box
#include "collectives/reduce.hpp"
#include "collectives/types.hpp"

namespace dlop::coll {
namespace {

using Byte = unsigned char;
constexpr std::size_t kLargest = std::size_t{64} << 20;

struct FreeDeleter {
  void operator()(Byte* p) const { std::free(p); }
};
using Memory = std::unique_ptr<Byte, FreeDeleter>;

Memory allocate(std::size_t bytes) {
  auto* p = static_cast<Byte*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) throw std::bad_alloc();
  return Memory(p);
}

// Two buffers shared by all benchmarks, so that each one does not pay for page faults.
struct Buffers {
  Memory dst = allocate(kLargest);
  Memory src = allocate(kLargest);
};
Buffers& buffers() {
  static Buffers b;
  return b;
}

// Fills with the dtype's 1: sums stay finite (f16 stops growing at 2048, bf16
// at 256), products stay 1, nothing becomes subnormal.
void fill_ones(DataType dtype, Byte* p, std::size_t bytes) {
  auto fill = [&](auto one) {
    for (std::size_t i = 0; i + sizeof(one) <= bytes; i += sizeof(one)) std::memcpy(p + i, &one, sizeof(one));
  };
  switch (dtype) {
    case DataType::kFloat32: return fill(1.0f);
    case DataType::kFloat64: return fill(1.0);
    case DataType::kFloat16: return fill(std::uint16_t{0x3C00});
    case DataType::kBFloat16: return fill(std::uint16_t{0x3F80});
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kBool: return fill(std::uint8_t{1});
    case DataType::kInt16: return fill(std::int16_t{1});
    case DataType::kInt32: return fill(std::int32_t{1});
    case DataType::kInt64: return fill(std::int64_t{1});
  }
}

// ---- The plain loop: one element at a time, f16/bf16 through the scalar
// conversions, wrapping integer arithmetic; what the compiler makes of it at
// the build's optimisation level.

template <typename T>
struct Plain {
  // Integers: unsigned arithmetic at least as wide as int, so that it wraps.
  using U = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::type_identity<T>>::type;
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
  static T sum(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return a + b;
    else return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
  }
  static T prod(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return a * b;
    else return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
  }
  static T min(T a, T b) { return b < a ? b : a; }
  static T max(T a, T b) { return a < b ? b : a; }
  static T band(T a, T b) { return static_cast<T>(a & b); }
  static T bor(T a, T b) { return static_cast<T>(a | b); }
  static T bxor(T a, T b) { return static_cast<T>(a ^ b); }
};

template <typename T, T (*Op)(T, T)>
void plain_loop(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<T*>(dst);
  const auto* s = static_cast<const T*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = Op(d[i], s[i]);
}

template <float (*In)(std::uint16_t), std::uint16_t (*Out)(float), float (*Op)(float, float)>
void plain_loop16(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<std::uint16_t*>(dst);
  const auto* s = static_cast<const std::uint16_t*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = Out(Op(In(d[i]), In(s[i])));
}

void plain_bool(ReduceOp op, void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<std::uint8_t*>(dst);
  const auto* s = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < n; ++i) {
    const bool p = d[i] != 0, q = s[i] != 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
      case ReduceOp::kMax:
      case ReduceOp::kBor: d[i] = p || q; break;
      case ReduceOp::kProd:
      case ReduceOp::kMin:
      case ReduceOp::kBand: d[i] = p && q; break;
      case ReduceOp::kBxor: d[i] = p != q; break;
    }
  }
}

using PlainFn = void (*)(void*, const void*, std::size_t);

template <typename T, template <auto> class Make>
PlainFn by_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return Make<Plain<T>::sum>::fn;
    case ReduceOp::kProd: return Make<Plain<T>::prod>::fn;
    case ReduceOp::kMin: return Make<Plain<T>::min>::fn;
    case ReduceOp::kMax: return Make<Plain<T>::max>::fn;
    case ReduceOp::kBand:
      if constexpr (std::is_integral_v<T>) return Make<Plain<T>::band>::fn;
      break;
    case ReduceOp::kBor:
      if constexpr (std::is_integral_v<T>) return Make<Plain<T>::bor>::fn;
      break;
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) return Make<Plain<T>::bxor>::fn;
      break;
  }
  return nullptr;
}

template <typename T>
struct Direct {
  template <auto Op>
  struct Make {
    static constexpr PlainFn fn = plain_loop<T, Op>;
  };
};
template <auto Op>
struct Half {
  static constexpr PlainFn fn = plain_loop16<detail::half_to_float, detail::float_to_half, Op>;
};
template <auto Op>
struct BFloat16 {
  static constexpr PlainFn fn = plain_loop16<detail::bf16_to_float, detail::float_to_bf16, Op>;
};

PlainFn plain_kernel(ReduceOp op, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return by_op<float, Direct<float>::Make>(op);
    case DataType::kFloat64: return by_op<double, Direct<double>::Make>(op);
    case DataType::kFloat16: return by_op<float, Half>(op);
    case DataType::kBFloat16: return by_op<float, BFloat16>(op);
    case DataType::kInt8: return by_op<std::int8_t, Direct<std::int8_t>::Make>(op);
    case DataType::kUInt8: return by_op<std::uint8_t, Direct<std::uint8_t>::Make>(op);
    case DataType::kInt16: return by_op<std::int16_t, Direct<std::int16_t>::Make>(op);
    case DataType::kInt32: return by_op<std::int32_t, Direct<std::int32_t>::Make>(op);
    case DataType::kInt64: return by_op<std::int64_t, Direct<std::int64_t>::Make>(op);
    case DataType::kBool: return nullptr;  // plain_bool, which takes the op
  }
  return nullptr;
}

// ---- Benchmarks

template <typename Call>
void run(benchmark::State& state, DataType dtype, std::size_t bytes, Call&& call) {
  Byte* dst = buffers().dst.get();
  Byte* src = buffers().src.get();
  fill_ones(dtype, dst, bytes);
  fill_ones(dtype, src, bytes);
  const std::size_t n = bytes / dtype_size(dtype);
  for (auto _ : state) {
    call(dst, src, n);
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  const auto processed = static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(2 * bytes);
  state.SetBytesProcessed(processed);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(processed) / 1e9, benchmark::Counter::kIsRate);
}

std::string size_name(std::size_t bytes) {
  return bytes >= (std::size_t{1} << 20) ? fmt::format("{}MiB", bytes >> 20) : fmt::format("{}KiB", bytes >> 10);
}

void register_all() {
  constexpr DataType kDtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                                  DataType::kInt8,    DataType::kUInt8,   DataType::kInt16,   DataType::kInt32,
                                  DataType::kInt64,   DataType::kBool};
  constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                               ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};  // avg runs as sum
  constexpr std::size_t kSizes[] = {std::size_t{4} << 10, kLargest};
  for (const DataType dtype : kDtypes) {
    for (const ReduceOp op : kOps) {
      if (!supports(op, dtype)) continue;
      for (const std::size_t bytes : kSizes) {
        const std::string prefix = fmt::format("reduce/{}/{}/{}/", dtype_name(dtype), op_name(op), size_name(bytes));
        for (const detail::ReduceKernels* k : detail::runnable_kernels()) {
          benchmark::RegisterBenchmark((prefix + k->isa).c_str(), [=](benchmark::State& state) {
            run(state, dtype, bytes, [&](Byte* d, const Byte* s, std::size_t n) { k->reduce(op, dtype, d, d, s, n); });
          });
        }
        const PlainFn plain = plain_kernel(op, dtype);
        benchmark::RegisterBenchmark((prefix + "loop").c_str(), [=](benchmark::State& state) {
          run(state, dtype, bytes, [&](Byte* d, const Byte* s, std::size_t n) {
            if (plain != nullptr) {
              plain(d, s, n);
            } else {
              plain_bool(op, d, s, n);
            }
          });
        });
      }
    }
  }
}

}  // namespace
}  // namespace dlop::coll

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("dlop.reduce_isa", dlop::coll::reduce_isa());
  dlop::coll::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
