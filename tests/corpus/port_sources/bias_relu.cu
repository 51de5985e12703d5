// Fused bias + ReLU over a row-major [rows, cols] float matrix: y[r, c] = max(x[r, c] + bias[c], 0).
#include <cuda_runtime.h>
#include <torch/extension.h>

__global__ void bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                 float* __restrict__ y, int rows, int cols) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < rows * cols) {
    float v = x[idx] + bias[idx % cols];
    y[idx] = v > 0.0f ? v : 0.0f;
  }
}

torch::Tensor bias_relu_cuda(torch::Tensor x, torch::Tensor bias) {
  auto y = torch::empty_like(x);
  const int rows = x.size(0), cols = x.size(1);
  const int threads = 256;
  const int blocks = (rows * cols + threads - 1) / threads;
  bias_relu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(), rows,
                                        cols);
  return y;
}
