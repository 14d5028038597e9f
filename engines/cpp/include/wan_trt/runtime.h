// wan-trt C++ runtime: the same streaming session as engines/runtime/session.py, over any engine.
//
//   wan_trt::RuntimeSpec spec = wan_trt::RuntimeSpec::load("engine.pt2.runtime.txt");
//   wan_trt::AotiRunner runner("engine.pt2", spec, device);
//   wan_trt::DecoderEngines dec = wan_trt::DecoderEngines::load("dec/steady/engine.pt2");  // optional
//   wan_trt::AotiRunner first(dec.first, dec.first_spec, device), steady(dec.steady, dec.steady_spec, device);
//   wan_trt::DecoderStream decoder(first, dec.first_spec, steady, dec.steady_spec);
//   wan_trt::StreamingSession session(runner, spec, /*seed=*/0, &decoder);
//   session.start(visual_context);
//   wan_trt::Block block = session.step(cond_block, mouse_frames, keyboard_frames);
//   block.latents;  // [1, 16, 3, h, w]
//   block.frames;   // with a decoder: uint8 [n, 8h, 8w, 3] on the device (n = 9, then 12)
//
// One block: denoising passes (x0 = x_t - sigma * flow, re-noise with seeded noise), the
// clean pass at t = 0, the output checks, the decode, then the cache commit (swap when the
// runner allows it, copy otherwise). Given its inputs on the device, a step waits for nothing before its
// passes are queued: the inputs' finiteness is read with the outputs' (one sync), and the next block's
// rotary tables and first noise are made while the device runs the clean pass. A session queues its work on
// the current CUDA stream: keep the same one current for all of a stream's steps.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
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

// One layer of a cache: its previous-frames K/V inputs and this block's K/V outputs,
// each [batch', frames * units, heads, head_dim].
struct CacheSpec {
  std::string kind, prev_k, cur_k, prev_v, cur_v;
  int64_t units;
};

// A graph's inputs and outputs, in the engine's order, its config and precision, and the engine file its runtime
// file was written for.
struct GraphIO {
  std::vector<TensorSpec> inputs, outputs;
  std::string config, precision;
  int64_t engine_bytes = -1;
  std::string engine_sha256;  // hex
  std::string device;         // the kind of device the engine was built for: "cpu" or "cuda"
  const TensorSpec& input(const std::string& name) const;
  bool has_input(const std::string& name) const;
  bool has_output(const std::string& name) const;
};

// A rotary input pair: per block, fp32 cos/sin [F, n] of (start_frame + f) * inv_freq[i], formed in double.
struct RotarySpec {
  std::string cos, sin;
  std::vector<double> inv_freq;
};

// The spec + schedule of one DiT pass engine, read from the `.runtime.txt` written by `wan-trt build`.
struct RuntimeSpec : GraphIO {
  int64_t block_frames = 0, prev_frames = 0, tokens_per_frame = 0, window_frames = 0, ratio = 0;
  int64_t max_stream_frames = 0, channels = 0, height = 0, width = 0;
  std::vector<double> timesteps, sigmas;
  double clean_timestep = 0;
  std::vector<CacheSpec> caches;
  std::vector<RotarySpec> rotaries;

  static RuntimeSpec load(const std::string& path);
  at::ScalarType dtype() const;
};

// One graph of the video decoder ("first": a stream's first block, no history inputs; "steady": every
// later block), read from its engine's `.runtime.txt`. histories: (input, output) pairs in call order; weights:
// the sha256 of its weights, as its export's manifest records them.
struct DecoderSpec : GraphIO {
  std::string call, graph, weights;  // graph: the decoder's graph kind (decoder, tiny-decoder)
  std::vector<std::pair<std::string, std::string>> histories;

  static DecoderSpec load(const std::string& path);
};

// A decoder engine pair: one engine file per graph, the same name in the decoder export's first/ and
// steady/ folders, each with its runtime file. load() takes either file and checks they are one decoder's (its
// config, precision and weights).
struct DecoderEngines {
  std::string first, steady;
  DecoderSpec first_spec, steady_spec;

  static DecoderEngines load(const std::string& engine);
};

// One pass of an engine: named device tensors in, named device tensors out.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual std::map<std::string, at::Tensor> infer(const std::map<std::string, at::Tensor>& feeds) = 0;
  // true: the session may hand new tensors as cache inputs (swap): only for a runner whose outputs are fresh tensors
  // every call, never buffers it reads or writes again (a cache output swapped in as its own next input would be read
  // and written in one pass); false: the session copies into fixed buffers (CUDA graphs, TensorRT: their outputs are
  // the runner's own buffers). A program's own runner that keeps its outputs must say false.
  virtual bool swap_inputs() const { return true; }
  virtual at::Device device() const = 0;
  // The runtime file's I/O of the engine it runs, or nullptr for a runner that says none (a program's own): a
  // session or decoder given a spec of another engine refuses it.
  virtual const GraphIO* io() const { return nullptr; }
};

// Refuse ``spec`` (named ``what``) for ``runner`` if the runner runs another engine than the one ``spec``'s runtime
// file was written for (by the engines' sha256).
void check_runs(const Runner& runner, const GraphIO& spec, const std::string& what);

// A file's identity: its device, inode, size and modification time (a file replaced or rewritten has another).
struct FileIdentity {
  uint64_t device = 0, inode = 0;
  int64_t size = 0, mtime_ns = 0;
  bool operator==(const FileIdentity& other) const {
    return device == other.device && inode == other.inode && size == other.size && mtime_ns == other.mtime_ns;
  }
};

// Refuse an engine file that is not the one ``io``'s runtime file was written for (its size and sha256): a
// damaged copy, or another engine beside this runtime file. Returns the identity of the file verified. The runners
// call it before they load an engine, and check_unchanged after: the loader opens the path again.
FileIdentity verify_engine(const std::string& engine, const GraphIO& io);

// Refuse an engine whose file is no longer the one verify_engine verified (``verified``): replaced (a build installs
// a new engine by rename) or rewritten while it was verified or loaded, so what was loaded may not be what was
// verified.
void check_unchanged(const std::string& engine, const FileIdentity& verified);

// Refuse running ``engine`` (given as ``what``: "engine", a flag) on ``device`` where its runtime file says it was
// built for another kind of device (io.device: cpu or cuda), as Python's EngineMetadata.check_runs_on refuses it: its
// code is compiled for that kind. ``asked``: how the caller named the device (a flag and its value; the device by
// default). The runners call it first, before they read the engine file or look for a device.
void check_built_for(const GraphIO& io, const std::string& engine, at::Device device,
                     const std::string& what = "engine", const std::string& asked = "");

// Whether ``engine`` is a zip file, as an AOTInductor package is; a TensorRT plan is not. Of a verified engine (one
// `wan-trt build` wrote for its runtime file), this tells which runner runs it: each refuses the other's.
bool is_aoti_package(const std::string& engine);

// Refuse ``feeds`` that are not ``io``'s inputs as an engine on ``device`` reads them, naming every input missing,
// unexpected, of another shape or dtype, on another device or not contiguous: an engine takes its inputs by address,
// in the layout it was built for (a feed of another device crashed the process, a strided one ran with wrong
// outputs). The runners call it on every infer().
void check_feeds(const GraphIO& io, const std::map<std::string, at::Tensor>& feeds, at::Device device);

// fp32 computed as fp32 while it lives (the settings as before after it), where `fp32` is true: libtorch lets
// cuDNN round fp32 convolution operands to TF32 (10 bits of mantissa) by default, and a program may have let the
// matmuls do so too. AotiRunner::infer holds one around every call of an fp32 engine (its CUDA-graph capture
// included), so the engine computes as `wan-trt check` judged it (engines/runtime/arithmetic.py in Python).
class Fp32AsFp32 {
 public:
  explicit Fp32AsFp32(bool fp32);
  ~Fp32AsFp32();
  Fp32AsFp32(const Fp32AsFp32&) = delete;
  Fp32AsFp32& operator=(const Fp32AsFp32&) = delete;

 private:
  bool active_;
  bool convolutions_ = true;
  at::Float32MatmulPrecision matmuls_ = at::Float32MatmulPrecision::HIGHEST;
};

// AOTInductor package (`wan-trt build --backend aoti`), optionally replayed as a CUDA graph. Keeps a copy of ``io``.
// Refused before it loads: a package built for another kind of device than ``device`` (check_built_for), one that is
// not the engine its runtime file was written for (verify_engine), and a TensorRT plan (that engine, but no zip file,
// as a package is), which the TensorRT runner runs.
class AotiRunner : public Runner {
 public:
  AotiRunner(const std::string& package, const GraphIO& io, at::Device device, bool cuda_graph = false);
  ~AotiRunner() override;
  std::map<std::string, at::Tensor> infer(const std::map<std::string, at::Tensor>& feeds) override;
  bool swap_inputs() const override { return !cuda_graph_; }
  at::Device device() const override { return device_; }
  const GraphIO* io() const override { return &io_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  const GraphIO io_;
  at::Device device_;
  bool cuda_graph_;
};

#ifdef WAN_TRT_WITH_TENSORRT
// TensorRT engine (`wan-trt build`): enqueueV3 on device buffers; outputs owned by the runner. Keeps a copy of ``io``.
std::unique_ptr<Runner> make_tensorrt_runner(const std::string& engine, const GraphIO& io);
#endif

// Index of the first new raw action frame of `block` (0, then ratio * F * block - (ratio - 1)),
// as wan_trt.stream.first_raw_frame.
int64_t first_raw_frame(const RuntimeSpec& spec, int64_t block);

// The raw action frames `block` adds (1 + ratio * (F - 1) for block 0, ratio * F after), as
// wan_trt.stream.raw_frames_in_block.
int64_t raw_frames_in_block(const RuntimeSpec& spec, int64_t block);

// Blocks a stream reaches: 0 to reachable_blocks(spec) - 1 end within its max_stream_frames latent frames,
// as wan_trt.stream.max_stream_blocks.
int64_t reachable_blocks(const RuntimeSpec& spec);

// Refuse ``blocks`` blocks from ``first_block`` (named ``what``: "start_block", "--actions FILE: first_block") unless
// a stream reaches them all: first_block >= 0, blocks >= 1 and the last below reachable_blocks(spec). The session's
// start, read_actions and wan_stream (its inputs' first block, its --blocks) call it before any block arithmetic.
void check_within_reach(const RuntimeSpec& spec, const std::string& what, int64_t first_block, int64_t blocks);

// Seeded noise per (block, step), the same draws as wan_trt.stream.NoiseSource.
at::Tensor noise(int64_t seed, int64_t block, int64_t step, at::IntArrayRef shape, at::Device device,
                 at::ScalarType dtype);

// Ask PyTorch's cuBLASLt for no workspace (CUBLASLT_WORKSPACE_SIZE=0) unless the environment names a size:
// its GEMMs then run without a memset before each (engines/runtime/cublas_workspace.py says why). Read once,
// at the process's first cuBLASLt GEMM: a session asks when it is made; call this first thing where the
// process runs GEMMs before. Returns the size asked for (KiB).
std::string prefer_workspace_free_gemms();

// Decoder output [1, 3, n, H, W] in [-1, 1] -> uint8 [n, H, W, 3], as wan_trt.video.to_uint8_frames.
at::Tensor to_uint8_frames(const at::Tensor& rgb);

// A stream's blocks decoded in order: the first block through the first graph, every later one through
// the steady graph fed the histories the previous call returned (copied into fixed input buffers, so
// runners may own their outputs and CUDA graphs keep their addresses). Keeps a copy of the steady graph's spec.
// Turns on cuDNN's benchmark mode while it lives (restored after). Mirrors engines/runtime/decoder.py.
class DecoderStream {
 public:
  DecoderStream(Runner& first, const DecoderSpec& first_spec, Runner& steady, const DecoderSpec& steady_spec);
  ~DecoderStream();
  DecoderStream(const DecoderStream&) = delete;
  DecoderStream& operator=(const DecoderStream&) = delete;
  // Throws Error unless the decoder takes the latents the DiT of `spec` makes (shape and dtype).
  void check_attachable(const RuntimeSpec& spec) const;
  void reset() { started_ = false; }  // the next decode starts a stream
  bool started() const { return started_; }
  // The block's frames, uint8 [n, H, W, 3] on the device; the histories are carried to the next block. Frames
  // that come out NaN/Inf throw Error, the histories left as they were (one device sync).
  at::Tensor decode(const at::Tensor& latents);
  at::Device device() const { return steady_.device(); }

 private:
  friend class StreamingSession;
  // Refuses a second session while the one it serves lives (``session``: a token the session holds and moves with
  // it): a decoder carries one stream's histories, which another session's start would reset under the first.
  void attach(const std::shared_ptr<const int>& session);

  Runner &first_, &steady_;
  const DecoderSpec spec_;  // the steady graph's
  std::map<std::string, at::Tensor> feeds_;
  std::weak_ptr<const int> owner_;  // the token of the session it serves: expired when that session is gone
  bool started_ = false, benchmark_ = false;
};

// Host-made feeds reaching the device in one asynchronous copy (engines/runtime/staging.py): the feeds `names`
// (one dtype) become views of one device buffer, each 256 bytes aligned, filled from one host buffer (pinned
// on a GPU) by one copy that does not hold the host. Fill the slots host(name) after wait(), then load().
class HostStaging {
 public:
  HostStaging(std::map<std::string, at::Tensor>& feeds, const std::vector<std::string>& names, at::Device device);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  void wait();  // until the copy that read the host buffer last has run (long done at a block's start)
  const at::Tensor& host(const std::string& name) const;  // the feed's slot in the host buffer
  void load();  // one copy of the host buffer into the feeds, queued on the current stream

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Marks stage boundaries without synchronising: CUDA events on a GPU, the host clock on a CPU.
class StageClock {
 public:
  explicit StageClock(at::Device device);
  ~StageClock();
  void mark(const std::string& stage);  // end of `stage`
  // Milliseconds per stage, in order (after the device has synchronised).
  std::vector<std::pair<std::string, double>> elapsed_ms() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One streamed block: its latents, its frames (with a decoder; undefined otherwise) and the
// milliseconds of its stages (passes, clean, checks, decode, commit).
struct Block {
  at::Tensor latents, frames;
  std::vector<std::pair<std::string, double>> stage_ms;
  double ms = 0;
};

class StreamingSession {
 public:
  // Keeps a copy of ``spec``. decoder: optional; when given, every block is also decoded to frames. A decoder serves
  // one session at a time (it carries that stream's histories): one that another living session was given is refused.
  StreamingSession(Runner& runner, const RuntimeSpec& spec, int64_t seed, DecoderStream* decoder = nullptr);
  // start_block: absolute index of the first block (its position and noise), with empty caches; one a stream does
  // not reach is refused (check_within_reach).
  void start(const at::Tensor& visual_context, int64_t start_block = 0);
  // cond: [1, C, F, H, W]; mouse/keyboard: this block's raw frames [1, n, D], or one action [1, D] held for the whole
  // block (as the Python session takes them; empty if the config has none).
  // Throws Error on a bad input (nothing changed), or on a non-finite input or block (its passes ran, overwriting
  // only the per-block feeds; nothing committed). An input is judged as given: a finite value beyond the range of
  // the engine's dtype is named so, not as NaN or Inf (its conversion made it one).
  Block step(const at::Tensor& cond, const at::Tensor& mouse, const at::Tensor& keyboard);
  int64_t block() const { return block_; }

 private:
  std::map<std::string, at::Tensor> run(const at::Tensor& x, double t);
  at::Tensor real_input(const std::string& name, const at::Tensor& t, const std::string& of,
                        bool numbers = false) const;
  static void check_kind(const std::string& name, const at::Tensor& t, const std::string& of, bool numbers);
  at::Tensor held_expanded(const std::string& name, const at::Tensor& raw) const;  // [1, D] held: [1, n, D]
  bool check_actions(const std::string& name, const at::Tensor& raw) const;  // false: the config has no such input
  void feed_actions(const std::string& name, const at::Tensor& raw);
  void load_rotaries(int64_t start_frame);  // unless the feeds hold that start frame's tables already
  void stage_next_block();
  bool within_reach(int64_t block) const;
  at::Tensor first_noise(int64_t block) const;
  void commit(std::map<std::string, at::Tensor>& outputs);

  Runner& runner_;
  const RuntimeSpec spec_;
  int64_t seed_;
  at::Device device_;
  DecoderStream* decoder_;
  std::map<std::string, at::Tensor> feeds_;
  std::map<std::string, at::Tensor> history_;  // padded raw action frames, from absolute index base_
  std::map<std::string, int64_t> base_;
  std::unique_ptr<HostStaging> rotary_;  // the rotary feeds
  int64_t rotary_start_ = -1;            // the start frame whose tables the rotary feeds hold (-1: none)
  int64_t next_noise_block_ = -1;        // the block whose first noise next_noise_ holds, drawn ahead
  at::Tensor next_noise_;
  int64_t block_ = 0, valid_frames_ = 0;
  bool started_ = false;
  std::shared_ptr<const int> token_ = std::make_shared<const int>(0);  // the decoder's owner while this session lives
};

// The largest magnitude `dtype` holds, as torch.finfo(dtype).max: fp16 65504, bf16 3.38953e+38, fp32 3.40282e+38.
double dtype_max(at::ScalarType dtype);

// A number as Python's f"{x:.6g}" writes it (65504, 3.40282e+38), with a point whatever locale the program set.
std::string number_6g(double x);

// Refuse ``path``, given as ``flag``, unless it is a regular file: a folder, a pipe or a missing file by name.
void check_input_file(const std::string& path, const std::string& flag);

// The SHA-256 of ``n`` bytes at ``data``, and of the file ``path`` (refused as read_bytes refuses, named ``what``), as
// lowercase hex.
std::string sha256_hex(const void* data, size_t n);
std::string file_sha256(const std::string& path, const std::string& what);

// The bytes of ``path``, the first ``n`` of them at most (all by default); a file that cannot be opened or read is
// refused naming the error: "<what> <path>: cannot be read (<why>)" (``what``: the flag or kind of file it was given as).
std::string read_bytes(const std::string& path, const std::string& what, size_t n = std::string::npos);

// Raw action frames of blocks first_block .. first_block + blocks - 1 from a JSON-lines actions file
// (one line per block from first_block on; the format of wan_trt/actions.py): name -> fp32 [1, N, D]
// for each action input of the spec. Blocks a stream does not reach are refused (check_within_reach), and so is
// every defect of the lines read, with its line number, a number whose nearest double lies beyond the range of the
// spec's dtype (fp16: 65504) too, before any block runs.
std::map<std::string, at::Tensor> read_actions(const std::string& path, const RuntimeSpec& spec,
                                               int64_t first_block, int64_t blocks);

}  // namespace wan_trt
