/* RoIAlign forward and backward on CUDA, with the CPU's float operations
 * (roi_align_internal.h, every operation a _rn intrinsic: no FMA), written
 * to match the CPU bit for bit; not yet run on a GPU.
 *
 * Forward: one thread per output element (roi, channel, bin), grid-strided.
 * Backward: a gather, deterministic and without atomics. A first kernel
 * derives every roi's geometry into the workspace; then each block takes a
 * 16 x 16 tile of one image's pixels and MIXPREC__ROI_GATHER_C channels,
 * compacts (in roi order) the rois that may touch the tile into shared
 * memory, 256 at a time, and each thread adds, for its pixel and channels,
 * the contributions of those rois in the CPU scatter's order (roi, bin,
 * sample, corner). Every grad_input element is written once, by one thread:
 * no zero-fill, no atomics, no float32 workspace for the grads. */
#include "common.cuh"
#include "roi_align_check.h"
#include "roi_align_internal.h"

#define ROI_THREADS 256
#define ROI_TILE 16

namespace {

__global__ void __launch_bounds__(ROI_THREADS)
    roi_forward(const void *input, mixprec_dtype dt, int64_t batch, int64_t C, int64_t H,
                int64_t W, const void *rois, mixprec_dtype rd, mixprec_roi_align_params p,
                float scale, void *out, mixprec_dtype od, int64_t total) {
  const int64_t PH = p.pooled_height, PW = p.pooled_width;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t pw = i % PW, ph = (i / PW) % PH, c = (i / (PW * PH)) % C, k = i / (PW * PH * C);
    const mixprec__roi r = mixprec__roi_make(rois, rd, k, batch, &p, scale);
    if (!r.finite || r.batch < 0) {
      mixprec__store_f32(out, od, i, __int_as_float(0x7fc00000));
      continue;
    }
    const int64_t base = (r.batch * C + c) * H * W;
    float val = 0.0f;
    for (int64_t iy = 0; iy < r.grid_h; iy++) {
      const mixprec__roi_axis ay =
          mixprec__roi_axis_at(mixprec__roi_coord(r.start_h, ph, r.bin_h, iy, r.grid_h), H);
      for (int64_t ix = 0; ix < r.grid_w; ix++) {
        const mixprec__roi_axis ax =
            mixprec__roi_axis_at(mixprec__roi_coord(r.start_w, pw, r.bin_w, ix, r.grid_w), W);
        const mixprec__roi_pc e = mixprec__roi_pc_at(ay, ax, W);
        val = __fadd_rn(val, mixprec__roi_sample(&e, input, dt, base));
      }
    }
    mixprec__store_f32(out, od, i, __fdiv_rn(val, r.count));
  }
}

__global__ void roi_geometry(const void *rois, mixprec_dtype rd, int64_t n_rois, int64_t batch,
                             mixprec_roi_align_params p, float scale, mixprec__roi *geom) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n_rois;
       k += (int64_t)gridDim.x * blockDim.x) {
    mixprec__roi r = mixprec__roi_make(rois, rd, k, batch, &p, scale);
    if (!r.finite || r.batch < 0) r.grid_h = r.grid_w = 0; /* no gradient */
    geom[k] = r;
  }
}

__global__ void __launch_bounds__(ROI_THREADS)
    roi_backward_gather(const mixprec__roi *geom, int64_t n_rois, const void *grad,
                        mixprec_dtype gd, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                        int64_t batch, int64_t C, int64_t H, int64_t W, int64_t PH, int64_t PW,
                        void *gi, mixprec_dtype gid, int64_t tiles_x, int64_t n_tiles,
                        int64_t n_cchunks) {
  __shared__ int s_list[ROI_THREADS];
  __shared__ int s_count[ROI_THREADS / MIXPREC__WARP];
  const int tid = threadIdx.x, lane = tid % MIXPREC__WARP, warp = tid / MIXPREC__WARP;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z)
    for (int64_t cch = blockIdx.y; cch < n_cchunks; cch += gridDim.y)
      for (int64_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const int64_t y0 = (t / tiles_x) * ROI_TILE, x0 = (t % tiles_x) * ROI_TILE;
        const int64_t y1 = min(y0 + ROI_TILE, H) - 1, x1 = min(x0 + ROI_TILE, W) - 1;
        const int64_t py = y0 + tid / ROI_TILE, px = x0 + tid % ROI_TILE;
        const bool mine = py < H && px < W;
        const int64_t c0 = cch * MIXPREC__ROI_GATHER_C;
        const int nc = (int)min((int64_t)MIXPREC__ROI_GATHER_C, C - c0);
        float acc[MIXPREC__ROI_GATHER_C];
#pragma unroll
        for (int cc = 0; cc < MIXPREC__ROI_GATHER_C; cc++) acc[cc] = 0.0f;
        for (int64_t j0 = 0; j0 < n_rois; j0 += ROI_THREADS) {
          const int64_t j = j0 + tid;
          int flag = 0;
          if (j < n_rois) {
            const mixprec__roi r = geom[j];
            flag = r.batch == b && r.grid_h > 0 && r.grid_w > 0 &&
                   mixprec__roi_may_touch_range(r.start_h,
                                                (double)r.start_h + (double)r.bin_h * (double)PH,
                                                y0, y1, H) &&
                   mixprec__roi_may_touch_range(r.start_w,
                                                (double)r.start_w + (double)r.bin_w * (double)PW,
                                                x0, x1, W);
          }
          const unsigned ballot = __ballot_sync(0xffffffffu, flag);
          if (lane == 0) s_count[warp] = __popc(ballot);
          __syncthreads();
          int before = 0, total = 0;
          for (int w = 0; w < ROI_THREADS / MIXPREC__WARP; w++) {
            if (w < warp) before += s_count[w];
            total += s_count[w];
          }
          if (flag) s_list[before + __popc(ballot & ((1u << lane) - 1u))] = (int)(j - j0);
          __syncthreads();
          if (mine) {
            for (int i = 0; i < total; i++) {
              const int64_t k = j0 + s_list[i];
              const mixprec__roi r = geom[k];
              mixprec__roi_gather(&r, grad, gd, k * s0 + c0 * s1, s1, nc, s2, s3, PH, PW, H, W,
                                  py, px, acc);
            }
          }
          __syncthreads();
        }
        if (mine)
          for (int cc = 0; cc < nc; cc++)
            mixprec__store_f32(gi, gid, ((b * C + c0 + cc) * H + py) * W + px, acc[cc]);
      }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + ROI_THREADS - 1) / ROI_THREADS;
  return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

int aligned_to(const void *p, mixprec_dtype dt) {
  return (uintptr_t)p % (uintptr_t)mixprec_dtype_size(dt) == 0;
}

}  // namespace

extern "C" {

mixprec_status mixprec_cuda_roi_align(const void *input, mixprec_dtype input_dtype, int64_t batch,
                                      int64_t channels, int64_t height, int64_t width,
                                      const void *rois, mixprec_dtype rois_dtype, int64_t n_rois,
                                      const mixprec_roi_align_params *p, void *output,
                                      mixprec_dtype output_dtype, void *stream) {
  int64_t in_numel, out_numel;
  mixprec_status st = mixprec__roi_align_forward_check(input, input_dtype, batch, channels, height,
                                                       width, rois, rois_dtype, n_rois, p, output,
                                                       output_dtype, &in_numel, &out_numel);
  if (st != MIXPREC_OK || out_numel == 0) return st;
  if (!aligned_to(input, input_dtype) || !aligned_to(rois, rois_dtype) ||
      !aligned_to(output, output_dtype))
    return MIXPREC_ERR_BAD_ARGUMENT;
  roi_forward<<<blocks_for(out_numel), ROI_THREADS, 0, (cudaStream_t)stream>>>(
      input, input_dtype, batch, channels, height, width, rois, rois_dtype, *p,
      (float)p->spatial_scale, output, output_dtype, out_numel);
  return mixprec__cuda_launch_status();
}

int64_t mixprec_cuda_roi_align_backward_workspace_size(int64_t n_rois, int64_t batch) {
  if (n_rois < 0 || batch < 0) return -1;
  if (n_rois > INT64_MAX / (int64_t)sizeof(mixprec__roi) - 1) return -1;
  return (n_rois > 0 ? n_rois : 1) * (int64_t)sizeof(mixprec__roi);
}

mixprec_status mixprec_cuda_roi_align_backward(
    const void *grad_output, mixprec_dtype grad_dtype, const int64_t *grad_strides,
    const void *rois, mixprec_dtype rois_dtype, int64_t n_rois, int64_t batch,
    int64_t channels, int64_t height, int64_t width, const mixprec_roi_align_params *p,
    void *grad_input, mixprec_dtype grad_input_dtype, void *workspace, int64_t workspace_bytes,
    void *stream) {
  int64_t in_numel, out_numel;
  mixprec_status st = mixprec__roi_align_backward_check(
      grad_output, grad_dtype, grad_strides, rois, rois_dtype, n_rois, batch, channels, height, width, p,
      grad_input, grad_input_dtype, &in_numel, &out_numel);
  if (st != MIXPREC_OK || in_numel == 0) return st;
  if (!workspace) return MIXPREC_ERR_NULL_POINTER;
  if (out_numel == 0) n_rois = 0;
  if (workspace_bytes < mixprec_cuda_roi_align_backward_workspace_size(n_rois, batch) ||
      (uintptr_t)workspace % 256 != 0)
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (!aligned_to(grad_input, grad_input_dtype) ||
      (n_rois > 0 && (!aligned_to(grad_output, grad_dtype) || !aligned_to(rois, rois_dtype))))
    return MIXPREC_ERR_BAD_ARGUMENT;
  cudaStream_t s = (cudaStream_t)stream;
  mixprec__roi *geom = (mixprec__roi *)workspace;
  if (n_rois > 0) {
    roi_geometry<<<blocks_for(n_rois), ROI_THREADS, 0, s>>>(rois, rois_dtype, n_rois, batch, *p,
                                                            (float)p->spatial_scale, geom);
    st = mixprec__cuda_launch_status();
    if (st != MIXPREC_OK) return st;
  }
  const int64_t tiles_x = (width + ROI_TILE - 1) / ROI_TILE;
  const int64_t n_tiles = tiles_x * ((height + ROI_TILE - 1) / ROI_TILE);
  const int64_t n_cchunks = (channels + MIXPREC__ROI_GATHER_C - 1) / MIXPREC__ROI_GATHER_C;
  dim3 grid((unsigned)(n_tiles < 2147483647 ? n_tiles : 2147483647),
            (unsigned)(n_cchunks < 65535 ? n_cchunks : 65535),
            (unsigned)(batch < 65535 ? batch : 65535));
  roi_backward_gather<<<grid, ROI_THREADS, 0, s>>>(
      geom, n_rois, grad_output, grad_dtype, grad_strides[0], grad_strides[1], grad_strides[2],
      grad_strides[3], batch, channels, height, width, p->pooled_height, p->pooled_width,
      grad_input, grad_input_dtype, tiles_x, n_tiles, n_cchunks);
  return mixprec__cuda_launch_status();
}

}  /* extern "C" */
