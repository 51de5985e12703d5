// Row softmax over a row-major [rows, cols] float matrix, one block per row: max, exp and sum in shared memory.
#include <cuda_runtime.h>
#include <float.h>

__global__ void row_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
  extern __shared__ float scratch[];
  const float* row = x + blockIdx.x * cols;
  float* out = y + blockIdx.x * cols;

  float local_max = -FLT_MAX;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) local_max = fmaxf(local_max, row[c]);
  scratch[threadIdx.x] = local_max;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s]);
    __syncthreads();
  }
  const float row_max = scratch[0];
  __syncthreads();

  float local_sum = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) local_sum += __expf(row[c] - row_max);
  scratch[threadIdx.x] = local_sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
    __syncthreads();
  }
  const float row_sum = scratch[0];

  for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = __expf(row[c] - row_max) / row_sum;
}

void row_softmax(const float* x, float* y, int rows, int cols, cudaStream_t stream) {
  const int threads = 256;
  row_softmax_kernel<<<rows, threads, threads * sizeof(float), stream>>>(x, y, cols);
}
