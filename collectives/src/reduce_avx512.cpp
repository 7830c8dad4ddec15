// AVX-512 reduction kernels. Compiled with -mavx512f -mavx512bw -mavx512vl and
// run only when the CPU has all three (reduce.cpp checks). Tails use masked
// loads and stores, which do not fault on the lanes masked out. Everything here
// has internal linkage and calls no out-of-line library template: see
// reduce_kernels.hpp.
//
// bf16 is converted by shifting, not with AVX512-BF16's VCVTNEPS2BF16: that
// instruction flushes subnormal inputs and outputs to zero, unlike torch's and
// our scalar conversion, and it would leave out the many AVX-512 CPUs without it.
// GCC 12's AVX-512 headers self-initialise "undefined" vectors (__m512i __Y = __Y)
// and -Wmaybe-uninitialized reports them once inlined here (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "reduce_kernels.hpp"
#include "reduce_simd.hpp"

namespace dlop::coll::detail {
namespace {

using std::size_t;

// The low r bits set, r < 64.
constexpr std::uint64_t low_bits(size_t r) { return (std::uint64_t{1} << r) - 1; }

// ---- Lanes: how one dtype is loaded into and stored from a vector (whole, or
// its first r < kLanes elements), and its ops.

struct PsOps {  // f32 arithmetic, shared by f32, f16 and bf16
  using V = __m512;
  static constexpr bool kBitwise = false;
  static V splat(int n) { return _mm512_set1_ps(static_cast<float>(n)); }
  static V sum(V a, V b) { return _mm512_add_ps(a, b); }
  static V prod(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  // min_ps/max_ps return their second operand where the two are equal or
  // unordered: or (min) / and (max) the bits where equal, so -0 < +0 in either
  // order, then put the default NaN where either is NaN.
  static V min(V a, V b) {
    const __m512i m = _mm512_castps_si512(_mm512_min_ps(a, b));
    const __m512i r = _mm512_mask_or_epi32(m, _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), m, _mm512_castps_si512(a));
    return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), qnan());
  }
  static V max(V a, V b) {
    const __m512i m = _mm512_castps_si512(_mm512_max_ps(a, b));
    const __m512i r = _mm512_mask_and_epi32(m, _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), m, _mm512_castps_si512(a));
    return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), qnan());
  }
  static V qnan() { return _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)); }
};

struct F32 : PsOps {
  using T = float;
  static constexpr size_t kLanes = 16;
  static V load(const Byte* p) { return _mm512_loadu_ps(p); }
  static void store(Byte* p, V v) { _mm512_storeu_ps(p, v); }
  static V load_part(const Byte* p, size_t r) { return _mm512_maskz_loadu_ps(static_cast<__mmask16>(low_bits(r)), p); }
  static void store_part(Byte* p, V v, size_t r) { _mm512_mask_storeu_ps(p, static_cast<__mmask16>(low_bits(r)), v); }
};

struct F16 : PsOps {
  using T = std::uint16_t;
  static constexpr size_t kLanes = 16;
  static V widen(__m256i h) { return _mm512_cvtph_ps(h); }
  static __m256i narrow(V v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); }
  static V load(const Byte* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(Byte* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v)); }
  static V load_part(const Byte* p, size_t r) {
    return widen(_mm256_maskz_loadu_epi16(static_cast<__mmask16>(low_bits(r)), p));
  }
  static void store_part(Byte* p, V v, size_t r) {
    _mm256_mask_storeu_epi16(p, static_cast<__mmask16>(low_bits(r)), narrow(v));
  }
};

struct BF16 : PsOps {
  using T = std::uint16_t;
  static constexpr size_t kLanes = 16;
  static V widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m256i narrow(V v) {  // as float_to_bf16: nearest even, NaN quietened
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __m512i r = _mm512_mask_or_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), high, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
  }
  static V load(const Byte* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(Byte* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v)); }
  static V load_part(const Byte* p, size_t r) {
    return widen(_mm256_maskz_loadu_epi16(static_cast<__mmask16>(low_bits(r)), p));
  }
  static void store_part(Byte* p, V v, size_t r) {
    _mm256_mask_storeu_epi16(p, static_cast<__mmask16>(low_bits(r)), narrow(v));
  }
};

struct F64 {
  using T = double;
  using V = __m512d;
  static constexpr size_t kLanes = 8;
  static constexpr bool kBitwise = false;
  static V load(const Byte* p) { return _mm512_loadu_pd(p); }
  static void store(Byte* p, V v) { _mm512_storeu_pd(p, v); }
  static V load_part(const Byte* p, size_t r) { return _mm512_maskz_loadu_pd(static_cast<__mmask8>(low_bits(r)), p); }
  static void store_part(Byte* p, V v, size_t r) { _mm512_mask_storeu_pd(p, static_cast<__mmask8>(low_bits(r)), v); }
  static V qnan() { return _mm512_castsi512_pd(_mm512_set1_epi64(0x7FF8000000000000)); }
  static V splat(int n) { return _mm512_set1_pd(static_cast<double>(n)); }
  static V sum(V a, V b) { return _mm512_add_pd(a, b); }
  static V prod(V a, V b) { return _mm512_mul_pd(a, b); }
  static V div(V a, V b) { return _mm512_div_pd(a, b); }
  static V min(V a, V b) {  // as PsOps::min
    const __m512i m = _mm512_castpd_si512(_mm512_min_pd(a, b));
    const __m512i r = _mm512_mask_or_epi64(m, _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ), m, _mm512_castpd_si512(a));
    return _mm512_mask_mov_pd(_mm512_castsi512_pd(r), _mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q), qnan());
  }
  static V max(V a, V b) {
    const __m512i m = _mm512_castpd_si512(_mm512_max_pd(a, b));
    const __m512i r = _mm512_mask_and_epi64(m, _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ), m, _mm512_castpd_si512(a));
    return _mm512_mask_mov_pd(_mm512_castsi512_pd(r), _mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q), qnan());
  }
};

template <size_t kSize>
struct SiMem {
  using V = __m512i;
  static constexpr size_t kLanes = 64 / kSize;
  static V load(const Byte* p) { return _mm512_loadu_si512(p); }
  static void store(Byte* p, V v) { _mm512_storeu_si512(p, v); }
  static V load_part(const Byte* p, size_t r) {
    if constexpr (kSize == 1) return _mm512_maskz_loadu_epi8(static_cast<__mmask64>(low_bits(r)), p);
    else if constexpr (kSize == 2) return _mm512_maskz_loadu_epi16(static_cast<__mmask32>(low_bits(r)), p);
    else if constexpr (kSize == 4) return _mm512_maskz_loadu_epi32(static_cast<__mmask16>(low_bits(r)), p);
    else return _mm512_maskz_loadu_epi64(static_cast<__mmask8>(low_bits(r)), p);
  }
  static void store_part(Byte* p, V v, size_t r) {
    if constexpr (kSize == 1) _mm512_mask_storeu_epi8(p, static_cast<__mmask64>(low_bits(r)), v);
    else if constexpr (kSize == 2) _mm512_mask_storeu_epi16(p, static_cast<__mmask32>(low_bits(r)), v);
    else if constexpr (kSize == 4) _mm512_mask_storeu_epi32(p, static_cast<__mmask16>(low_bits(r)), v);
    else _mm512_mask_storeu_epi64(p, static_cast<__mmask8>(low_bits(r)), v);
  }
};

template <typename Int>
struct IntLanes : SiMem<sizeof(Int)> {
  using T = Int;
  using V = __m512i;
  static constexpr bool kBitwise = true;
  static constexpr bool kSigned = std::is_signed_v<T>;

  static V sum(V a, V b) {
    if constexpr (sizeof(T) == 1) return _mm512_add_epi8(a, b);
    else if constexpr (sizeof(T) == 2) return _mm512_add_epi16(a, b);
    else if constexpr (sizeof(T) == 4) return _mm512_add_epi32(a, b);
    else return _mm512_add_epi64(a, b);
  }
  static V prod(V a, V b) {  // low half of the product: the same for signed and unsigned
    if constexpr (sizeof(T) == 1) {  // no 8-bit multiply: even and odd bytes in 16-bit lanes
      const V even = _mm512_mullo_epi16(a, b);
      const V odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
      return _mm512_or_si512(_mm512_slli_epi16(odd, 8), _mm512_and_si512(even, _mm512_set1_epi16(0xFF)));
    } else if constexpr (sizeof(T) == 2) {
      return _mm512_mullo_epi16(a, b);
    } else if constexpr (sizeof(T) == 4) {
      return _mm512_mullo_epi32(a, b);
    } else {  // lo*lo + ((hi*lo + lo*hi) << 32); VPMULLQ would need AVX512DQ
      const V cross = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(a, 32), b),
                                       _mm512_mul_epu32(a, _mm512_srli_epi64(b, 32)));
      return _mm512_add_epi64(_mm512_mul_epu32(a, b), _mm512_slli_epi64(cross, 32));
    }
  }
  static V min(V a, V b) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm512_min_epi8(a, b) : _mm512_min_epu8(a, b);
    else if constexpr (sizeof(T) == 2) return _mm512_min_epi16(a, b);
    else if constexpr (sizeof(T) == 4) return _mm512_min_epi32(a, b);
    else return _mm512_min_epi64(a, b);
  }
  static V max(V a, V b) {
    if constexpr (sizeof(T) == 1) return kSigned ? _mm512_max_epi8(a, b) : _mm512_max_epu8(a, b);
    else if constexpr (sizeof(T) == 2) return _mm512_max_epi16(a, b);
    else if constexpr (sizeof(T) == 4) return _mm512_max_epi32(a, b);
    else return _mm512_max_epi64(a, b);
  }
  static V band(V a, V b) { return _mm512_and_si512(a, b); }
  static V bor(V a, V b) { return _mm512_or_si512(a, b); }
  static V bxor(V a, V b) { return _mm512_xor_si512(a, b); }
};

struct BoolLogic : SiMem<1> {  // any non-zero byte is true; results are 0 or 1
  static __mmask64 truth(V v) { return _mm512_test_epi8_mask(v, v); }
  static V from(__mmask64 k) { return _mm512_maskz_mov_epi8(k, _mm512_set1_epi8(1)); }
  static V lor(V a, V b) { return from(truth(_mm512_or_si512(a, b))); }
  static V land(V a, V b) { return from(_kand_mask64(truth(a), truth(b))); }
  static V lxor(V a, V b) { return from(_kxor_mask64(truth(a), truth(b))); }
};

}  // namespace

const ReduceKernels& avx512_kernels() {
  // Tails use masked loads and stores (load_part, store_part).
  static constexpr ReduceKernels kKernels{"avx512",
                                          reduce_by_dtype<F32, F64, F16, BF16, IntLanes, BoolOps<BoolLogic>>,
                                          divide_by_dtype<F32, F64, F16, BF16>};
  return kKernels;
}

}  // namespace dlop::coll::detail
