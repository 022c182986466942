/* Stand-in for cub::DeviceRadixSort's SortPairs / SortPairsDescending: a
 * stable host sort on the key bits [begin_bit, end_bit) with cub's key
 * order (floats and signed integers by value), issued to the stream like a
 * kernel. It checks that every device range lies in one cudaMalloc
 * allocation, that the temporary storage is at least what the size query
 * returned, and overwrites that storage (cub leaves nothing there a caller
 * may rely on). */
#ifndef MIXPREC_CUDA_EMU_CUB_RADIX_H
#define MIXPREC_CUDA_EMU_CUB_RADIX_H
#include <algorithm>
#include <vector>

#include "../../cuda_runtime.h"

namespace cub {
namespace emu_detail {
template <class K> uint64_t radix_bits(K k) {
  uint64_t u = ::emu::to_bits(k);
  const int nb = 8 * sizeof(K);
  const uint64_t sign = (uint64_t)1 << (nb - 1);
  if (std::is_floating_point<K>::value) {
    u = (u & sign) ? (~u & (nb == 64 ? ~0ull : ((1ull << nb) - 1))) : (u | sign);
  } else if (std::is_signed<K>::value) {
    u ^= sign;
  }
  return u;
}
inline size_t temp_bytes_for(size_t n, size_t kv) { return 2 * n * kv + 4096; }
template <bool DESC, class K, class V, class N>
cudaError_t sort_pairs(void *temp, size_t &temp_bytes, const K *kin, K *kout, const V *vin, V *vout,
                       N num_items, int begin_bit, int end_bit, cudaStream_t stream) {
  const size_t n = num_items < 0 ? 0 : (size_t)num_items;
  const size_t need = temp_bytes_for(n, sizeof(K) + sizeof(V));
  if (temp == nullptr) {
    temp_bytes = need;
    return cudaSuccess;
  }
  if (temp_bytes < need) return cudaErrorInvalidValue;
  if (begin_bit < 0 || end_bit > (int)(8 * sizeof(K)) || begin_bit >= end_bit) return cudaErrorInvalidValue;
  return ::emu::stream_op(stream, "cub::DeviceRadixSort", [=] {
    if (n == 0) return;
    ::emu::check_device_range(temp, temp_bytes, "cub temp storage");
    ::emu::check_device_range(kin, n * sizeof(K), "cub keys in");
    ::emu::check_device_range(kout, n * sizeof(K), "cub keys out");
    ::emu::check_device_range(vin, n * sizeof(V), "cub values in");
    ::emu::check_device_range(vout, n * sizeof(V), "cub values out");
    const uint64_t mask = (end_bit - begin_bit == 64 ? ~0ull : ((1ull << (end_bit - begin_bit)) - 1))
                          << begin_bit;
    std::vector<std::pair<uint64_t, size_t>> order(n);
    for (size_t i = 0; i < n; i++) order[i] = {radix_bits(kin[i]) & mask, i};
    std::stable_sort(order.begin(), order.end(), [](const auto &a, const auto &b) {
      return DESC ? a.first > b.first : a.first < b.first;
    });
    std::vector<K> ks(n);
    std::vector<V> vs(n);
    for (size_t i = 0; i < n; i++) ks[i] = kin[order[i].second], vs[i] = vin[order[i].second];
    memset(temp, ::emu::fill_byte() ^ 0x5a, temp_bytes);
    std::copy(ks.begin(), ks.end(), kout);
    std::copy(vs.begin(), vs.end(), vout);
  });
}
}  // namespace emu_detail

struct DeviceRadixSort {
  template <class K, class V, class N>
  static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *kin, K *kout, const V *vin,
                               V *vout, N num_items, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = 0) {
    return emu_detail::sort_pairs<false>(temp, temp_bytes, kin, kout, vin, vout, num_items,
                                         begin_bit, end_bit, stream);
  }
  template <class K, class V, class N>
  static cudaError_t SortPairsDescending(void *temp, size_t &temp_bytes, const K *kin, K *kout,
                                         const V *vin, V *vout, N num_items, int begin_bit = 0,
                                         int end_bit = sizeof(K) * 8, cudaStream_t stream = 0) {
    return emu_detail::sort_pairs<true>(temp, temp_bytes, kin, kout, vin, vout, num_items,
                                        begin_bit, end_bit, stream);
  }
};
}  // namespace cub
#endif
