// cuDNN's own RNN forward (cudnnRNNForward, inference mode) on one shape, timed for each algorithm cuDNN offers:
// STANDARD, PERSIST_STATIC, PERSIST_STATIC_SMALL_H and PERSIST_DYNAMIC. PyTorch and ONNX Runtime never pick the
// persistent ones, which are cuDNN's fastest at small batch, so the benchmark compares against them directly.
//
//   cudnn_rnn CELL H I N T LAYERS DIRS DTYPE MATH REPEATS
//     CELL lstm|gru, DTYPE fp32|fp16, MATH fma (exact fp32) | default (TF32 allowed) | tensor (fp16)
//
// Prints one JSON object per algorithm: its median milliseconds over REPEATS runs (CUDA events, after warm-up) and
// the largest difference of its output from STANDARD's on the same random weights and input, or cuDNN's error.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fail(#x, cudaGetErrorString(e)); } } while (0)
#define DNN(x) do { cudnnStatus_t st_ = (x); if (st_ != CUDNN_STATUS_SUCCESS) return std::string(#x) + ": " + cudnnGetErrorString(st_); } while (0)

static void fail(const char *what, const char *why) {
  printf("{\"error\": \"%s: %s\"}\n", what, why);
  exit(1);
}

struct Shape {
  cudnnRNNMode_t cell;
  int H, I, N, T, layers, dirs;
  cudnnDataType_t dtype;
  cudnnMathType_t math;
  int repeats;
  size_t elem() const { return dtype == CUDNN_DATA_HALF ? 2 : 4; }
};

// Uniform values in [-scale, scale) from a hash of the index: the same for every algorithm, no cuRAND needed.
__global__ void fill(void *p, size_t n, bool half, float scale, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned x = (unsigned)i * 2654435761u ^ seed;
  x ^= x >> 15; x *= 2246822519u; x ^= x >> 13; x *= 3266489917u; x ^= x >> 16;
  float v = ((x & 0xffffff) / 16777216.0f * 2 - 1) * scale;
  if (half) ((__half *)p)[i] = __float2half(v); else ((float *)p)[i] = v;
}

static void *device_random(size_t count, const Shape &s, float scale, unsigned seed) {
  void *p;
  CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * s.elem()));
  fill<<<(unsigned)((count + 255) / 256), 256>>>(p, count, s.dtype == CUDNN_DATA_HALF, scale, seed);
  return p;
}

static std::vector<float> to_host(const void *p, size_t count, const Shape &s) {
  std::vector<float> out(count);
  if (s.dtype == CUDNN_DATA_HALF) {
    std::vector<__half> h(count);
    CUDA(cudaMemcpy(h.data(), p, count * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) out[i] = __half2float(h[i]);
  } else {
    CUDA(cudaMemcpy(out.data(), p, count * 4, cudaMemcpyDeviceToHost));
  }
  return out;
}

struct Run {
  std::string error;
  float ms = 0;
  std::vector<float> y;
};

static std::string time_algo(cudnnHandle_t handle, const Shape &s, cudnnRNNAlgo_t algo, void *x, Run &run) {
  cudnnRNNDescriptor_t rnn;
  cudnnDropoutDescriptor_t dropout;
  DNN(cudnnCreateRNNDescriptor(&rnn));
  DNN(cudnnCreateDropoutDescriptor(&dropout));
  size_t states_size;
  DNN(cudnnDropoutGetStatesSize(handle, &states_size));
  void *states;
  CUDA(cudaMalloc(&states, states_size));
  DNN(cudnnSetDropoutDescriptor(dropout, handle, 0.0f, states, states_size, 0));
  cudnnDataType_t math_prec = s.dtype == CUDNN_DATA_HALF ? CUDNN_DATA_FLOAT : s.dtype;
  DNN(cudnnSetRNNDescriptor_v8(rnn, algo, s.cell, CUDNN_RNN_DOUBLE_BIAS,
                               s.dirs == 2 ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, s.dtype,
                               math_prec, s.math, s.I, s.H, s.H, s.layers, dropout, CUDNN_RNN_PADDED_IO_DISABLED));
  if (algo == CUDNN_RNN_ALGO_PERSIST_DYNAMIC) DNN(cudnnBuildRNNDynamic(handle, rnn, s.N));

  cudnnRNNDataDescriptor_t x_desc, y_desc;
  std::vector<int> lengths(s.N, s.T);
  DNN(cudnnCreateRNNDataDescriptor(&x_desc));
  DNN(cudnnCreateRNNDataDescriptor(&y_desc));
  DNN(cudnnSetRNNDataDescriptor(x_desc, s.dtype, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, s.T, s.N, s.I,
                                lengths.data(), nullptr));
  DNN(cudnnSetRNNDataDescriptor(y_desc, s.dtype, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, s.T, s.N, s.H * s.dirs,
                                lengths.data(), nullptr));
  cudnnTensorDescriptor_t h_desc;
  int dims[3] = {s.layers * s.dirs, s.N, s.H}, strides[3] = {s.N * s.H, s.H, 1};
  DNN(cudnnCreateTensorDescriptor(&h_desc));
  DNN(cudnnSetTensorNdDescriptor(h_desc, s.dtype, 3, dims, strides));

  size_t weight_bytes, work_bytes, reserve_bytes;
  DNN(cudnnGetRNNWeightSpaceSize(handle, rnn, &weight_bytes));
  DNN(cudnnGetRNNTempSpaceSizes(handle, rnn, CUDNN_FWD_MODE_INFERENCE, x_desc, &work_bytes, &reserve_bytes));
  size_t states_count = (size_t)s.layers * s.dirs * s.N * s.H, y_count = (size_t)s.T * s.N * s.H * s.dirs;
  void *w = device_random(weight_bytes / s.elem(), s, 1.0f / sqrtf((float)s.H), 7);
  void *h0 = device_random(states_count, s, 0.5f, 11), *c0 = device_random(states_count, s, 0.5f, 13);
  void *y, *hy, *cy, *work, *reserve;
  int *seq_lengths;
  CUDA(cudaMalloc(&y, y_count * s.elem()));
  CUDA(cudaMalloc(&hy, states_count * s.elem()));
  CUDA(cudaMalloc(&cy, states_count * s.elem()));
  CUDA(cudaMalloc(&work, std::max<size_t>(work_bytes, 1)));
  CUDA(cudaMalloc(&reserve, std::max<size_t>(reserve_bytes, 1)));
  CUDA(cudaMalloc(&seq_lengths, s.N * sizeof(int)));
  CUDA(cudaMemcpy(seq_lengths, lengths.data(), s.N * sizeof(int), cudaMemcpyHostToDevice));
  bool lstm = s.cell == CUDNN_LSTM;

  auto forward = [&]() {
    return cudnnRNNForward(handle, rnn, CUDNN_FWD_MODE_INFERENCE, seq_lengths, x_desc, x, y_desc, y, h_desc, h0, hy,
                           lstm ? h_desc : nullptr, lstm ? c0 : nullptr, lstm ? cy : nullptr, weight_bytes, w,
                           work_bytes, work, reserve_bytes, reserve);
  };
  for (int i = 0; i < 3; ++i) DNN(forward());
  CUDA(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CUDA(cudaEventCreate(&start));
  CUDA(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < s.repeats; ++i) {
    CUDA(cudaEventRecord(start));
    DNN(forward());
    CUDA(cudaEventRecord(stop));
    CUDA(cudaEventSynchronize(stop));
    float ms;
    CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  run.ms = times[times.size() / 2];
  run.y = to_host(y, y_count, s);
  for (void *p : {w, h0, c0, y, hy, cy, work, reserve, states}) cudaFree(p);
  cudaFree(seq_lengths);
  cudnnDestroyTensorDescriptor(h_desc);
  cudnnDestroyRNNDataDescriptor(x_desc);
  cudnnDestroyRNNDataDescriptor(y_desc);
  cudnnDestroyDropoutDescriptor(dropout);
  cudnnDestroyRNNDescriptor(rnn);
  return "";
}

static Shape parse(int argc, char **argv) {
  if (argc != 11) fail("usage", "cudnn_rnn CELL H I N T LAYERS DIRS DTYPE MATH REPEATS");
  Shape s;
  s.cell = !strcmp(argv[1], "gru") ? CUDNN_GRU : CUDNN_LSTM;
  s.H = atoi(argv[2]); s.I = atoi(argv[3]); s.N = atoi(argv[4]); s.T = atoi(argv[5]);
  s.layers = atoi(argv[6]); s.dirs = atoi(argv[7]);
  s.dtype = !strcmp(argv[8], "fp16") ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  s.math = !strcmp(argv[9], "fma") ? CUDNN_FMA_MATH : !strcmp(argv[9], "tensor") ? CUDNN_TENSOR_OP_MATH
                                                                                  : CUDNN_DEFAULT_MATH;
  s.repeats = atoi(argv[10]);
  return s;
}

int main(int argc, char **argv) {
  Shape s = parse(argc, argv);
  cudnnHandle_t handle;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) fail("cudnnCreate", "no cuDNN handle");
  void *x = device_random((size_t)s.T * s.N * s.I, s, 1.0f, 3);
  const std::pair<const char *, cudnnRNNAlgo_t> algos[] = {
      {"standard", CUDNN_RNN_ALGO_STANDARD}, {"persist_static", CUDNN_RNN_ALGO_PERSIST_STATIC},
      {"persist_static_small_h", CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H}, {"persist_dynamic", CUDNN_RNN_ALGO_PERSIST_DYNAMIC}};
  std::vector<float> reference;
  for (auto &[name, algo] : algos) {
    Run run;
    std::string error = time_algo(handle, s, algo, x, run);
    cudaGetLastError();  // an unsupported algorithm may leave a launch error behind
    if (!error.empty()) {
      printf("{\"algo\": \"%s\", \"error\": \"%s\"}\n", name, error.c_str());
      continue;
    }
    if (reference.empty()) reference = run.y;
    float diff = 0, scale = 1e-30f;
    for (size_t i = 0; i < run.y.size(); ++i) {
      diff = std::max(diff, fabsf(run.y[i] - reference[i]));
      scale = std::max(scale, fabsf(reference[i]));
    }
    printf("{\"algo\": \"%s\", \"ms\": %.5f, \"rel_diff_vs_standard\": %.3g}\n", name, run.ms, diff / scale);
  }
  return 0;
}
