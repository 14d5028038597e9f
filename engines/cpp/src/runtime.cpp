// wan-trt C++ runtime: spec file, AOTInductor runner, seeded noise and the streaming session.
// Mirrors engines/session.py step for step; tests compare the two on the same engine.
#include "wan_trt/runtime.h"

#include <ATen/Context.h>
#include <c10/util/env.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <locale>
#include <sstream>

#include <sys/stat.h>

#ifdef WAN_TRT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace wan_trt {

// ---- SHA-256 ---------------------------------------------------------------------------------

namespace {

// SHA-256 (FIPS 180-4), streamed: of an engine file, and of a runtime file before its sha256 line.
class Sha256 {
 public:
  void update(const unsigned char* data, size_t n) {
    bytes_ += n;
    while (n > 0) {
      if (fill_ == 0 && n >= 64) {  // whole blocks straight from the input
        compress(data);
        data += 64, n -= 64;
        continue;
      }
      const size_t take = std::min(n, 64 - fill_);
      std::memcpy(block_ + fill_, data, take);
      fill_ += take, data += take, n -= take;
      if (fill_ == 64) {
        compress(block_);
        fill_ = 0;
      }
    }
  }

  std::string hex() {
    const uint64_t bits = bytes_ * 8;  // before the padding counts itself in
    const unsigned char one = 0x80, zero = 0;
    update(&one, 1);
    while (fill_ != 56) update(&zero, 1);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(length, 8);
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (uint32_t word : h_)
      for (int shift = 28; shift >= 0; shift -= 4) out += digits[(word >> shift) & 0xf];
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress(const unsigned char* block) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(block[4 * i]) << 24 | uint32_t(block[4 * i + 1]) << 16 | uint32_t(block[4 * i + 2]) << 8 |
             uint32_t(block[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    const uint32_t add[8] = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) h_[i] += add[i];
  }

  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char block_[64] = {};
  size_t fill_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace

// ---- spec file ------------------------------------------------------------------------------

static const char kRewrite[] =
    ": rebuild with `wan-trt build`, which keeps an up-to-date engine and writes its runtime file anew";

namespace {

// One line of a runtime file: its values after the key, each of which must parse, and nothing after them.
class Line {
 public:
  Line(const std::string& path, const std::string& text) : path_(path), text_(text), in_(text) {
    in_.imbue(std::locale::classic());  // numbers as written, whatever locale the embedding program set
    in_ >> key_;
  }
  const std::string& key() const { return key_; }

  template <class T>
  T next() {
    T value{};
    if (!(in_ >> value)) bad();
    return value;
  }

  // the values up to the end of the line (at least one)
  template <class T>
  std::vector<T> rest() {
    std::vector<T> values;
    for (T value; in_ >> value;) values.push_back(value);
    if (!in_.eof() || values.empty()) bad();
    return values;
  }

  void end() {
    in_ >> std::ws;
    if (!in_.eof()) bad();
  }

  [[noreturn]] void bad() const { throw Error(path_ + ": cannot read its line '" + text_ + "'" + kRewrite); }

 private:
  const std::string &path_, &text_;
  std::istringstream in_;
  std::string key_;
};

}  // namespace

// The dtypes a runtime file names, by the names it writes them with (those of Python's spec).
static const std::vector<std::pair<std::string, at::ScalarType>> kDtypes{
    {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}, {"float32", at::kFloat}, {"int32", at::kInt},
    {"int64", at::kLong}};

static at::ScalarType parse_dtype(Line& line) {
  const auto name = line.next<std::string>();
  for (const auto& [known, dtype] : kDtypes)
    if (name == known) return dtype;
  line.bad();
}

// The runtime file's name of ``dtype`` (float16, bfloat16, float32, ...).
static std::string dtype_name(at::ScalarType dtype) {
  for (const auto& [name, known] : kDtypes)
    if (dtype == known) return name;
  return c10::toString(dtype);
}

static TensorSpec parse_tensor(Line& line) {
  TensorSpec t;
  t.name = line.next<std::string>();
  t.dtype = parse_dtype(line);
  t.shape = line.rest<int64_t>();
  if (std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d < 1; })) line.bad();
  return t;
}

// A value of the line that must be at least ``least``.
static int64_t at_least(Line& line, int64_t least) {
  const auto value = line.next<int64_t>();
  if (value < least) line.bad();
  return value;
}

// The file's bytes once its last line, `sha256 <hex>`, is that of every byte before it; an older or another
// file's header, a missing or another hash, is refused. The header line is read and judged first, alone: a file
// that is no runtime file (an engine given for one, GBs) is refused without reading the rest.
static std::string sealed_text(const std::string& path, const std::string& header) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_regular_file(path, error))
    throw Error("cannot open runtime file " + path + " (written by `wan-trt build` beside the engine)");
  constexpr size_t kHeaderBytes = 64;  // more than any header line ("wan_trt_runtime 6") and its '\n'
  const std::string head = read_bytes(path, "runtime file", kHeaderBytes);
  const std::string first = head.substr(0, head.find('\n'));
  if (!first.empty() && first.back() == '\r')
    throw Error(path + ": its lines end in CR LF (converted to Windows line endings?)" + kRewrite);
  if (first == "wan_trt_runtime 1")
    throw Error(path + " is from an older wan-trt (a RoPE table with a frame offset input): re-export and rebuild");
  if (first == "wan_trt_runtime 2")
    throw Error(path + " is from an older wan-trt (one stacked tensor per cache): re-export and rebuild");
  if (first == "wan_trt_runtime 3" || first == "wan_trt_decoder 1")
    throw Error(path + " is from an older wan-trt (no engine hash)" + kRewrite);
  if (first == "wan_trt_runtime 4" || first == "wan_trt_decoder 2")
    throw Error(path + " is from an older wan-trt (no hash of its own)" + kRewrite);
  if (first == "wan_trt_decoder 3")
    throw Error(path + " is from an older wan-trt (no weights' sha256)" + kRewrite);
  if (first == "wan_trt_runtime 5" || first == "wan_trt_decoder 4")
    throw Error(path + " is from an older wan-trt (no device)" + kRewrite);
  if (first == "wan_trt_decoder 5")
    throw Error(path + " is from an older wan-trt (no graph kind)" + kRewrite);
  if (first != header) {
    const bool other = first.rfind("wan_trt_", 0) == 0;
    throw Error(path + (other ? " is the runtime file of another kind of engine (" + first + "), not " + header
                              : " is not a wan-trt runtime file (" + header + ")"));
  }
  const std::string text = read_bytes(path, "runtime file");  // the whole file, now that the header is this kind's
  const size_t last = text.size() < 2 ? std::string::npos : text.rfind('\n', text.size() - 2);
  const std::string seal = last == std::string::npos || text.back() != '\n'
                               ? "" : text.substr(last + 1, text.size() - last - 2);
  if (seal.rfind("sha256 ", 0) != 0) throw Error(path + ": no sha256 line at its end (a cut file)" + kRewrite);
  Sha256 digest;
  digest.update(reinterpret_cast<const unsigned char*>(text.data()), last + 1);
  if (seal != "sha256 " + digest.hex())
    throw Error(path + ": its contents are not those its sha256 line was written for (an edited or damaged file)" +
                kRewrite);
  return text.substr(0, last + 1);
}

// The line's next value, which must be a SHA-256 in hex (64 lowercase digits).
static std::string parse_sha256(Line& line) {
  const auto hex = line.next<std::string>();
  if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) line.bad();
  return hex;
}

// A line every runtime file has (`input`, `output`, `engine`, `device`, `config`, `precision`); false for other keys.
static bool parse_io(GraphIO& io, Line& line) {
  if (line.key() == "input") io.inputs.push_back(parse_tensor(line));
  else if (line.key() == "output") io.outputs.push_back(parse_tensor(line));
  else if (line.key() == "engine") {
    io.engine_bytes = at_least(line, 0);
    io.engine_sha256 = parse_sha256(line);
  } else if (line.key() == "device") {
    io.device = line.next<std::string>();
    if (io.device != "cpu" && io.device != "cuda") line.bad();
  } else if (line.key() == "config") io.config = line.next<std::string>();
  else if (line.key() == "precision") io.precision = line.next<std::string>();
  else return false;
  line.end();
  return true;
}

static bool has_engine(const GraphIO& io) {
  return io.engine_bytes >= 0 && io.engine_sha256.size() == 64 && !io.device.empty();
}

// Each line of the runtime file at ``path`` between its header line, which must be ``header``, and its sha256 line,
// read into ``io``: those every runtime file has by parse_io, the others by ``field`` (false: a key it does not know).
template <class Field>
static void read_runtime_file(const std::string& path, const std::string& header, GraphIO& io, Field field) {
  std::istringstream lines(sealed_text(path, header));
  std::string text;
  std::getline(lines, text);  // the header
  while (std::getline(lines, text)) {
    Line line(path, text);
    if (line.key().empty() || parse_io(io, line)) continue;
    if (!field(line)) throw Error(path + ": unknown key '" + line.key() + "'" + kRewrite);
    line.end();
  }
}

RuntimeSpec RuntimeSpec::load(const std::string& path) {
  RuntimeSpec s;
  read_runtime_file(path, "wan_trt_runtime 6", s, [&s](Line& line) {
    const std::string& key = line.key();
    if (key == "block_frames") s.block_frames = at_least(line, 1);
    else if (key == "prev_frames") s.prev_frames = at_least(line, 0);
    else if (key == "tokens_per_frame") s.tokens_per_frame = at_least(line, 1);
    else if (key == "window_frames") s.window_frames = at_least(line, 1);
    else if (key == "ratio") s.ratio = at_least(line, 1);
    else if (key == "max_stream_frames") s.max_stream_frames = at_least(line, 1);
    else if (key == "latent") s.channels = at_least(line, 1), s.height = at_least(line, 1), s.width = at_least(line, 1);
    else if (key == "timesteps") s.timesteps = line.rest<double>();
    else if (key == "sigmas") s.sigmas = line.rest<double>();
    else if (key == "clean_timestep") s.clean_timestep = line.next<double>();
    else if (key == "cache") {
      CacheSpec c;
      c.kind = line.next<std::string>();
      c.units = at_least(line, 1);
      for (std::string* name : {&c.prev_k, &c.cur_k, &c.prev_v, &c.cur_v}) *name = line.next<std::string>();
      s.caches.push_back(c);
    } else if (key == "rotary") {
      RotarySpec r;
      r.cos = line.next<std::string>();
      r.sin = line.next<std::string>();
      r.inv_freq = line.rest<double>();
      s.rotaries.push_back(r);
    } else return false;
    return true;
  });
  if (s.timesteps.empty() || s.timesteps.size() != s.sigmas.size() || s.inputs.empty() || s.rotaries.empty() ||
      s.block_frames < 1 || s.max_stream_frames < 1 || s.ratio < 1 || !has_engine(s))
    throw Error(path + ": incomplete runtime file" + kRewrite);
  return s;
}

DecoderSpec DecoderSpec::load(const std::string& path) {
  DecoderSpec s;
  read_runtime_file(path, "wan_trt_decoder 6", s, [&s](Line& line) {
    const std::string& key = line.key();
    if (key == "call") s.call = line.next<std::string>();
    else if (key == "graph") s.graph = line.next<std::string>();
    else if (key == "weights") s.weights = parse_sha256(line);
    else if (key == "history") {
      std::pair<std::string, std::string> pair;
      pair.first = line.next<std::string>();
      pair.second = line.next<std::string>();
      s.histories.push_back(pair);
    } else return false;
    return true;
  });
  bool complete = (s.call == "first" || s.call == "steady") && s.has_input("latents") && s.has_output("rgb") &&
                  !s.histories.empty() && has_engine(s) && !s.weights.empty() && !s.graph.empty();
  for (const auto& [input, output] : s.histories)
    complete = complete && s.has_output(output) && (s.call == "first" || s.has_input(input));
  if (!complete) throw Error(path + ": incomplete decoder runtime file (rebuild the engine with `wan-trt build`)");
  return s;
}

static std::vector<std::string> names(const std::vector<TensorSpec>& tensors) {
  std::vector<std::string> out;
  for (const auto& t : tensors) out.push_back(t.name);
  return out;
}

// Why specs a and b are not the first and steady graphs of one decoder export ("" if they are): their calls, then
// config, precision, histories and outputs, then weights (two exports' graphs, as an export stopped between its two
// swaps, or an embedding program's own pairing, leaves them).
static std::string pair_problem(const DecoderSpec& a, const DecoderSpec& b) {
  if (a.call != "first" || b.call != "steady")
    return "not the first and the steady decoder graphs (calls '" + a.call + "' and '" + b.call + "')";
  if (a.graph != b.graph)
    return "graphs of two decoders ('" + a.graph + "' and '" + b.graph + "')";
  if (a.config != b.config || a.precision != b.precision || a.histories != b.histories ||
      names(a.outputs) != names(b.outputs))
    return "not the first and steady graphs of one decoder (config, precision or histories differ)";
  if (a.weights != b.weights)
    return "exported from different weights (sha256 " + a.weights.substr(0, 12) + "... and " +
           b.weights.substr(0, 12) + "...)";
  return "";
}

DecoderEngines DecoderEngines::load(const std::string& engine) {
  namespace fs = std::filesystem;
  const fs::path path(engine);
  if (!fs::is_regular_file(path)) throw Error("decoder engine " + engine + ": no such file");
  const fs::path folder = fs::canonical(path).parent_path();  // symlinks followed, as Python does
  if (folder.filename() != "first" && folder.filename() != "steady")  // no pair to look for beside another engine
    throw Error("decoder engine " + engine + ": " + folder.string() + " is not first/ or steady/ of a decoder export "
                "(`wan-trt export --graph decoder`), where `wan-trt build DECODER_EXPORT` writes the decoder's two "
                "engines, one per graph; give one of those");
  const fs::path root = folder.parent_path();
  DecoderEngines d;
  d.first = (root / "first" / path.filename()).string();
  d.steady = (root / "steady" / path.filename()).string();
  for (const auto& e : {d.first, d.steady})
    if (!fs::is_regular_file(e))
      throw Error("decoder engine " + engine + ": its other graph's engine " + e + " is missing; build both with " +
                  "`wan-trt build " + root.string() + "`");
  d.first_spec = DecoderSpec::load(d.first + ".runtime.txt");
  d.steady_spec = DecoderSpec::load(d.steady + ".runtime.txt");
  const std::string problem = pair_problem(d.first_spec, d.steady_spec);
  if (!problem.empty())
    throw Error("decoder engine " + engine + ": " + d.first + " and " + d.steady + " are " + problem +
                "; re-export both with `wan-trt export --graph " + d.steady_spec.graph + " --overwrite` and build " +
                "them with `wan-trt build " + root.string() + "`");
  return d;
}

const TensorSpec& GraphIO::input(const std::string& name) const {
  for (const auto& t : inputs)
    if (t.name == name) return t;
  throw Error("spec has no input '" + name + "'");
}

bool GraphIO::has_input(const std::string& name) const {
  return std::any_of(inputs.begin(), inputs.end(), [&](const TensorSpec& t) { return t.name == name; });
}

bool GraphIO::has_output(const std::string& name) const {
  return std::any_of(outputs.begin(), outputs.end(), [&](const TensorSpec& t) { return t.name == name; });
}

at::ScalarType RuntimeSpec::dtype() const { return input("latents").dtype; }

// ---- AOTInductor runner ---------------------------------------------------------------------

struct AotiRunner::Impl {
  // single_threaded: no locking and no event queries between runs, which CUDA-graph capture forbids
  Impl(const std::string& package, bool single_threaded) : loader(package, "model", single_threaded) {}
  torch::inductor::AOTIModelPackageLoader loader;
  std::map<std::string, at::Tensor> outputs;
  std::map<std::string, const void*> pointers;
#ifdef WAN_TRT_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

// ---- engine file ----------------------------------------------------------------------------

static FileIdentity file_identity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw Error("engine " + path + ": " + std::strerror(errno));
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

void check_unchanged(const std::string& engine, const FileIdentity& verified) {
  if (!(file_identity(engine) == verified))
    throw Error("engine " + engine + " was replaced or rewritten while it was verified and loaded (a `wan-trt build` "
                "installing another engine?): what was loaded may not be the engine verified; run again once it is "
                "done");
}

FileIdentity verify_engine(const std::string& engine, const GraphIO& io) {
  const FileIdentity identity = file_identity(engine);  // before it is read: a file replaced meanwhile differs
  std::error_code error;
  const auto size = std::filesystem::file_size(engine, error);
  if (error) throw Error("engine " + engine + ": " + error.message());
  const std::string fix = ": a damaged copy, or another engine beside this runtime file; rebuild it with `wan-trt build`";
  if (static_cast<int64_t>(size) != io.engine_bytes)
    throw Error("engine " + engine + " is " + std::to_string(size) + " bytes, not the " +
                std::to_string(io.engine_bytes) + " of the engine its runtime file was written for" + fix);
  if (file_sha256(engine, "engine") != io.engine_sha256)
    throw Error("engine " + engine + ": its sha256 is not that of the engine its runtime file was written for" + fix);
  return identity;
}

std::string sha256_hex(const void* data, size_t n) {
  Sha256 digest;
  digest.update(static_cast<const unsigned char*>(data), n);
  return digest.hex();
}

std::string file_sha256(const std::string& path, const std::string& what) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error(what + " " + path + ": cannot be read (" + std::strerror(errno) + ")");
  Sha256 digest;
  std::vector<char> chunk(1 << 20);
  while (file) {
    file.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    digest.update(reinterpret_cast<const unsigned char*>(chunk.data()), static_cast<size_t>(file.gcount()));
  }
  if (file.bad()) throw Error(what + " " + path + ": reading it failed");
  return digest.hex();
}

void check_built_for(const GraphIO& io, const std::string& engine, at::Device device, const std::string& what,
                     const std::string& asked) {
  const std::string kind = c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  if (kind != io.device)
    throw Error(what + " " + engine + ": built for " + io.device + ", but asked to run on " +
                (asked.empty() ? device.str() : asked) + "; run it on " + io.device + ", or build one for " + kind);
}

bool is_aoti_package(const std::string& engine) {
  return read_bytes(engine, "engine", 4) == "PK\x03\x04";  // a zip's first local file header
}

// Refuse a verified engine (one `wan-trt build` wrote for its runtime file) that is no zip file, as an AOTInductor
// package is: the other kind of engine it builds, a TensorRT plan, which AOTInductor's loader fails on with a page.
static void check_package(const std::string& engine) {
  if (!is_aoti_package(engine))
    throw Error("engine " + engine + " is a TensorRT plan, not an AOTInductor package (a zip file): run it with the "
                "TensorRT runner, in a runtime built with -DWAN_TRT_WITH_TENSORRT=ON (make_tensorrt_runner; "
                "wan_stream --tensorrt)");
}

// ``device`` with the index its work runs on: "cuda" is the current CUDA device, comparable to its tensors'.
static at::Device concrete(at::Device device) {
#ifdef WAN_TRT_WITH_CUDA
  if (device.is_cuda() && !device.has_index()) return at::Device(at::kCUDA, c10::cuda::current_device());
#endif
  return device;
}

void check_feeds(const GraphIO& io, const std::map<std::string, at::Tensor>& feeds, at::Device device) {
  std::vector<std::string> problems;
  for (const auto& t : io.inputs) {
    const auto it = feeds.find(t.name);
    const std::string name = "input '" + t.name + "'";
    if (it == feeds.end() || !it->second.defined()) {
      problems.push_back("missing " + name);
      continue;
    }
    const at::Tensor& v = it->second;
    if (v.sizes() != at::IntArrayRef(t.shape) || v.scalar_type() != t.dtype)
      problems.push_back(name + ": expected " + c10::str(at::IntArrayRef(t.shape)) + " " + dtype_name(t.dtype) +
                         ", got " + c10::str(v.sizes()) + " " + dtype_name(v.scalar_type()));
    else if (v.device() != device)
      problems.push_back(name + " is on " + v.device().str() + ", not " + device.str());
    else if (!v.is_contiguous())
      problems.push_back(name + " is not contiguous (pass .contiguous())");
  }
  for (const auto& [name, v] : feeds)
    if (!io.has_input(name)) problems.push_back("unexpected input '" + name + "'");
  if (problems.empty()) return;
  std::string text = "feeds do not match the graph spec: ";
  for (size_t i = 0; i < problems.size(); ++i) text += (i ? "; " : "") + problems[i];
  throw Error(text);
}

AotiRunner::AotiRunner(const std::string& package, const GraphIO& io, at::Device device, bool cuda_graph)
    // the engine's kind of device is judged first: concrete() asks libtorch for the current device of that kind
    : io_(io), device_((check_built_for(io, package, device), concrete(device))), cuda_graph_(cuda_graph) {
  // a CPU package's calls captured as a CUDA graph capture nothing: every replay would hand back the first outputs
  if (cuda_graph && !device_.is_cuda())
    throw Error("engine " + package + ": CUDA graphs replay work on a CUDA device, and this runner runs on " +
                device_.str() + "; pass cuda_graph = false");
#ifndef WAN_TRT_WITH_CUDA
  if (cuda_graph) throw Error("CUDA graphs need a CUDA build of libtorch");
#else
  // AOTInductor loads a package onto the current CUDA device, whatever index the feeds are on
  if (device_.is_cuda() && device_.index() != c10::cuda::current_device())
    throw Error("engine " + package + ": asked to run on " + device_.str() + ", but AOTInductor loads its package " +
                "onto the current CUDA device, cuda:" + std::to_string(c10::cuda::current_device()) +
                "; make " + device_.str() + " current first (c10::cuda::set_device), or run on that one");
#endif
  const FileIdentity verified = verify_engine(package, io);
  check_package(package);
  impl_ = std::make_unique<Impl>(package, cuda_graph);
  check_unchanged(package, verified);  // the loader opened the path again
}

AotiRunner::~AotiRunner() = default;

static std::map<std::string, at::Tensor> run_package(torch::inductor::AOTIModelPackageLoader& loader,
                                                     const GraphIO& spec,
                                                     const std::map<std::string, at::Tensor>& feeds,
                                                     void* stream) {
  std::vector<at::Tensor> inputs;
  for (const auto& t : spec.inputs) inputs.push_back(feeds.at(t.name));
  std::vector<at::Tensor> outs = loader.run(inputs, stream);
  std::map<std::string, at::Tensor> named;
  for (size_t i = 0; i < spec.outputs.size(); ++i) named[spec.outputs[i].name] = outs.at(i);
  return named;
}

Fp32AsFp32::Fp32AsFp32(bool fp32) : active_(fp32) {
  if (!active_) return;
  auto& context = at::globalContext();
  convolutions_ = context.allowTF32CuDNN();
  matmuls_ = context.float32MatmulPrecision();
  context.setAllowTF32CuDNN(false);
  context.setFloat32MatmulPrecision("highest");
}

Fp32AsFp32::~Fp32AsFp32() {
  if (!active_) return;
  auto& context = at::globalContext();
  context.setAllowTF32CuDNN(convolutions_);
  context.setFloat32MatmulPrecision(matmuls_ == at::Float32MatmulPrecision::HIGHEST ? "highest"
                                    : matmuls_ == at::Float32MatmulPrecision::HIGH  ? "high"
                                                                                    : "medium");
}

std::map<std::string, at::Tensor> AotiRunner::infer(const std::map<std::string, at::Tensor>& feeds) {
  check_feeds(io_, feeds, device_);
  const Fp32AsFp32 arithmetic(io_.precision == "fp32");  // around the capture too: cuDNN picks its kernels then
#ifdef WAN_TRT_WITH_CUDA
  if (cuda_graph_) {
    if (!impl_->graph) {
      auto side = c10::cuda::getStreamFromPool(false, device_.index());
      side.synchronize();
      c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
      {
        c10::cuda::CUDAStreamGuard guard(side);
        for (int i = 0; i < 2; ++i) run_package(impl_->loader, io_, feeds, side.stream());
        side.synchronize();
        auto graph = std::make_unique<at::cuda::CUDAGraph>();  // kept only once captured: a capture that fails is
        graph->capture_begin();                                 // tried again by the next call
        std::map<std::string, at::Tensor> outputs;
        try {
          outputs = run_package(impl_->loader, io_, feeds, side.stream());
        } catch (...) {
          try {
            graph->capture_end();  // the stream leaves capture mode either way
          } catch (...) {
          }
          throw;
        }
        graph->capture_end();
        impl_->outputs = std::move(outputs);
        impl_->graph = std::move(graph);
      }
      impl_->pointers.clear();
      for (const auto& [name, v] : feeds) impl_->pointers[name] = v.data_ptr();
    }
    for (const auto& [name, v] : feeds)
      if (impl_->pointers.at(name) != v.data_ptr()) throw Error("CUDA-graph runner: input '" + name + "' moved");
    impl_->graph->replay();
    return impl_->outputs;
  }
  if (device_.is_cuda())
    return run_package(impl_->loader, io_, feeds, c10::cuda::getCurrentCUDAStream(device_.index()).stream());
#endif
  return run_package(impl_->loader, io_, feeds, nullptr);
}

// ---- noise ----------------------------------------------------------------------------------

static uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A draw's generator seed: (seed, block, step) mixed as wan_trt.stream.draw_seed does, 63 bits.
static uint64_t draw_seed(int64_t seed, int64_t block, int64_t step) {
  uint64_t h = splitmix64(static_cast<uint64_t>(seed));
  h = splitmix64(h ^ static_cast<uint64_t>(block));
  return splitmix64(h ^ static_cast<uint64_t>(step)) >> 1;
}

at::Tensor noise(int64_t seed, int64_t block, int64_t step, at::IntArrayRef shape, at::Device device,
                 at::ScalarType dtype) {
  const uint64_t value = draw_seed(seed, block, step);
  at::Generator gen;
#ifdef WAN_TRT_WITH_CUDA
  if (device.is_cuda()) {
    gen = at::cuda::detail::createCUDAGenerator(device.index());
    gen.set_current_seed(value);
  } else
#endif
  {
    gen = at::make_generator<at::CPUGeneratorImpl>(value);
  }
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat).device(device)).to(dtype);
}

// ---- decoder --------------------------------------------------------------------------------

at::Tensor to_uint8_frames(const at::Tensor& rgb) {
  return ((rgb[0].to(at::kFloat).clamp(-1, 1) + 1) * 127.5).round().to(at::kByte).permute({1, 2, 3, 0}).contiguous();
}

static std::map<std::string, at::Tensor> allocate(const std::vector<TensorSpec>& tensors, at::Device device) {
  std::map<std::string, at::Tensor> out;
  for (const auto& t : tensors) out[t.name] = at::zeros(t.shape, at::TensorOptions().dtype(t.dtype).device(device));
  return out;
}

DecoderStream::DecoderStream(Runner& first, const DecoderSpec& first_spec, Runner& steady,
                             const DecoderSpec& steady_spec)
    : first_(first), steady_(steady), spec_(steady_spec) {
  check_runs(first, first_spec, "DecoderStream (its first graph)");
  check_runs(steady, steady_spec, "DecoderStream (its steady graph)");
  const std::string problem = pair_problem(first_spec, steady_spec);
  if (!problem.empty())
    throw Error("DecoderStream: its two graphs' specs are " + problem + "; give it the pair of one decoder export "
                "(DecoderEngines::load finds it)");
  if (first.device() != steady.device()) throw Error("DecoderStream: the two graphs' runners are on different devices");
  feeds_ = allocate(steady_spec.inputs, steady.device());
  // cuDNN picks its fastest convolution algorithm per shape (once, on the first call); restored after
  benchmark_ = at::globalContext().benchmarkCuDNN();
  at::globalContext().setBenchmarkCuDNN(true);
}

DecoderStream::~DecoderStream() { at::globalContext().setBenchmarkCuDNN(benchmark_); }

void DecoderStream::check_attachable(const RuntimeSpec& spec) const {
  const TensorSpec &want = spec.input("latents"), &have = spec_.input("latents");
  if (want.shape != have.shape || want.dtype != have.dtype)
    throw Error("the decoder (" + spec_.config + ", " + spec_.precision + ") takes other latents than the DiT (" +
                spec.config + ", " + spec.precision + ") makes: export and build the decoder from the same config, " +
                "in the DiT's latent dtype (the same precision; bf16 for an fp8 DiT)");
}

void DecoderStream::attach(const std::shared_ptr<const int>& session) {
  const auto owner = owner_.lock();
  if (owner && owner != session)
    throw Error("this decoder is attached to another session: a decoder carries one stream's histories (a second "
                "session's start would reset them under the first); give each session its own DecoderStream, or "
                "destroy the other session first");
  owner_ = session;
}

static std::string first_non_finite(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

at::Tensor DecoderStream::decode(const at::Tensor& latents) {
  at::Tensor& slot = feeds_.at("latents");
  if (latents.sizes() != slot.sizes())
    throw Error("decoder latents: expected " + c10::str(slot.sizes()) + ", got " + c10::str(latents.sizes()));
  slot.copy_(latents);
  auto outputs = started_ ? steady_.infer(feeds_) : first_.infer({{"latents", slot}});
  if (!first_non_finite({{"rgb", outputs.at("rgb")}}).empty())  // uint8 would turn NaN into black frames
    throw Error("the decoder's frames (rgb) came out non-finite (NaN or Inf); its histories were not carried on: "
                "check the VAE weights (or the precision: fp16 overflows where bf16 does not)");
  at::Tensor frames = to_uint8_frames(outputs.at("rgb"));  // before the histories move on: a failure here
  for (const auto& [input, output] : spec_.histories) feeds_.at(input).copy_(outputs.at(output));  // changes nothing
  started_ = true;
  return frames;
}

// ---- host staging ---------------------------------------------------------------------------

struct HostStaging::Impl {
  at::Device device;
  at::Tensor device_buffer, host_buffer;
  std::map<std::string, at::Tensor> host_views;
#ifdef WAN_TRT_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> copied;  // the last copy out of the host buffer
#endif
};

HostStaging::HostStaging(std::map<std::string, at::Tensor>& feeds, const std::vector<std::string>& names,
                         at::Device device)
    : impl_(std::make_unique<Impl>(Impl{device, {}, {}, {}})) {
  constexpr int64_t kAlignment = 256;  // bytes, of every staged feed's address (TensorRT's rule for tensors)
  if (names.empty()) throw Error("HostStaging: no feeds to stage");
  const at::ScalarType dtype = feeds.at(names.front()).scalar_type();
  const int64_t step = kAlignment / static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<int64_t> offsets;
  int64_t end = 0;
  for (const auto& name : names) {
    if (feeds.at(name).scalar_type() != dtype) throw Error("HostStaging: the staged feeds must share one dtype");
    offsets.push_back(end);
    end += (feeds.at(name).numel() + step - 1) / step * step;
  }
  const auto options = at::TensorOptions().dtype(dtype);
  impl_->device_buffer = at::zeros({end}, options.device(device));  // CUDA allocations start 256-byte aligned
  impl_->host_buffer = at::zeros({end}, options.pinned_memory(device.is_cuda()));
  for (size_t i = 0; i < names.size(); ++i) {
    at::Tensor& feed = feeds.at(names[i]);
    const auto shape = feed.sizes().vec();
    impl_->host_views[names[i]] = impl_->host_buffer.narrow(0, offsets[i], feed.numel()).view(shape);
    feed = impl_->device_buffer.narrow(0, offsets[i], feed.numel()).view(shape);
  }
}

HostStaging::~HostStaging() = default;

void HostStaging::wait() {
#ifdef WAN_TRT_WITH_CUDA
  if (impl_->copied && !impl_->copied->query()) impl_->copied->synchronize();
#endif
}

const at::Tensor& HostStaging::host(const std::string& name) const { return impl_->host_views.at(name); }

void HostStaging::load() {
  const bool cuda = impl_->device.is_cuda();
  impl_->device_buffer.copy_(impl_->host_buffer, /*non_blocking=*/cuda);
#ifdef WAN_TRT_WITH_CUDA
  if (cuda) {
    impl_->copied = std::make_unique<at::cuda::CUDAEvent>();
    impl_->copied->record(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
  }
#endif
}

// ---- stage clock ----------------------------------------------------------------------------

struct StageClock::Impl {
  at::Device device;
  std::vector<std::string> stages;
  std::vector<std::chrono::steady_clock::time_point> times;
#ifdef WAN_TRT_WITH_CUDA
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events;
#endif
};

StageClock::StageClock(at::Device device) : impl_(std::make_unique<Impl>(Impl{device, {}, {}})) { mark("start"); }

StageClock::~StageClock() = default;

void StageClock::mark(const std::string& stage) {
  impl_->stages.push_back(stage);
#ifdef WAN_TRT_WITH_CUDA
  if (impl_->device.is_cuda()) {
    impl_->events.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    impl_->events.back()->record(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
    return;
  }
#endif
  impl_->times.push_back(std::chrono::steady_clock::now());
}

std::vector<std::pair<std::string, double>> StageClock::elapsed_ms() const {
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 1; i < impl_->stages.size(); ++i) {
#ifdef WAN_TRT_WITH_CUDA
    if (impl_->device.is_cuda()) {
      out.emplace_back(impl_->stages[i], impl_->events[i - 1]->elapsed_time(*impl_->events[i]));
      continue;
    }
#endif
    out.emplace_back(impl_->stages[i],
                     std::chrono::duration<double, std::milli>(impl_->times[i] - impl_->times[i - 1]).count());
  }
  return out;
}

// ---- session --------------------------------------------------------------------------------

std::string prefer_workspace_free_gemms() {
  // PyTorch's own environment functions: portable, and under the lock PyTorch reads the environment with
  c10::utils::set_env("CUBLASLT_WORKSPACE_SIZE", "0", /*overwrite=*/false);
  return c10::utils::get_env("CUBLASLT_WORKSPACE_SIZE").value_or("");
}

void check_runs(const Runner& runner, const GraphIO& spec, const std::string& what) {
  const GraphIO* io = runner.io();
  if (io != nullptr && io->engine_sha256 != spec.engine_sha256)
    throw Error(what + ": its runner runs the engine of sha256 " + io->engine_sha256.substr(0, 12) + "..., its spec "
                "is the runtime file of another (" + spec.engine_sha256.substr(0, 12) + "...); give the runner's own "
                "spec (the runtime file beside its engine)");
}

StreamingSession::StreamingSession(Runner& runner, const RuntimeSpec& spec, int64_t seed, DecoderStream* decoder)
    : runner_(runner), spec_(spec), seed_(seed), device_(runner.device()), decoder_(decoder) {
  check_runs(runner, spec, "StreamingSession");
  prefer_workspace_free_gemms();  // effective where no GEMM ran in this process yet
  feeds_ = allocate(spec.inputs, device_);
  std::vector<std::string> rotary;
  for (const auto& r : spec.rotaries) {
    const int64_t n = static_cast<int64_t>(r.inv_freq.size());
    for (const auto& name : {r.cos, r.sin}) {  // load_rotaries writes [block_frames, n] fp32 into each
      const at::Tensor& feed = feeds_.at(name);
      if (feed.numel() != spec.block_frames * n || feed.scalar_type() != at::kFloat)
        throw Error("runtime file: rotary input " + name + " is not fp32 [" + std::to_string(spec.block_frames) +
                    ", " + std::to_string(n) + "]");
      rotary.push_back(name);
    }
  }
  rotary_ = std::make_unique<HostStaging>(feeds_, rotary, device_);
  if (decoder) {
    decoder->check_attachable(spec);
    if (decoder->device() != device_)
      throw Error("the decoder runs on " + decoder->device().str() + ", the session on " + device_.str());
    decoder->attach(token_);
  }
}

// The name of the first tensor holding NaN or Inf, or "": one multi-tensor reduction of each tensor's
// largest magnitude (NaN propagates into it, +-Inf becomes it) and one device sync, as in Python.
static std::string first_non_finite(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<at::Tensor> read;
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors)
    if (t.numel() > 0 && at::isFloatingType(t.scalar_type())) {  // an empty or integer tensor holds nothing non-finite
      read.push_back(t);
      names.push_back(name);
    }
  if (read.empty()) return "";
  std::vector<at::Tensor> largest = at::_foreach_norm(read, INFINITY, at::kFloat);
  const at::Device device = largest.front().device();  // inputs may sit on the host, the rest on the GPU
  for (auto& m : largest) m = m.to(device);
  const at::Tensor finite = at::isfinite(at::stack(largest)).to(at::kCPU);
  for (size_t i = 0; i < names.size(); ++i)
    if (!finite[static_cast<int64_t>(i)].item<bool>()) return names[i];
  return "";
}

// Refuse an input (``what``: "cond_concat of block 3") found non-finite once converted to the session's ``dtype``,
// judging it as ``given``, before that conversion: a finite value beyond the dtype's range (fp16 makes -1e5 -Inf)
// is named as such, not as NaN or Inf, as in Python. Read on a refused input only: the step's one sync stays one.
[[noreturn]] static void refuse_input(const std::string& what, const at::Tensor& given, at::ScalarType dtype) {
  const at::Tensor wide = at::isFloatingType(given.scalar_type()) ? given : given.to(at::kDouble);  // its own dtype
  const double top = wide.abs().max().item<double>();  // NaN where it holds one, Inf where it holds one
  if (std::isfinite(top))
    throw Error(what + " holds values beyond " + dtype_name(dtype) + "'s range (largest magnitude " + number_6g(top) +
                ", " + dtype_name(dtype) + " holds up to " + number_6g(dtype_max(dtype)) + "); scale them down");
  throw Error(what + " holds non-finite values (NaN or Inf)");
}

// Refuse ``t`` (the input ``name``, for ``what``) unless it has ``shape``, saying what was expected and received as
// the Python session does.
static void check_shape(const std::string& name, const at::Tensor& t, c10::IntArrayRef shape, const std::string& what,
                        const std::string& config) {
  if (!t.defined() || t.sizes() != shape)
    throw Error(name + ": expected shape " + c10::str(shape) + " for " + what + " of '" + config + "', got " +
                (t.defined() ? c10::str(t.sizes()) : std::string("no tensor")));
}

int64_t first_raw_frame(const RuntimeSpec& spec, int64_t block) {
  return block == 0 ? 0 : 1 + spec.ratio * (block * spec.block_frames - 1);
}

int64_t raw_frames_in_block(const RuntimeSpec& spec, int64_t block) {
  return first_raw_frame(spec, block + 1) - first_raw_frame(spec, block);
}

void StreamingSession::start(const at::Tensor& visual_context, int64_t start_block) {
  check_within_reach(spec_, "start_block", start_block, 1);
  at::Tensor& slot = feeds_.at("visual_context");
  check_shape("visual_context", visual_context, slot.sizes(),
              "the stream starting at block " + std::to_string(start_block), spec_.config);
  const at::Tensor visual = real_input("visual_context", visual_context, " of the stream");
  if (!first_non_finite({{"visual_context", visual}}).empty())
    refuse_input("visual_context of the stream", visual_context, spec_.dtype());
  slot.copy_(visual);
  for (const auto& c : spec_.caches)
    if (spec_.prev_frames > 0) {
      feeds_.at(c.prev_k).zero_();
      feeds_.at(c.prev_v).zero_();
    }
  history_.clear();
  base_.clear();
  block_ = start_block;
  valid_frames_ = 0;
  next_noise_block_ = -1;
  next_noise_ = at::Tensor();
  started_ = true;
  if (decoder_) decoder_->reset();
}

// ``t`` on the session's device and dtype, refused as the Python session's checked_tensor refuses: a meta or sparse
// tensor (no values to copy), a complex one (a conversion would drop its imaginary part), and an integer or boolean
// one where floats are meant (the image features and latents; actions may be 0/1 integers or booleans: ``numbers``).
at::Tensor StreamingSession::real_input(const std::string& name, const at::Tensor& t, const std::string& of,
                                        bool numbers) const {
  if (!t.defined()) return t;
  check_kind(name, t, of, numbers);
  return t.to(device_, spec_.dtype());
}

void StreamingSession::check_kind(const std::string& name, const at::Tensor& t, const std::string& of, bool numbers) {
  if (t.is_meta() || t.layout() != at::kStrided)
    throw Error(name + ": expected a dense tensor with values" + of + ", got " +
                (t.is_meta() ? std::string("a meta tensor (no values)") : "a " + c10::str(t.layout()) + " tensor"));
  const std::string dtype(c10::toString(t.scalar_type()));
  if (at::isComplexType(t.scalar_type())) throw Error(name + ": expected a real tensor" + of + ", got " + dtype);
  if (!numbers && !at::isFloatingType(t.scalar_type()))
    throw Error(name + ": expected a floating-point tensor" + of + ", got " + dtype);
}

// ``raw`` as this block's frames: one action [1, D] held for the whole block is expanded to [1, n, D], as the Python
// session takes it; any other tensor as it is (check_actions judges it). A [1, D'] of another width is refused naming
// both forms.
at::Tensor StreamingSession::held_expanded(const std::string& name, const at::Tensor& raw) const {
  const std::string window = name + "_window";
  if (!raw.defined() || raw.dim() != 2 || !spec_.has_input(window)) return raw;
  const int64_t d = spec_.input(window).shape.back(), n = raw_frames_in_block(spec_, block_);
  if (raw.size(0) != 1 || raw.size(1) != d)
    throw Error(name + ": expected [1, " + std::to_string(d) + "] (one action held for block " +
                std::to_string(block_) + ") or [1, " + std::to_string(n) + ", " + std::to_string(d) +
                "] (one per video frame), got " + c10::str(raw.sizes()));
  check_kind(name, raw, " for block " + std::to_string(block_), true);  // before it is expanded (a sparse one cannot be)
  return raw.unsqueeze(1).expand({1, n, d});
}

bool StreamingSession::check_actions(const std::string& name, const at::Tensor& raw) const {
  const std::string window = name + "_window";
  if (!spec_.has_input(window)) {
    if (raw.defined() && raw.numel() > 0) throw Error("config '" + spec_.config + "' has no " + name + " input");
    return false;
  }
  const int64_t n = raw_frames_in_block(spec_, block_);
  check_shape(name, raw, {1, n, spec_.input(window).shape.back()}, "block " + std::to_string(block_), spec_.config);
  return true;
}

void StreamingSession::feed_actions(const std::string& name, const at::Tensor& raw_in) {
  const std::string window = name + "_window";
  const int64_t f = spec_.block_frames, r = spec_.ratio, w = spec_.window_frames;
  at::Tensor raw = raw_in.to(device_, spec_.dtype());
  auto it = history_.find(name);
  if (it == history_.end()) {
    history_[name] = at::cat({raw.narrow(1, 0, 1).expand({-1, w, -1}), raw}, 1);
    base_[name] = first_raw_frame(spec_, block_);  // a later start: its padding stands in for earlier frames
  } else {
    it->second = at::cat({it->second, raw}, 1);
  }
  const at::Tensor& frames = history_.at(name);
  const int64_t first = r * block_ * f - base_.at(name);
  std::vector<at::Tensor> windows;
  for (int64_t i = 0; i < f; ++i) windows.push_back(frames.narrow(1, first + r * i, w));
  feeds_.at(window).copy_(at::stack(windows, 1));
}

// cos/sin of (start + f) * inv_freq in double, stored fp32: the same numbers as wan_trt.rotary; written into
// the pinned host buffer and copied to the device in one copy, unless the feeds hold them already.
void StreamingSession::load_rotaries(int64_t start) {
  if (rotary_start_ == start) return;
  rotary_start_ = -1;  // until the copy is queued
  rotary_->wait();
  const int64_t f = spec_.block_frames;
  for (const auto& r : spec_.rotaries) {
    const int64_t n = static_cast<int64_t>(r.inv_freq.size());
    float* c = rotary_->host(r.cos).data_ptr<float>();  // fp32 [f, n]: checked when the session was made
    float* s = rotary_->host(r.sin).data_ptr<float>();
    for (int64_t i = 0; i < f; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const double angle = static_cast<double>(start + i) * r.inv_freq[j];
        c[i * n + j] = static_cast<float>(std::cos(angle));
        s[i * n + j] = static_cast<float>(std::sin(angle));
      }
  }
  rotary_->load();
  rotary_start_ = start;
}

int64_t reachable_blocks(const RuntimeSpec& spec) { return spec.max_stream_frames / spec.block_frames; }

void check_within_reach(const RuntimeSpec& spec, const std::string& what, int64_t first_block, int64_t blocks) {
  const int64_t reach = reachable_blocks(spec);
  const std::string given = what + " " + std::to_string(first_block);
  const std::string reaches = "a stream reaches " + std::to_string(spec.max_stream_frames) +
                              " latent frames (blocks 0 to " + std::to_string(reach - 1) + ")";
  if (first_block < 0 || first_block >= reach) throw Error(given + ": " + reaches + "; start at one of them");
  if (blocks < 1) throw Error(given + ", " + std::to_string(blocks) + " blocks: expected 1 block or more");
  if (blocks > reach - first_block)  // not first_block + blocks, which may overflow
    throw Error(given + ", " + std::to_string(blocks) + " blocks: " + reaches + "; ask for at most " +
                std::to_string(reach - first_block) + " block(s) from block " + std::to_string(first_block));
}

// (block + 1) * block_frames <= max_stream_frames, without the product (which overflows for a huge block)
bool StreamingSession::within_reach(int64_t block) const { return block >= 0 && block < reachable_blocks(spec_); }

at::Tensor StreamingSession::first_noise(int64_t block) const {
  const auto& latents = spec_.input("latents");
  return noise(seed_, block, 0, latents.shape, device_, latents.dtype);
}

// The next block's rotary tables and first noise, made while the device runs this block's clean pass (queued
// after it, the last reader of this block's tables). A refused block leaves the next step to load its own.
void StreamingSession::stage_next_block() {
  const int64_t following = block_ + 1;
  if (!within_reach(following)) return;
  load_rotaries(following * spec_.block_frames);
  next_noise_ = first_noise(following);
  next_noise_block_ = following;
}

std::map<std::string, at::Tensor> StreamingSession::run(const at::Tensor& x, double t) {
  feeds_.at("latents").copy_(x);
  feeds_.at("timestep").fill_(t);
  return runner_.infer(feeds_);
}

Block StreamingSession::step(const at::Tensor& cond, const at::Tensor& mouse, const at::Tensor& keyboard) {
  const auto begin = std::chrono::steady_clock::now();
  const int64_t f = spec_.block_frames, start = block_ * f;
  const std::string of_block = " of block " + std::to_string(block_);
  // every check before any state changes: a refused step leaves the session as it was
  if (!started_) throw Error("step() before start(): start the stream with its visual context first");
  if (!within_reach(block_))
    throw Error("block " + std::to_string(block_) + " would end past the " + std::to_string(spec_.max_stream_frames) +
                " latent frames a stream can reach: start a new stream");
  at::Tensor& cond_slot = feeds_.at("cond_concat");
  check_shape("cond_concat", cond, cond_slot.sizes(), "block " + std::to_string(block_), spec_.config);
  const std::string for_block = " for block " + std::to_string(block_);
  // the inputs on the session's device and dtype, checked with the outputs; a refused one is judged as given
  std::vector<std::pair<std::string, at::Tensor>> inputs{{"cond_concat", real_input("cond_concat", cond, for_block)}};
  const at::Tensor mouse_frames = held_expanded("mouse", mouse), keyboard_frames = held_expanded("keyboard", keyboard);
  const std::map<std::string, at::Tensor> as_given{
      {"cond_concat", cond}, {"mouse", mouse_frames}, {"keyboard", keyboard_frames}};
  if (check_actions("mouse", mouse_frames))
    inputs.emplace_back("mouse", real_input("mouse", mouse_frames, for_block, true));
  if (check_actions("keyboard", keyboard_frames))
    inputs.emplace_back("keyboard", real_input("keyboard", keyboard_frames, for_block, true));
  const auto kept_history = history_;  // tensor handles: feed_actions replaces, never writes in place
  const auto kept_base = base_;
  StageClock clock(device_);
  Block result;
  std::map<std::string, at::Tensor> outputs;
  try {  // until the commit, any failure (a bad block, a runner or decoder error) leaves the session as it was
    for (size_t i = 1; i < inputs.size(); ++i) feed_actions(inputs[i].first, inputs[i].second);
    cond_slot.copy_(inputs[0].second);
    load_rotaries(start);
    if (spec_.prev_frames > 0) feeds_.at("valid_frames").fill_(valid_frames_);

    const auto& latents = spec_.input("latents");
    const at::ScalarType dtype = latents.dtype;
    at::Tensor x = next_noise_block_ == block_ ? next_noise_ : first_noise(block_), x0;
    next_noise_block_ = -1;
    next_noise_ = at::Tensor();
    const size_t steps = spec_.timesteps.size();
    for (size_t i = 0; i < steps; ++i) {
      at::Tensor flow = run(x, spec_.timesteps[i]).at("flow");
      x0 = (x.to(at::kDouble) - spec_.sigmas[i] * flow.to(at::kDouble)).to(flow.scalar_type());
      if (i + 1 < steps) {
        at::Tensor fresh = noise(seed_, block_, static_cast<int64_t>(i + 1), latents.shape, device_, dtype);
        const double s = spec_.sigmas[i + 1];
        x = ((1 - s) * x0.to(at::kFloat) + s * fresh.to(at::kFloat)).to(dtype);
      }
    }
    clock.mark("passes");
    outputs = run(x0, spec_.clean_timestep);
    clock.mark("clean");
    stage_next_block();  // while the device runs the clean pass
    // the inputs first: NaN in an input makes the block's outputs NaN too
    std::vector<std::pair<std::string, at::Tensor>> checked(inputs);
    checked.emplace_back("latents", x0);
    if (spec_.prev_frames > 0)
      for (const auto& c : spec_.caches)
        for (const auto& cur : {c.cur_k, c.cur_v}) checked.emplace_back(cur, outputs.at(cur));
    const std::string bad = first_non_finite(checked);
    const bool bad_input = std::any_of(inputs.begin(), inputs.end(), [&](const auto& g) { return g.first == bad; });
    if (bad_input) refuse_input(bad + of_block, as_given.at(bad), spec_.dtype());
    if (!bad.empty()) throw Error(bad + of_block + " came out non-finite (NaN or Inf): the block was not committed");
    clock.mark("checks");
    result.latents = x0;
    if (decoder_) {  // before the commit: a decode that fails leaves the caches as they were
      result.frames = decoder_->decode(x0);
      clock.mark("decode");
    }
  } catch (...) {
    history_ = kept_history;
    base_ = kept_base;
    throw;
  }
  commit(outputs);
  clock.mark("commit");
#ifdef WAN_TRT_WITH_CUDA
  if (device_.is_cuda()) c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
  result.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  result.stage_ms = clock.elapsed_ms();
  ++block_;
  for (auto& [name, frames] : history_) {  // drop raw frames no later window reads
    const int64_t drop = spec_.ratio * block_ * f - base_.at(name);
    if (drop > 0) {
      frames = frames.narrow(1, drop, frames.size(1) - drop).clone();
      base_.at(name) += drop;
    }
  }
  return result;
}

void StreamingSession::commit(std::map<std::string, at::Tensor>& outputs) {
  const int64_t p = spec_.prev_frames, f = spec_.block_frames;
  if (p == 0) return;
  std::vector<at::Tensor> targets, sources;  // one multi-tensor copy for every layer's K and V
  for (const auto& c : spec_.caches) {
    for (const auto& [prev, cur] : {std::make_pair(c.prev_k, c.cur_k), std::make_pair(c.prev_v, c.cur_v)}) {
      at::Tensor& buf = feeds_.at(prev);
      const at::Tensor& fresh = outputs.at(cur);
      const int64_t u = c.units;
      if (p == f && runner_.swap_inputs() && fresh.is_contiguous()) {
        buf = fresh;  // swap: AOTInductor returns fresh tensors each run (a strided view is copied instead)
      } else if (p <= f) {
        targets.push_back(buf);
        sources.push_back(fresh.narrow(1, (f - p) * u, p * u));
      } else {
        buf.narrow(1, 0, (p - f) * u).copy_(buf.narrow(1, f * u, (p - f) * u).clone());
        targets.push_back(buf.narrow(1, (p - f) * u, f * u));
        sources.push_back(fresh);
      }
    }
  }
  if (!targets.empty()) at::_foreach_copy_(targets, sources);
  valid_frames_ = std::min(p, valid_frames_ + f);
}

}  // namespace wan_trt
