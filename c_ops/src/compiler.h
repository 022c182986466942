/* The one home of mixprec's inline macros (as zstd's lib/common/compiler.h),
 * for the C files of c_ops/src, the CUDA files of kernels/ and the headers
 * both share. Internal; not installed.
 *
 *   MIXPREC__INLINE        a small helper; the compiler decides.
 *   MIXPREC__FORCE_INLINE  a kernel body or element helper that must be
 *                          inlined into its loop (C "templates" stamped per
 *                          dtype or ISA rely on it).
 *   MIXPREC__HD            code compiled for host and device alike under nvcc
 *                          (forced inline there), MIXPREC__FORCE_INLINE in C.
 *   MIXPREC__DEVICE        device-only code of kernels/, forced inline. */
#ifndef MIXPREC_COMPILER_H
#define MIXPREC_COMPILER_H

#define MIXPREC__INLINE static inline

#if defined(__GNUC__)
#  define MIXPREC__FORCE_INLINE static inline __attribute__((always_inline))
#else
#  define MIXPREC__FORCE_INLINE static inline
#endif

#ifdef __CUDACC__
#  define MIXPREC__HD static __host__ __device__ __forceinline__
#  define MIXPREC__DEVICE static __device__ __forceinline__
#else
#  define MIXPREC__HD MIXPREC__INLINE
#endif

#endif /* MIXPREC_COMPILER_H */
