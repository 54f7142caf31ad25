// mine.cu: an embedding-bag kernel of one's own, brought to characterize.
//
// A warp per bag, each lane reading 16 bytes (4 features) of a row, two rows in flight:
// small enough to read in full, and what the README's "bring your own kernel" section
// compiles, analyzes and predicts beside the built-in family. It includes the toolkit's
// header for the argument structs and error codes, so the same file also compiles for
// the CPU emulator (-DCHZ_EMULATE) and is checked against torch without a GPU.
#include "chz_compat.cuh"

__global__ void mine_kernel(const float* __restrict__ weight, const int64_t* __restrict__ indices,
                            const int64_t* __restrict__ offsets, int64_t num_indices, int64_t num_bags,
                            int64_t dim, int64_t stride, int32_t mode, float* __restrict__ output) {
  const int64_t bag = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  if (bag >= num_bags) return;
  const int64_t begin = bag == 0 ? 0 : offsets[bag];
  const int64_t end = bag + 1 < num_bags ? offsets[bag + 1] : num_indices;
  for (int64_t f = 4 * threadIdx.x; f < dim; f += 4 * blockDim.x) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    int64_t i = begin;
    for (; i + 2 <= end; i += 2) {  // both rows' loads issue before either is added
      const float4 a = *reinterpret_cast<const float4*>(weight + indices[i] * stride + f);
      const float4 b = *reinterpret_cast<const float4*>(weight + indices[i + 1] * stride + f);
      acc.x += a.x + b.x; acc.y += a.y + b.y; acc.z += a.z + b.z; acc.w += a.w + b.w;
    }
    if (i < end) {
      const float4 a = *reinterpret_cast<const float4*>(weight + indices[i] * stride + f);
      acc.x += a.x; acc.y += a.y; acc.z += a.z; acc.w += a.w;
    }
    if (mode == CHZ_MODE_MEAN && end > begin) {
      const float s = 1.f / (float)(end - begin);
      acc.x *= s; acc.y *= s; acc.z *= s; acc.w *= s;
    }
    *reinterpret_cast<float4*>(output + bag * dim + f) = acc;
  }
}

// The entry point, with the signature of the toolkit's launch wrappers: it refuses what
// the kernel does not compute (other dtypes, D not a multiple of 4, padding, weights).
CHZ_EXPORT int mine_forward(const chz_bag_args* a, const chz_launch* l, void* stream) {
  if (a->dtype != CHZ_FP32 || a->dim % 4 || a->weight_stride1 != 1 || a->weight_stride0 % 4 ||
      a->padding_idx >= 0 || a->per_sample_weights)
    return CHZ_ERR_UNSUPPORTED;
  if (a->num_bags == 0) return CHZ_OK;
  const dim3 block(32, 4);  // four bags per block
  const int64_t grid = (a->num_bags + 3) / 4;
  CHZ_LAUNCH(mine_kernel, (unsigned)grid, block, 0, (cudaStream_t)stream, (const float*)a->weight, a->indices,
             a->offsets, a->num_indices, a->num_bags, a->dim, a->weight_stride0, a->mode, a->output);
#if defined(CHZ_EMULATE)
  return CHZ_OK;
#else
  return (int)cudaGetLastError();
#endif
}
