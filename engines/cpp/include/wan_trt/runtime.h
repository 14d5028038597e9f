// wan-trt C++ runtime: the same streaming session as engines/session.py, over any engine.
//
//   wan_trt::RuntimeSpec spec = wan_trt::RuntimeSpec::load("engine.pt2.runtime.txt");
//   wan_trt::AotiRunner runner("engine.pt2", spec, device);
//   wan_trt::StreamingSession session(runner, spec, /*seed=*/0);
//   session.start(visual_context);
//   at::Tensor latents = session.step(cond_block, mouse_frames, keyboard_frames);
//
// One block: denoising passes (x0 = x_t - sigma * flow, re-noise with seeded noise), the
// clean pass at t = 0, then the cache commit (swap when the runner allows it, copy otherwise).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace wan_trt {

// A user error (bad file, bad shape): say what was expected and what was received.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

struct CacheSpec {
  std::string kind, prev_k, cur_k, prev_v, cur_v;
  int64_t units;
};

// A rotary input pair: per block, fp32 cos/sin [F, n] of (start_frame + f) * inv_freq[i], formed in double.
struct RotarySpec {
  std::string cos, sin;
  std::vector<double> inv_freq;
};

// The spec + schedule of one engine, read from the `.runtime.txt` written by `wan-trt build`.
struct RuntimeSpec {
  std::string config, precision;
  int64_t block_frames = 0, prev_frames = 0, tokens_per_frame = 0, window_frames = 0, ratio = 0;
  int64_t max_stream_frames = 0, channels = 0, height = 0, width = 0;
  std::vector<double> timesteps, sigmas;
  double clean_timestep = 0;
  std::vector<TensorSpec> inputs, outputs;
  std::vector<CacheSpec> caches;
  std::vector<RotarySpec> rotaries;

  static RuntimeSpec load(const std::string& path);
  const TensorSpec& input(const std::string& name) const;
  bool has_input(const std::string& name) const;
  at::ScalarType dtype() const;
};

// One pass of an engine: named device tensors in, named device tensors out.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual std::map<std::string, at::Tensor> infer(const std::map<std::string, at::Tensor>& feeds) = 0;
  // true: the session may hand new tensors as cache inputs (swap); false: it copies into fixed buffers.
  virtual bool swap_inputs() const { return true; }
  virtual at::Device device() const = 0;
};

// AOTInductor package (`wan-trt build --backend aoti`), optionally replayed as a CUDA graph.
class AotiRunner : public Runner {
 public:
  AotiRunner(const std::string& package, const RuntimeSpec& spec, at::Device device, bool cuda_graph = false);
  ~AotiRunner() override;
  std::map<std::string, at::Tensor> infer(const std::map<std::string, at::Tensor>& feeds) override;
  bool swap_inputs() const override { return !cuda_graph_; }
  at::Device device() const override { return device_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  const RuntimeSpec& spec_;
  at::Device device_;
  bool cuda_graph_;
};

#ifdef WAN_TRT_WITH_TENSORRT
// TensorRT engine (`wan-trt build`): enqueueV3 on device buffers; outputs owned by the runner.
std::unique_ptr<Runner> make_tensorrt_runner(const std::string& engine, const RuntimeSpec& spec);
#endif

// Index of the first new raw action frame of `block` (0, then ratio * F * block - (ratio - 1)),
// as wan_trt.stream.first_raw_frame.
int64_t first_raw_frame(const RuntimeSpec& spec, int64_t block);

// Seeded noise per (block, step), the same draws as wan_trt.stream.NoiseSource.
at::Tensor noise(int64_t seed, int64_t block, int64_t step, at::IntArrayRef shape, at::Device device,
                 at::ScalarType dtype);

class StreamingSession {
 public:
  StreamingSession(Runner& runner, const RuntimeSpec& spec, int64_t seed);
  // start_block: absolute index of the first block (its position and noise), with empty caches.
  void start(const at::Tensor& visual_context, int64_t start_block = 0);
  // cond: [1, C, F, H, W]; mouse/keyboard: this block's raw frames [1, n, D] (empty if the config has none).
  // Throws Error on a bad or non-finite input (nothing changed) or a non-finite block (nothing committed).
  at::Tensor step(const at::Tensor& cond, const at::Tensor& mouse, const at::Tensor& keyboard);
  int64_t block() const { return block_; }
  double last_block_ms() const { return last_block_ms_; }

 private:
  std::map<std::string, at::Tensor> run(const at::Tensor& x, double t);
  bool check_actions(const std::string& name, const at::Tensor& raw) const;  // false: the config has no such input
  void feed_actions(const std::string& name, const at::Tensor& raw);
  void feed_rotaries(int64_t start_frame);
  void commit(std::map<std::string, at::Tensor>& outputs);

  Runner& runner_;
  const RuntimeSpec& spec_;
  int64_t seed_;
  at::Device device_;
  std::map<std::string, at::Tensor> feeds_;
  std::map<std::string, at::Tensor> history_;  // padded raw action frames, from absolute index base_
  std::map<std::string, int64_t> base_;
  int64_t block_ = 0, valid_frames_ = 0;
  bool started_ = false;
  double last_block_ms_ = 0;
};

}  // namespace wan_trt
