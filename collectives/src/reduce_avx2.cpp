// AVX2 + F16C reduction kernels. Compiled with -mavx2 -mf16c and run only when
// the CPU has both (reduce.cpp checks). Everything here has internal linkage
// and calls no out-of-line library template: see reduce_kernels.hpp.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "reduce_kernels.hpp"
#include "reduce_simd.hpp"

namespace dlop::coll::detail {
namespace {

using std::size_t;

// ---- Lanes: how one dtype is loaded into and stored from a vector, and its ops.

struct PsOps {  // f32 arithmetic, shared by f32, f16 and bf16
  using V = __m256;
  static constexpr bool kBitwise = false;
  static V qnan() { return _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)); }
  static V splat(int n) { return _mm256_set1_ps(static_cast<float>(n)); }
  static V sum(V a, V b) { return _mm256_add_ps(a, b); }
  static V prod(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  // min_ps/max_ps return their second operand where the two are equal or
  // unordered: or (min) / and (max) the bits where equal, so -0 < +0 in either
  // order, then put the default NaN where either is NaN.
  static V min(V a, V b) {
    V m = _mm256_min_ps(a, b);
    m = _mm256_or_ps(m, _mm256_and_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ), a));
    return _mm256_blendv_ps(m, qnan(), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static V max(V a, V b) {
    V m = _mm256_max_ps(a, b);
    m = _mm256_and_ps(m, _mm256_or_ps(a, _mm256_cmp_ps(a, b, _CMP_NEQ_UQ)));
    return _mm256_blendv_ps(m, qnan(), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
};

struct F32 : PsOps {
  using T = float;
  static constexpr size_t kLanes = 8;
  static V load(const Byte* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static void store(Byte* p, V v) { _mm256_storeu_ps(reinterpret_cast<float*>(p), v); }
};

struct F16 : PsOps {
  using T = std::uint16_t;
  static constexpr size_t kLanes = 8;
  static V load(const Byte* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(Byte* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

struct BF16 : PsOps {
  using T = std::uint16_t;
  static constexpr size_t kLanes = 8;
  static V load(const Byte* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static void store(Byte* p, V v) {  // as float_to_bf16: nearest even, NaN quietened
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    // Eight 32-bit lanes below 2^16 -> eight 16-bit ones, in order.
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};

struct F64 {
  using T = double;
  using V = __m256d;
  static constexpr size_t kLanes = 4;
  static constexpr bool kBitwise = false;
  static V load(const Byte* p) { return _mm256_loadu_pd(reinterpret_cast<const double*>(p)); }
  static void store(Byte* p, V v) { _mm256_storeu_pd(reinterpret_cast<double*>(p), v); }
  static V qnan() { return _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FF8000000000000)); }
  static V splat(int n) { return _mm256_set1_pd(static_cast<double>(n)); }
  static V sum(V a, V b) { return _mm256_add_pd(a, b); }
  static V prod(V a, V b) { return _mm256_mul_pd(a, b); }
  static V div(V a, V b) { return _mm256_div_pd(a, b); }
  static V min(V a, V b) {  // as PsOps::min
    V m = _mm256_min_pd(a, b);
    m = _mm256_or_pd(m, _mm256_and_pd(_mm256_cmp_pd(a, b, _CMP_EQ_OQ), a));
    return _mm256_blendv_pd(m, qnan(), _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
  }
  static V max(V a, V b) {
    V m = _mm256_max_pd(a, b);
    m = _mm256_and_pd(m, _mm256_or_pd(a, _mm256_cmp_pd(a, b, _CMP_NEQ_UQ)));
    return _mm256_blendv_pd(m, qnan(), _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
  }
};

struct SiMem {
  using V = __m256i;
  static V load(const Byte* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(Byte* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};

template <typename Int>
struct IntLanes : SiMem {
  using T = Int;
  static constexpr size_t kLanes = 32 / sizeof(T);
  static constexpr bool kBitwise = true;
  static constexpr bool kSigned = std::is_signed_v<T>;

  static V sum(V a, V b) {
    if constexpr (sizeof(T) == 1) return _mm256_add_epi8(a, b);
    else if constexpr (sizeof(T) == 2) return _mm256_add_epi16(a, b);
    else if constexpr (sizeof(T) == 4) return _mm256_add_epi32(a, b);
    else return _mm256_add_epi64(a, b);
  }
  static V prod(V a, V b) {  // low half of the product: the same for signed and unsigned
    if constexpr (sizeof(T) == 1) {  // no 8-bit multiply: even and odd bytes in 16-bit lanes
      const V even = _mm256_mullo_epi16(a, b);
      const V odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
      return _mm256_or_si256(_mm256_slli_epi16(odd, 8), _mm256_and_si256(even, _mm256_set1_epi16(0xFF)));
    } else if constexpr (sizeof(T) == 2) {
      return _mm256_mullo_epi16(a, b);
    } else if constexpr (sizeof(T) == 4) {
      return _mm256_mullo_epi32(a, b);
    } else {  // lo*lo + ((hi*lo + lo*hi) << 32), from 32x32->64 multiplies
      const V cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                       _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
      return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
    }
  }
  static V min(V a, V b) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm256_min_epi8(a, b) : _mm256_min_epu8(a, b);
    else if constexpr (sizeof(T) == 2) return _mm256_min_epi16(a, b);
    else if constexpr (sizeof(T) == 4) return _mm256_min_epi32(a, b);
    else return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
  }
  static V max(V a, V b) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm256_max_epi8(a, b) : _mm256_max_epu8(a, b);
    else if constexpr (sizeof(T) == 2) return _mm256_max_epi16(a, b);
    else if constexpr (sizeof(T) == 4) return _mm256_max_epi32(a, b);
    else return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a));
  }
  static V band(V a, V b) { return _mm256_and_si256(a, b); }
  static V bor(V a, V b) { return _mm256_or_si256(a, b); }
  static V bxor(V a, V b) { return _mm256_xor_si256(a, b); }
};

struct BoolLogic : SiMem {  // any non-zero byte is true; results are 0 or 1
  static constexpr size_t kLanes = 32;
  static V is_zero(V v) { return _mm256_cmpeq_epi8(v, _mm256_setzero_si256()); }
  static V one() { return _mm256_set1_epi8(1); }
  static V lor(V a, V b) { return _mm256_andnot_si256(is_zero(_mm256_or_si256(a, b)), one()); }
  static V land(V a, V b) { return _mm256_andnot_si256(_mm256_or_si256(is_zero(a), is_zero(b)), one()); }
  static V lxor(V a, V b) { return _mm256_and_si256(_mm256_xor_si256(is_zero(a), is_zero(b)), one()); }
};

}  // namespace

const ReduceKernels& avx2_kernels() {
  // Tails finish with the scalar kernel: AVX2 has no masked byte loads and stores.
  static constexpr ReduceKernels kKernels{"avx2", reduce_by_dtype<F32, F64, F16, BF16, IntLanes, BoolOps<BoolLogic>>,
                                          divide_by_dtype<F32, F64, F16, BF16>};
  return kKernels;
}

}  // namespace dlop::coll::detail
