/*
 * mixprec.h: the header to include for mixprec's C API.
 *
 * mixprec's kernels are plain C11 (CPU) and CUDA C (GPU). This header holds
 * what every op family shares (status codes, dtypes, the 16-bit storage
 * types, CPU dispatch and threads, the multi-tensor descriptor) and includes
 * the header of each family, so that it alone declares every entry point:
 *   mixprec/amp.h            loss scaling: unscale, grad_norm, update_scale
 *   mixprec/optim.h          fused master-weight AdamW and SGD steps
 *   mixprec/nms.h            greedy and class-aware NMS
 *   mixprec/efficient_nms.h  batched detection post-processing (EfficientNMS)
 *   mixprec/softmax.h        softmax and log_softmax
 *   mixprec/cross_entropy.h  cross-entropy (class indices or probabilities)
 *   mixprec/roi_align.h      RoIAlign forward and backward
 *   mixprec/overflow.h       the forward-overflow check (mixprec.guard)
 *   mixprec/act_pack.h       compressed activations (mixprec.memory)
 * None of them needs torch or CUDA. The torch shim is one client of the API,
 * ctypes or another framework can be another.
 *
 * A worked example: unscale two gradients of different dtypes in place, learn
 * whether any held inf/NaN, and get their L2 norm from the same pass.
 *
 *     float g32[1000];  mixprec_bf16 g16[500];      // filled by backward
 *     mixprec_tensor list[2] = {
 *         { g32, 1000, MIXPREC_F32 },
 *         { g16, 500,  MIXPREC_BF16 },
 *     };
 *     float inv_scale = 1.0f / 65536.0f, found_inf = 0.0f, norms[2], total;
 *     mixprec_status st = mixprec_unscale(list, 2, &inv_scale, &found_inf,
 *                                         norms, &total);
 *     if (st != MIXPREC_OK) fprintf(stderr, "%s\n", mixprec_status_string(st));
 *     // found_inf != 0 -> skip the optimizer step; total -> clip.
 *
 * Conventions.
 * - Every entry point returns a mixprec_status; results go through
 *   out-parameters. Nothing aborts, exits, throws, or prints.
 * - Element counts are int64_t. Enum values are pinned and append-only.
 * - FP16 and BF16 are 16-bit storage types: no arithmetic is done on them;
 *   every computation is in float (FP32) and results are rounded back to
 *   nearest, ties to even. A NaN stays a NaN.
 * - mixprec_<op> is the CPU entry point (host pointers). mixprec_cuda_<op>
 *   (in libmixprec_cuda) takes the same arguments, all of them device pointers
 *   except the descriptor arrays and parameter structs, which stay on the host,
 *   plus a cudaStream_t passed as void *; it only enqueues work on that stream
 *   and never synchronises with the host.
 * - On any error status no output has been written.
 */
#ifndef MIXPREC_MIXPREC_H
#define MIXPREC_MIXPREC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  ifdef MIXPREC_BUILDING
#    define MIXPREC_API __declspec(dllexport)
#  else
#    define MIXPREC_API __declspec(dllimport)
#  endif
#else
#  define MIXPREC_API __attribute__((visibility("default")))
#endif

#define MIXPREC_VERSION_MAJOR 0
#define MIXPREC_VERSION_MINOR 1
#define MIXPREC_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* One list generates the enum and the strings; values are pinned. */
#define MIXPREC_STATUS_LIST(X)                                                 \
  X(MIXPREC_OK, 0, "success")                                                  \
  X(MIXPREC_ERR_NULL_POINTER, 1, "a required pointer argument is NULL")        \
  X(MIXPREC_ERR_BAD_DTYPE, 2, "unsupported or mismatched dtype")               \
  X(MIXPREC_ERR_BAD_SIZE, 3, "negative or inconsistent element count")         \
  X(MIXPREC_ERR_BAD_ARGUMENT, 4, "an argument is out of its valid range")      \
  X(MIXPREC_ERR_OUT_OF_MEMORY, 5, "host memory allocation failed")             \
  X(MIXPREC_ERR_CUDA, 6, "a CUDA runtime call failed")                         \
  X(MIXPREC_ERR_UNSUPPORTED, 7, "not supported by this build or this CPU")

typedef enum mixprec_status {
#define MIXPREC_X_ENUM(name, value, text) name = value,
  MIXPREC_STATUS_LIST(MIXPREC_X_ENUM)
#undef MIXPREC_X_ENUM
} mixprec_status;

/*! mixprec_status_string() :
 *  @return : a static, never-NULL English description of `status`
 *            ("unknown status" for a value outside the list). */
MIXPREC_API const char *mixprec_status_string(mixprec_status status);

/*! mixprec_version() :
 *  @return : MIXPREC_VERSION_MAJOR * 10000 + MINOR * 100 + PATCH of the
 *            library actually loaded (may differ from this header's). */
MIXPREC_API int mixprec_version(void);

/* ------------------------------------------------------------------------ */
/* Dtypes                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum mixprec_dtype {
  MIXPREC_F32 = 0,
  MIXPREC_F16 = 1, /* IEEE 754 binary16 */
  MIXPREC_BF16 = 2 /* bfloat16: the top 16 bits of a float */
} mixprec_dtype;

/* Storage-only 16-bit types: wrapping the bits in a struct stops accidental
 * arithmetic on them. Layout is exactly one uint16_t. */
typedef struct mixprec_f16 { uint16_t bits; } mixprec_f16;
typedef struct mixprec_bf16 { uint16_t bits; } mixprec_bf16;

/*! mixprec_dtype_size() :
 *  @return : bytes per element of `dtype`, or 0 for an unknown dtype. */
MIXPREC_API int mixprec_dtype_size(mixprec_dtype dtype);

/*! mixprec_f16_to_f32(), mixprec_f32_to_f16(), mixprec_bf16_to_f32(),
 *  mixprec_f32_to_bf16() :
 *  Exact widening; narrowing rounds to nearest, ties to even, overflows to
 *  inf, keeps subnormals (no flush to zero) and keeps NaN a (quiet) NaN of the
 *  same sign. The kernels use these same conversions. */
MIXPREC_API float mixprec_f16_to_f32(mixprec_f16 h);
MIXPREC_API mixprec_f16 mixprec_f32_to_f16(float f);
MIXPREC_API float mixprec_bf16_to_f32(mixprec_bf16 h);
MIXPREC_API mixprec_bf16 mixprec_f32_to_bf16(float f);

/* ------------------------------------------------------------------------ */
/* CPU dispatch and threads                                                  */
/* ------------------------------------------------------------------------ */

/* Instruction-set paths of the CPU kernels, best first. Results are
 * bit-identical across paths. */
typedef enum mixprec_cpu_isa {
  MIXPREC_ISA_AUTO = 0,   /* the best path this CPU supports */
  MIXPREC_ISA_SCALAR = 1, /* portable C, any CPU */
  MIXPREC_ISA_AVX2 = 2,   /* x86-64 AVX2 + FMA + F16C */
  MIXPREC_ISA_AVX512 = 3  /* x86-64 AVX-512 F/BW/VL (+ F16C) */
} mixprec_cpu_isa;

/*! mixprec_cpu_isa_supported() :
 *  @return : 1 if this CPU (and this build) can run `isa`, else 0. */
MIXPREC_API int mixprec_cpu_isa_supported(mixprec_cpu_isa isa);

/*! mixprec_set_cpu_isa() :
 *  Forces the CPU kernels onto one path (for tests and benchmarks); AUTO
 *  restores the default, which is the best supported path, or the one named by
 *  the environment variable MIXPREC_CPU_ISA (scalar, avx2, avx512) if set.
 *  Not thread-safe with respect to kernels running concurrently.
 *  @return : MIXPREC_ERR_UNSUPPORTED if this CPU cannot run `isa`,
 *            MIXPREC_ERR_BAD_ARGUMENT for an unknown value. */
MIXPREC_API mixprec_status mixprec_set_cpu_isa(mixprec_cpu_isa isa);

/*! mixprec_get_cpu_isa() :
 *  @return : the path the CPU kernels use now (never AUTO). */
MIXPREC_API mixprec_cpu_isa mixprec_get_cpu_isa(void);

/*! mixprec_set_num_threads() :
 *  Upper bound on the OpenMP threads a CPU kernel uses; 0 restores the
 *  default (OpenMP's own). Results never depend on the thread count. */
MIXPREC_API void mixprec_set_num_threads(int n);
MIXPREC_API int mixprec_get_num_threads(void);

/* ------------------------------------------------------------------------ */
/* Multi-tensor lists                                                        */
/* ------------------------------------------------------------------------ */

/* One tensor of a multi-tensor list: `numel` contiguous elements of `dtype`
 * at `data` (any alignment of the element type). numel may be 0, in which case
 * data may be NULL. */
typedef struct mixprec_tensor {
  void *data;
  int64_t numel;
  mixprec_dtype dtype;
} mixprec_tensor;

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The op families, one header each (each includes this one). */
#include "mixprec/amp.h"     /* loss scaling */
#include "mixprec/optim.h"   /* fused optimizer steps */
#include "mixprec/nms.h"     /* greedy and class-aware NMS */
#include "mixprec/efficient_nms.h"  /* batched detection post-processing */
#include "mixprec/softmax.h" /* softmax, log_softmax */
#include "mixprec/cross_entropy.h" /* cross-entropy */
#include "mixprec/roi_align.h" /* RoIAlign forward and backward */
#include "mixprec/overflow.h" /* forward-overflow check (mixprec.guard) */
#include "mixprec/act_pack.h" /* compressed activations (mixprec.memory) */

#endif /* MIXPREC_MIXPREC_H */
