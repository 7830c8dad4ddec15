#include "check.hpp"

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/error.hpp"

namespace dlop::bench {
namespace {

using coll::CollKind;
using coll::DataType;
using coll::ReduceOp;

// Codecs between the patterns' integers and each stored type. wrap() is the
// value an integer becomes once stored; decode() reads any stored bits.
template <typename T>
struct IntCodec {
  using Stored = T;
  static constexpr bool kFloat = false;
  static std::int64_t wrap(std::int64_t v) { return static_cast<T>(v); }  // modular narrowing
  static T encode(std::int64_t v) { return static_cast<T>(v); }
  static double decode(T s) { return static_cast<double>(s); }
};
struct BoolCodec {
  using Stored = std::uint8_t;
  static constexpr bool kFloat = false;
  static std::int64_t wrap(std::int64_t v) { return v & 1; }
  static std::uint8_t encode(std::int64_t v) { return static_cast<std::uint8_t>(v & 1); }
  static double decode(std::uint8_t s) { return s; }  // anything but 0 or 1 is wrong
};
template <typename F>
struct FloatCodec {
  using Stored = F;
  static constexpr bool kFloat = true;
  static std::int64_t wrap(std::int64_t v) { return v; }
  static F encode(std::int64_t v) { return static_cast<F>(v); }
  static double decode(F s) { return s; }
};
struct HalfCodec {
  using Stored = std::uint16_t;
  static constexpr bool kFloat = true;
  static std::int64_t wrap(std::int64_t v) { return v; }
  static std::uint16_t encode(std::int64_t v) {  // exact for |v| < 2048, all the patterns need
    if (v == 0) return 0;
    const std::uint64_t a = static_cast<std::uint64_t>(v < 0 ? -v : v);
    if (a >= 2048) throw_error(Errc::kInvalidArgument, "check pattern out of half's exact integers");
    const int e = std::bit_width(a) - 1;
    const auto mantissa = static_cast<std::uint16_t>((a << (10 - e)) & 0x3FF);
    return static_cast<std::uint16_t>((v < 0 ? 0x8000 : 0) | ((e + 15) << 10) | mantissa);
  }
  static double decode(std::uint16_t h) {
    const int exponent = (h >> 10) & 0x1F;
    const int mantissa = h & 0x3FF;
    const double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
    if (exponent == 0x1F) return mantissa != 0 ? NAN : sign * INFINITY;
    if (exponent == 0) return sign * std::ldexp(mantissa, -24);
    return sign * std::ldexp(1024 + mantissa, exponent - 25);
  }
};
struct BFloat16Codec {
  using Stored = std::uint16_t;
  static constexpr bool kFloat = true;
  static std::int64_t wrap(std::int64_t v) { return v; }
  static std::uint16_t encode(std::int64_t v) {  // exact for |v| <= 256
    return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(static_cast<float>(v)) >> 16);
  }
  static double decode(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }
};

template <typename F>
decltype(auto) with_codec(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32: return f(FloatCodec<float>{});
    case DataType::kFloat64: return f(FloatCodec<double>{});
    case DataType::kFloat16: return f(HalfCodec{});
    case DataType::kBFloat16: return f(BFloat16Codec{});
    case DataType::kInt8: return f(IntCodec<std::int8_t>{});
    case DataType::kUInt8: return f(IntCodec<std::uint8_t>{});
    case DataType::kInt16: return f(IntCodec<std::int16_t>{});
    case DataType::kInt32: return f(IntCodec<std::int32_t>{});
    case DataType::kInt64: return f(IntCodec<std::int64_t>{});
    case DataType::kBool: return f(BoolCodec{});
  }
  throw_error(Errc::kInvalidArgument, "unknown data type");
}

// Rank r's input element i of a reduction.
std::int64_t reduction_input(ReduceOp op, DataType dtype, int r, int n, std::size_t i) {
  const auto ri = static_cast<std::size_t>(r);
  if (dtype == DataType::kBool) return (i + ri) % 3 == 0 ? 1 : 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<std::int64_t>((i * 3 + ri * 5) % 8);
    case ReduceOp::kProd: return i % static_cast<std::size_t>(n) == ri ? 2 : 1;  // one rank's 2 per element
    case ReduceOp::kMin:
    case ReduceOp::kMax: return static_cast<std::int64_t>((i * 7 + ri * 13) % 17) - 8;
    default: return static_cast<std::int64_t>((i * 37 + ri * 101) % 128);  // bitwise
  }
}

// Element i of rank r's input to a data-moving collective (unique per rank and index mod 97).
std::int64_t moved_value(int r, std::size_t i) {
  return static_cast<std::int64_t>((static_cast<std::size_t>(r) * 31 + i * 7) % 97 + 1);
}

std::int64_t apply(ReduceOp op, std::int64_t a, std::int64_t b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kBand: return a & b;
    case ReduceOp::kBor: return a | b;
    case ReduceOp::kBxor: return a ^ b;
  }
  return 0;
}

template <typename C>
class Checker {
  using S = typename C::Stored;

 public:
  Checker(const Call& call, const CollLayout& layout, int rank, int ranks)
      : c_(call), l_(layout), me_(rank), n_(ranks) {
    // bool: sum and avg are logical or (dlop's kernels; MPI_LOR in the reference)
    op_ = call.dtype == DataType::kBool && (call.op == ReduceOp::kSum || call.op == ReduceOp::kAvg) ? ReduceOp::kBor
                                                                                                     : call.op;
    if (C::kFloat && call.op == ReduceOp::kAvg && reduces(call.kind)) {
      tolerance_ = call.dtype == DataType::kFloat64 ? 1e-12 : call.dtype == DataType::kFloat32 ? 1e-6
                   : call.dtype == DataType::kFloat16 ? 2e-3 : 1.6e-2;
    }
  }

  void prepare() const {
    auto* out = static_cast<S*>(c_.recv);
    if (has_output()) {
      for (std::size_t j = 0; j < l_.out_elems; ++j) {
        out[j] = C::encode(C::wrap(static_cast<std::int64_t>(std::floor(expected(j))) + 1));
      }
    }
    auto* in = static_cast<S*>(const_cast<void*>(c_.send));
    if (reduces(c_.kind)) {
      for (std::size_t i = 0; i < l_.in_elems; ++i) in[i] = C::encode(reduction_input(c_.op, c_.dtype, me_, n_, i));
    } else if (c_.kind != CollKind::kBroadcast) {
      for (std::size_t i = 0; i < l_.in_elems; ++i) in[i] = C::encode(moved_value(me_, i));
    } else if (me_ == c_.root) {
      for (std::size_t i = 0; i < l_.in_elems; ++i) in[i] = C::encode(moved_value(me_, i));
    }
  }

  std::size_t wrong() const {
    if (!has_output()) return 0;
    const auto* out = static_cast<const S*>(c_.recv);
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < l_.out_elems; ++j) {
      const double want = expected(j), got = C::decode(out[j]);
      const bool ok = tolerance_ == 0 ? got == want : std::abs(got - want) <= tolerance_ * std::max(1.0, std::abs(want));
      wrong += ok ? 0 : 1;
    }
    return wrong;
  }

 private:
  bool has_output() const {
    return c_.kind != CollKind::kBarrier && !(c_.kind == CollKind::kReduce && me_ != c_.root);
  }

  // The reduction of element i over all ranks, as stored (integers wrap).
  double reduced(std::size_t i) const {
    std::int64_t acc = C::wrap(reduction_input(c_.op, c_.dtype, 0, n_, i));
    for (int r = 1; r < n_; ++r) acc = C::wrap(apply(op_, acc, C::wrap(reduction_input(c_.op, c_.dtype, r, n_, i))));
    if (c_.op != ReduceOp::kAvg || c_.dtype == DataType::kBool) return static_cast<double>(acc);
    if (C::kFloat) return static_cast<double>(acc) / n_;
    return static_cast<double>(C::wrap(acc / n_));  // truncates toward zero, as dlop
  }

  double moved(int r, std::size_t i) const { return static_cast<double>(C::wrap(moved_value(r, i))); }

  double expected(std::size_t j) const {
    const std::size_t count = c_.count;
    switch (c_.kind) {
      case CollKind::kAllreduce:
      case CollKind::kReduce: return reduced(j);
      case CollKind::kReduceScatter: return reduced(static_cast<std::size_t>(me_) * count + j);
      case CollKind::kAllgather: return moved(static_cast<int>(j / count), j % count);
      case CollKind::kAlltoall:
        return moved(static_cast<int>(j / count), static_cast<std::size_t>(me_) * count + j % count);
      case CollKind::kBroadcast: return moved(c_.root, j);
      default: return 0;
    }
  }

  const Call& c_;
  const CollLayout& l_;
  int me_;
  int n_;
  ReduceOp op_;
  double tolerance_ = 0;
};

}  // namespace

void prepare_check(const Call& call, const CollLayout& layout, int rank, int ranks) {
  with_codec(call.dtype, [&](auto codec) { Checker<decltype(codec)>(call, layout, rank, ranks).prepare(); });
}

std::size_t count_wrong(const Call& call, const CollLayout& layout, int rank, int ranks) {
  return with_codec(call.dtype,
                    [&](auto codec) { return Checker<decltype(codec)>(call, layout, rank, ranks).wrong(); });
}

}  // namespace dlop::bench
