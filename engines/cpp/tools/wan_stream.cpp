// wan_stream: stream N blocks through an engine from C++ and write the latents (and the frames).
//
//   wan_stream --engine E.pt2 --inputs stream_inputs.pt --blocks 8 --out latents.pt
//              [--runtime E.pt2.runtime.txt] [--seed 0] [--device cpu|cuda] [--cuda-graph] [--tensorrt]
//              [--start-block 0] [--actions actions.jsonl] [--decoder DEC/steady/E.pt2 --frames frames.pt]
//              [--overwrite]
//
// --inputs is a file written with torch.save (Python) of a dict {"visual_context", "cond_concat",
// "mouse", "keyboard", "first_block"} (see wan_trt.engines.runtime.cpp.write_stream_inputs) holding the
// blocks from first_block on (raw actions from that block's first raw frame on); the stream starts
// there (--start-block, if given, must say the same); raw action histories are cut
// into each block's new frames here, as a live client would send them. --actions replaces the inputs'
// actions by those of a JSON-lines file (one line per block from the first streamed block on; the
// format of wan_trt/actions.py). --decoder (either engine of a decoder engine pair, same backend as
// --engine) decodes every block; --frames then receives its uint8 frames [9 + 12 (N - 1), 8H, 8W, 3].
// Output: torch.save-loadable tensor [1, 16, 3*N, H, W] and one line per block on stdout:
// "block i: <ms> ms (passes <ms>, clean <ms>, checks <ms>[, decode <ms>], commit <ms>)".
// Refused before any block runs: an unknown flag, a value flag given twice (a boolean flag repeated means it once),
// --cuda-graph on the CPU, --tensorrt with a flag its runner does not honour (--cuda-graph, a --device other than
// the current CUDA device), an --engine or --decoder built for another kind of device than --device's (the library's
// check_built_for, asked as soon as their runtime files are read), a TensorRT plan without --tensorrt (by the
// library's AotiRunner, once it has verified the plan), --out or --frames that is a folder, lies in no folder, is a
// file the run reads (or the other output), or exists (--overwrite replaces only an output of wan_stream: one whose record,
// OUT.wan_stream, gives its size and sha256), or lies where hard links cannot be made (without --overwrite),
// more --blocks than the inputs hold or a stream reaches from their first block, a --seed outside 0..2^32-1, a
// defect of the --actions file, by line (a value beyond the range of the engine's dtype too: fp16 65504),
// an --inputs file that is not one (a folder, a pipe, unreadable, no file torch.save wrote or one libtorch cannot load,
// not a dict, keys missing or unknown, actions the engine takes missing (unless --actions gives them) or ones it does
// not take, a field of another type or of another shape than the engine's) or whose first_block lies beyond a stream's
// reach.
// A runtime file that is older, edited or cut (its last line, the sha256 of the lines before it, does not
// match), or with a field that does not parse, is refused before anything else is read; a file that is no
// runtime file (the engine given by mistake, GBs) by its first line, without reading the rest.
// Outputs are written whole or not at all: each, and its record OUT.wan_stream (its size and sha256: what --overwrite
// knows an output of wan_stream by), into a fresh staging file beside it, all staged before any is put at its path
// (without --overwrite, never over a file that appeared meanwhile); a failed write exits 1 and removes only the
// staging files. Staging files a killed run left (named with its process id, gone) are removed by the next run.
#include <torch/serialize.h>

#include <stdlib.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "wan_trt/runtime.h"

#ifdef WAN_TRT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace {

namespace fs = std::filesystem;

const std::set<std::string> kValueFlags{"--engine", "--inputs", "--blocks", "--out",     "--runtime",  "--seed",
                                        "--device", "--start-block", "--actions", "--decoder", "--frames"};
const std::set<std::string> kSwitches{"--cuda-graph", "--tensorrt", "--overwrite"};  // boolean flags
constexpr int64_t kMaxSeed = 4294967295;  // as `wan-trt --seed`: 32 bits

constexpr size_t kTensorHead = 30 + 256;  // a zip's first local header and a name of up to 256 bytes

// Whether ``head``, a file's first bytes (kTensorHead of them where it has as many), is that of a tensor file as
// torch.save writes (a zip whose first entry is its pickle or a storage of it: TOP/data.pkl, TOP/data/N).
bool tensor_head(const std::string& head) {
  const std::streamsize got = static_cast<std::streamsize>(head.size());
  if (got < 30 || std::memcmp(head.data(), "PK\x03\x04", 4) != 0) return false;
  const size_t length = static_cast<unsigned char>(head[26]) | static_cast<unsigned char>(head[27]) << 8;
  if (30 + static_cast<std::streamsize>(length) > got) return false;
  const std::string name = head.substr(30, length);
  const size_t top = name.find('/');
  if (top == std::string::npos || top == 0) return false;
  const std::string rest = name.substr(top + 1);
  if (rest == "data.pkl") return true;
  return rest.size() > 5 && rest.compare(0, 5, "data/") == 0 &&
         rest.find_first_not_of("0123456789", 5) == std::string::npos;
}

// An output's record, PATH.wan_stream beside it, written with every output: what tells an output of wan_stream from
// any other file (a tensor file alone could be a user's checkpoint), so --overwrite replaces only those. It names the
// output's size and sha256, so an output changed since it was written is no longer one.
std::string record_path(const std::string& path) { return path + ".wan_stream"; }

std::string record_text(size_t size, const std::string& sha256) {
  return "wan_stream output\nsize " + std::to_string(size) + "\nsha256 " + sha256 + "\n";
}

constexpr size_t kRecordBytes = 200;  // a record's size: larger files are none

// Whether ``record`` is a file wan_stream may replace as a record: one in the record's format (any output's).
bool record_file(const std::string& record) {
  try {
    return wan_trt::read_bytes(record, "", kRecordBytes).rfind("wan_stream output\n", 0) == 0;
  } catch (const wan_trt::Error&) {  // a file that cannot be read is not one to replace
    return false;
  }
}

// Whether ``path`` is an output wan_stream wrote and nobody changed since: its record says its size and sha256.
bool own_output(const fs::path& path) {
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (error || !fs::is_regular_file(path, error)) return false;
  try {
    const std::string text = wan_trt::read_bytes(record_path(path.string()), "", kRecordBytes);
    const std::string head = "wan_stream output\nsize " + std::to_string(size) + "\n";
    return text.rfind(head, 0) == 0 && text == record_text(size, wan_trt::file_sha256(path.string(), ""));
  } catch (const wan_trt::Error&) {  // no record, or one that cannot be read: not an output of wan_stream's
    return false;
  }
}

// The stream inputs of an --inputs file: write_stream_inputs's dict.
struct StreamInputs {
  at::Tensor visual, cond, mouse, keyboard;  // mouse, keyboard: undefined where None or absent
  int64_t first = 0;                          // first_block: 0 where absent
};

// The shape the field ``key`` of an --inputs file must have for this engine; -1: the frames the file holds.
std::vector<int64_t> inputs_shape(const wan_trt::RuntimeSpec& spec, const std::string& key) {
  std::vector<int64_t> shape = {1, -1, -1};  // raw actions: [1, frames, dim]
  if (key == "visual_context" || key == "cond_concat") shape = spec.input(key).shape;
  if (key == "cond_concat") shape[2] = -1;
  if ((key == "mouse" || key == "keyboard") && spec.has_input(key + "_window"))
    shape[2] = spec.input(key + "_window").shape.back();
  return shape;
}

// "[1, 16, F, 4, 6]": a shape, -1 written F.
std::string shape_text(c10::IntArrayRef shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d)
    text += (d ? ", " : "") + (shape[d] == -1 ? std::string("F") : std::to_string(shape[d]));
  return text + "]";
}

const std::string kWriter = "wan_trt.engines.runtime.cpp.write_stream_inputs";  // of --inputs files
const std::vector<std::string> kInputsKeys{"visual_context", "cond_concat", "mouse", "keyboard", "first_block"};

// "a, b": the names, ", " between them.
std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// The keys of an --inputs dict (``where``: "--inputs PATH: "): the two every stream needs, and no key the writer's
// dict lacks (a misspelt one would go unread).
void check_keys(const c10::Dict<c10::IValue, c10::IValue>& dict, const std::string& where) {
  const std::string saves = "the dict " + kWriter + " saves holds " + listed(kInputsKeys);
  std::vector<std::string> missing, unknown;
  for (const std::string key : {"visual_context", "cond_concat"})
    if (dict.find(key) == dict.end()) missing.push_back(key);
  if (!missing.empty()) throw wan_trt::Error(where + "no " + listed(missing) + " (" + saves + ")");
  for (const auto& entry : dict) {
    std::ostringstream key;  // a key that is no string is written as Python would show it
    if (entry.key().isString()) key << entry.key().toStringRef();
    else key << entry.key();
    if (std::find(kInputsKeys.begin(), kInputsKeys.end(), key.str()) == kInputsKeys.end()) unknown.push_back(key.str());
  }
  if (!unknown.empty())
    throw wan_trt::Error(where + "unknown key" + (unknown.size() > 1 ? "s " : " ") + listed(unknown) + " (" + saves +
                         ")");
}

// The actions of an --inputs dict: those this engine takes (unless --actions gives them: ``actions``), and none it
// does not take (inputs of another config, whose actions would go unread where --actions replaces them).
void check_action_keys(const c10::Dict<c10::IValue, c10::IValue>& dict, const wan_trt::RuntimeSpec& spec,
                       const std::string& where, bool actions) {
  for (const std::string name : {"mouse", "keyboard"}) {
    const auto it = dict.find(name);
    const bool given = it != dict.end() && !it->value().isNone(), takes = spec.has_input(name + "_window");
    if (takes && !given && !actions)
      throw wan_trt::Error(where + "no " + name + " (this engine, " + spec.config + ", takes " + name +
                           " actions); save them in the file, or give --actions FILE");
    if (!takes && given)
      throw wan_trt::Error(where + name + ": this engine (" + spec.config + ") takes no " + name +
                           " actions; give inputs of " + spec.config + " (their " + name + " is None)");
  }
}

// The inputs of ``path`` (--inputs), every defect refused on one line naming the file and what is wrong: not a
// file or not readable, not a file torch.save wrote or one libtorch cannot load, not a dict, keys missing or unknown,
// actions this engine takes missing (unless --actions gives them: ``actions``) or ones it does not take, a field of
// another type or shape than this engine's. Only a file in another format is pointed to the writer.
StreamInputs read_inputs(const std::string& path, const wan_trt::RuntimeSpec& spec, bool actions) {
  wan_trt::check_input_file(path, "--inputs");
  const std::string where = "--inputs " + path + ": ";
  if (!tensor_head(wan_trt::read_bytes(path, "--inputs", kTensorHead)))  // judged before the rest is read: GBs,
    throw wan_trt::Error(where + "not a file torch.save wrote; write it with " + kWriter);  // by mistake
  const std::string text = wan_trt::read_bytes(path, "--inputs");
  const std::vector<char> bytes(text.begin(), text.end());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {  // libtorch's what() is a page with a backtrace: its first sentence
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    const std::string why = error ? error->what_without_backtrace() : e.what();
    throw wan_trt::Error(where + "a torch.save file libtorch cannot load (" +
                         why.substr(0, std::min(why.find(". "), why.find('\n'))) +
                         "): cut short, or holding objects other than tensors, numbers, strings, lists and dicts; "
                         "write it with " + kWriter);
  }
  if (!value.isGenericDict())
    throw wan_trt::Error(where + "holds a " + value.tagKind() + ", not the dict of stream inputs " + kWriter +
                         " saves");
  const auto dict = value.toGenericDict();
  check_keys(dict, where);
  check_action_keys(dict, spec, where, actions);
  auto tensor = [&](const std::string& key, bool required) {
    auto it = dict.find(key);
    if (it == dict.end() || (it->value().isNone() && !required)) return at::Tensor();
    if (!it->value().isTensor())
      throw wan_trt::Error(where + key + " is " + (it->value().isNone() ? "None" : "a " + it->value().tagKind()) +
                           ", not a tensor" + (required ? "" : " or None"));
    const at::Tensor t = it->value().toTensor();
    const std::vector<int64_t> shape = inputs_shape(spec, key);
    if (static_cast<size_t>(t.dim()) != shape.size())
      throw wan_trt::Error(where + key + " has " + std::to_string(t.dim()) + " dimensions, not " +
                           std::to_string(shape.size()));
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != -1 && t.size(d) != shape[d])
        throw wan_trt::Error(where + key + " has shape " + shape_text(t.sizes()) + "; this engine (" + spec.config +
                             ") takes " + shape_text(shape) +
                             (std::count(shape.begin(), shape.end(), -1) ? " (F: the frames it holds)" : "") +
                             "; give inputs of " + spec.config);
    return t;
  };
  StreamInputs in{tensor("visual_context", true), tensor("cond_concat", true), tensor("mouse", false),
                  tensor("keyboard", false)};
  auto first = dict.find(std::string("first_block"));
  if (first != dict.end() && !first->value().isInt())
    throw wan_trt::Error(where + "first_block is a " + first->value().tagKind() + ", not an integer");
  if (first != dict.end()) in.first = first->value().toInt();
  return in;
}

int64_t integer(std::map<std::string, std::string>& args, const std::string& key) {
  const std::string& text = args.at(key);
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw wan_trt::Error(key + ": expected an integer, got '" + text + "'");
  return value;
}

// A fresh staging file beside ``path`` (``path``.partial-PID-XXXXXX, private, empty; PID: this process's), or "" with
// errno set.
std::string staging_file(const std::string& path) {
  const std::string pattern = path + ".partial-" + std::to_string(getpid()) + "-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) return "";
  close(fd);
  return name.data();
}

// Remove the staging files a killed run left beside ``path`` and its record (staging_file's names whose process is
// gone on this machine); those of a run still going, and every other file, stay.
void remove_stale_staging(const std::string& path) {
  const fs::path file(path);
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code error;
  std::vector<fs::path> stale;  // collected first: the folder is not changed while it is read
  for (const std::string& base : {file.filename().string(), fs::path(record_path(path)).filename().string()}) {
    const std::string prefix = base + ".partial-";
    for (const auto& entry : fs::directory_iterator(folder, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string rest = name.substr(prefix.size());  // PID-XXXXXX
      const size_t dash = rest.find('-');
      if (dash == std::string::npos || dash == 0 || dash > 9 || rest.size() != dash + 7 ||
          rest.find_first_not_of("0123456789") != dash || !entry.is_regular_file(error))
        continue;
      const pid_t pid = static_cast<pid_t>(std::stol(rest.substr(0, dash)));
      if (kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(entry.path());
    }
  }
  for (const auto& path_left : stale) fs::remove(path_left, error);
}

// The outputs, written whole or not at all: each, and its record (record_path), into a staging file of its own
// beside it (a fresh name: never a file of someone else's), all staged before any is put at its path. Without
// ``overwrite`` a path taken meanwhile is not replaced (a hard link, refused where the name exists); with it, only an
// output of wan_stream's (own_output) and a record are.
void save_all(const std::vector<std::pair<at::Tensor, std::string>>& outputs, bool overwrite) {
  std::vector<std::pair<std::string, std::string>> staged;  // (staging file, path), not renamed yet
  auto fail = [&](const std::string& path, const std::string& why, const std::string& written = "nothing") {
    for (const auto& [staging, _] : staged) std::remove(staging.c_str());
    throw wan_trt::Error("writing " + path + " failed (" + why + "); " + written + " was written");
  };
  const mode_t mask = umask(0);
  umask(mask);
  auto stage = [&](const std::string& path, const char* data, size_t n) {
    const std::string name = staging_file(path);
    if (name.empty()) fail(path, std::strerror(errno));
    staged.emplace_back(name, path);
    std::ofstream file(name, std::ios::binary);
    file.write(data, static_cast<std::streamsize>(n));
    file.close();
    if (!file) fail(path, "disk full or not writable");
    std::error_code mode;  // mkstemp's files are private
    fs::permissions(name, static_cast<fs::perms>(0666 & ~mask), mode);
    if (mode) fail(path, mode.message());
  };
  try {
    for (const auto& [tensor, path] : outputs) {
      std::vector<char> bytes = torch::pickle_save(tensor);
      stage(path, bytes.data(), bytes.size());
      const std::string record = record_text(bytes.size(), wan_trt::sha256_hex(bytes.data(), bytes.size()));
      stage(record_path(path), record.data(), record.size());
    }
  } catch (...) {  // fail()'s own error too: removing a removed staging file does nothing
    for (const auto& [staging, _] : staged) std::remove(staging.c_str());
    throw;
  }
  std::string written = "nothing";
  while (!staged.empty()) {  // each output, then its record
    const auto& [staging, path] = staged.front();
    const bool record = staged.size() % 2 == 1;
    std::error_code placed;
    if (!overwrite) {  // link() refuses a name that exists: nothing that appeared meanwhile is replaced
      if (link(staging.c_str(), path.c_str()) != 0)
        fail(path, errno == EEXIST ? "it exists now; pass --overwrite to replace an earlier output" : std::strerror(errno),
             written);
      std::remove(staging.c_str());
    } else {
      if (fs::exists(path) && !(record ? record_file(path) : own_output(path)))
        fail(path, record ? "it is now a file other than an output's record"
                          : "it is now a file other than an output of wan_stream", written);
      fs::rename(staging, path, placed);
      if (placed) fail(path, placed.message(), written);
    }
    written = (written == "nothing" ? "" : written + ", ") + path;
    staged.erase(staged.begin());
  }
}

bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ignored;
  if (fs::exists(a) && fs::exists(b)) return fs::equivalent(a, b, ignored);
  return fs::weakly_canonical(a, ignored) == fs::weakly_canonical(b, ignored);
}

// An output file that can be written (a staging file beside it is made and removed) and is none of the files
// the run reads, its other output or that output's record; an existing one only with --overwrite, and only an output
// of wan_stream (own_output: its record OUT.wan_stream gives its size and sha256).
void check_output(const std::string& flag, const std::string& path,
                  const std::vector<std::pair<std::string, std::string>>& others, bool overwrite) {
  if (path.empty()) throw wan_trt::Error(flag + ": an empty path; give a file path");
  const fs::path file(path);
  if (fs::is_directory(file)) throw wan_trt::Error(flag + " " + path + " is a folder; give a file path");
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (!fs::is_directory(folder)) throw wan_trt::Error(flag + " " + path + ": no folder " + folder.string());
  for (const auto& [other_flag, other] : others) {
    if (same_file(file, other)) throw wan_trt::Error(flag + " " + path + " is also " + other_flag);
    if (same_file(record_path(path), other))
      throw wan_trt::Error(flag + " " + path + ": its record, " + record_path(path) + ", would be " + other_flag +
                           "; give another path");
  }
  if (fs::is_symlink(file) || (fs::exists(file) && !fs::is_regular_file(file)))
    throw wan_trt::Error(flag + " " + path + " is a link or not a plain file; give another path");
  const std::string record = record_path(path);
  if (fs::is_symlink(record) || (fs::exists(record) && !fs::is_regular_file(record)))
    throw wan_trt::Error(flag + " " + path + ": " + record + " (where its record goes) is a link or not a plain file; "
                         "give another path");
  if ((fs::exists(file) || fs::exists(record)) && !overwrite)
    throw wan_trt::Error(flag + " " + path + " exists" + (fs::exists(file) ? "" : " (its record " + record + ")") +
                         "; pass --overwrite to replace an earlier output, or give another path");
  if (fs::exists(file) && !own_output(file))
    throw wan_trt::Error(flag + " " + path + " exists and is not an output of wan_stream (--overwrite replaces only "
                         "those: a file whose record " + record + " gives its size and sha256, as wan_stream writes "
                         "beside each output; an output changed since, or written by a wan_stream before records, has "
                         "none that matches); give another path, or move it away yourself");
  if (fs::exists(record) && !record_file(record))
    throw wan_trt::Error(flag + " " + path + ": " + record + " (where its record goes) exists and is not one; give "
                         "another path, or move it away yourself");
  remove_stale_staging(path);
  const std::string probe = staging_file(path);  // where the output will be staged: a folder one cannot write
  if (probe.empty())                             // into (/proc, read-only) is found now, not after every block
    throw wan_trt::Error(flag + " " + path + ": cannot be written (" + std::strerror(errno) + "); give another path");
  const std::string linked = probe + ".link";  // without --overwrite an output is placed by a hard link
  const bool links = link(probe.c_str(), linked.c_str()) == 0;
  const int why = errno;
  std::remove(linked.c_str());
  std::remove(probe.c_str());
  if (!links && !overwrite)
    throw wan_trt::Error(flag + " " + path + ": its folder takes no hard link (" + std::strerror(why) + "), which " +
                         "places an output without replacing a file that appears meanwhile; pass --overwrite (it " +
                         "replaces only outputs of wan_stream), or give a path on another file system");
}

// The device --device ``text`` names, which must be cpu, cuda or cuda:N with an N libtorch holds (judged before any
// file is read: libtorch refuses a long N with a page of backtrace, and wraps a larger one round to another device).
at::Device parse_device(const std::string& text) {
  if (!std::regex_match(text, std::regex("cpu|cuda(:[0-9]+)?")))
    throw wan_trt::Error("--device " + text + ": expected cpu, cuda or cuda:N");
  const int most = std::numeric_limits<c10::DeviceIndex>::max();
  const size_t colon = text.find(':');
  const std::string index = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (index.size() > 3 || (!index.empty() && std::stoi(index) > most))
    throw wan_trt::Error("--device " + text + ": expected cuda:N with N from 0 to " + std::to_string(most));
  return at::Device(text);
}

// The switches against --device ``text``, before any work: a CUDA graph captures CUDA work only, and the TensorRT
// runner runs on the current CUDA device (cuda:0: wan_stream selects none) without CUDA graphs, so a flag it would
// drop is refused rather than ignored.
void check_switches(const std::string& text, bool cuda_graph, bool tensorrt) {
  if (cuda_graph && text == "cpu")
    throw wan_trt::Error("--cuda-graph: CUDA graphs need --device cuda (or cuda:N), not cpu");
  if (!tensorrt) return;
  if (cuda_graph) throw wan_trt::Error("--tensorrt: the TensorRT runner captures no CUDA graphs; leave out --cuda-graph");
  if (text == "cpu")
    throw wan_trt::Error("--tensorrt: a TensorRT engine runs on a CUDA device; give --device cuda, not cpu");
  if (text != "cuda" && text != "cuda:0")
    throw wan_trt::Error("--tensorrt: the TensorRT runner runs on the current CUDA device (cuda:0); give --device "
                         "cuda, and pick the GPU with CUDA_VISIBLE_DEVICES, not --device " + text);
}

// A CUDA --device ``text`` where this libtorch has none is refused (else libtorch's "Could not run ... from the
// 'CUDA' backend", a page long).
void check_device_available(const at::Device& device, const std::string& text) {
  if (device.is_cuda() && !at::hasCUDA())
    throw wan_trt::Error("--device " + text + ": this libtorch has no CUDA device (a CPU-only build, or no GPU); use "
                         "--device cpu");
  const size_t count = device.is_cuda() ? at::getNumGPUs() : 0;
  if (device.is_cuda() && device.has_index() && static_cast<size_t>(device.index()) >= count)
    throw wan_trt::Error("--device " + text + ": no such CUDA device (this machine has " + std::to_string(count) +
                         "); pass --device cuda:0 .. cuda:" + std::to_string(count - 1));
}

// Blocks from ``first`` on that the inputs hold: cond_concat's frames and the raw action frames.
int64_t blocks_held(const wan_trt::RuntimeSpec& spec, int64_t first, const at::Tensor& cond,
                    const std::vector<at::Tensor>& actions) {
  int64_t held = cond.size(2) / spec.block_frames;
  const int64_t from = wan_trt::first_raw_frame(spec, first);
  for (const at::Tensor& raw : actions) {
    if (!raw.defined()) continue;
    int64_t k = 0;
    while (k < held && wan_trt::first_raw_frame(spec, first + k + 1) - from <= raw.size(1)) ++k;
    held = k;
  }
  return held;
}

std::unique_ptr<wan_trt::Runner> make_runner(const std::string& engine, const wan_trt::GraphIO& io, at::Device device,
                                             bool cuda_graph, bool tensorrt) {
#ifdef WAN_TRT_WITH_TENSORRT
  if (tensorrt) return wan_trt::make_tensorrt_runner(engine, io);
#endif
  if (tensorrt)
    throw wan_trt::Error("--tensorrt: this wan_stream was built without the TensorRT runner; build it with "
                         "-DWAN_TRT_WITH_TENSORRT=ON");
  return std::make_unique<wan_trt::AotiRunner>(engine, io, device, cuda_graph);
}

// "--out given twice (a.pt, b.pt): give it once", as `wan-trt` says it of an option given twice.
std::string repeated(const std::string& flag, const std::vector<std::string>& values) {
  const std::string times = values.size() == 2 ? "twice" : std::to_string(values.size()) + " times";
  return flag + " given " + times + " (" + listed(values) + "): give it once";
}

// The value flags of ``argv`` over ``defaults``; the boolean flags given go to ``switches``. An unknown flag, a
// flag without its value, and a value flag given twice (which one was meant?) are refused before any work; a
// boolean flag repeated means it once.
std::map<std::string, std::string> parse_flags(int argc, char** argv, std::map<std::string, std::string> defaults,
                                               std::set<std::string>& switches) {
  std::vector<std::pair<std::string, std::vector<std::string>>> given;  // value flags in the order first given
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (kSwitches.count(a)) {
      switches.insert(a);
      continue;
    }
    if (!kValueFlags.count(a)) throw wan_trt::Error("unknown flag " + a);
    if (i + 1 == argc) throw wan_trt::Error("missing value for " + a);
    auto it = std::find_if(given.begin(), given.end(), [&](const auto& g) { return g.first == a; });
    if (it == given.end()) it = given.emplace(given.end(), a, std::vector<std::string>{});
    it->second.push_back(argv[++i]);
  }
  for (const auto& [flag, values] : given) {
    if (values.size() > 1) throw wan_trt::Error(repeated(flag, values));
    defaults[flag] = values.front();
  }
  return defaults;
}

int run(int argc, char** argv) {
  wan_trt::prefer_workspace_free_gemms();  // before any GEMM of the process
  std::set<std::string> switches;
  auto args = parse_flags(argc, argv, {{"--blocks", "8"}, {"--seed", "0"}, {"--device", "cpu"}}, switches);
  const bool cuda_graph = switches.count("--cuda-graph"), tensorrt = switches.count("--tensorrt"),
             overwrite = switches.count("--overwrite");
  for (const char* required : {"--engine", "--inputs", "--out"})
    if (!args.count(required)) throw wan_trt::Error(std::string("missing ") + required);
  const at::Device device = parse_device(args["--device"]);
  check_switches(args["--device"], cuda_graph, tensorrt);
  if (args.count("--frames") != args.count("--decoder"))
    throw wan_trt::Error("--decoder and --frames go together: the frames of the decoder are written to --frames");
  const std::string engine = args["--engine"];
  const std::string runtime = args.count("--runtime") ? args["--runtime"] : engine + ".runtime.txt";
  const auto spec = wan_trt::RuntimeSpec::load(runtime);
  // as the runners will, but before any other work
  wan_trt::check_built_for(spec, engine, device, "--engine", "--device " + args["--device"]);
  std::optional<wan_trt::DecoderEngines> pair;  // every file is read and checked before any engine loads
  if (args.count("--decoder")) {
    pair = wan_trt::DecoderEngines::load(args["--decoder"]);
    for (const auto* io : {&pair->first_spec, &pair->steady_spec})
      wan_trt::check_built_for(*io, args["--decoder"], device, "--decoder", "--device " + args["--device"]);
  }
  check_device_available(device, args["--device"]);  // the engines' devices first: the more telling refusal
#ifdef WAN_TRT_WITH_CUDA
  if (device.is_cuda() && device.has_index()) c10::cuda::set_device(device.index());  // AOTInductor loads onto it
#endif
  const int64_t blocks = integer(args, "--blocks");
  if (blocks < 1) throw wan_trt::Error("--blocks: at least 1, got " + std::to_string(blocks));
  const int64_t seed = integer(args, "--seed");
  if (seed < 0 || seed > kMaxSeed)
    throw wan_trt::Error("--seed: 0 to " + std::to_string(kMaxSeed) + ", got " + std::to_string(seed));
  std::vector<std::pair<std::string, std::string>> read{{"--engine", engine}, {"--inputs", args["--inputs"]},
                                                        {"--runtime", runtime}};
  for (const char* flag : {"--actions", "--decoder"})
    if (args.count(flag)) read.emplace_back(flag, args[flag]);
  if (pair) read.insert(read.end(), {{"--decoder", pair->first}, {"--decoder", pair->steady}});
  check_output("--out", args["--out"], read, overwrite);
  if (pair) {
    read.emplace_back("--out", args["--out"]);
    read.emplace_back("--out's record", record_path(args["--out"]));
    check_output("--frames", args["--frames"], read, overwrite);
  }

  const StreamInputs inputs = read_inputs(args["--inputs"], spec, args.count("--actions") > 0);
  const at::Tensor &visual = inputs.visual, &cond = inputs.cond;
  at::Tensor mouse = inputs.mouse, keyboard = inputs.keyboard;
  const int64_t first = inputs.first;
  // before any block arithmetic, which would overflow; then the blocks asked, before any block runs
  wan_trt::check_within_reach(spec, "--inputs " + args["--inputs"] + ": first_block", first, 1);
  wan_trt::check_within_reach(spec, "--blocks: from first_block", first, blocks);
  if (args.count("--start-block") && integer(args, "--start-block") != first)
    throw wan_trt::Error("--start-block " + args["--start-block"] + ": the inputs hold the stream from block " +
                         std::to_string(first));
  if (args.count("--actions")) {
    auto actions = wan_trt::read_actions(args["--actions"], spec, first, blocks);
    mouse = actions.count("mouse") ? actions.at("mouse") : at::Tensor();
    keyboard = actions.count("keyboard") ? actions.at("keyboard") : at::Tensor();
  }
  const int64_t held_blocks = blocks_held(spec, first, cond, {mouse, keyboard});
  if (blocks > held_blocks)
    throw wan_trt::Error("--blocks " + std::to_string(blocks) + ": the inputs hold " + std::to_string(held_blocks) +
                         " block(s)");
  const int64_t f = spec.block_frames;
  const int64_t held_from = wan_trt::first_raw_frame(spec, first);  // first raw frame the inputs hold

  auto runner = make_runner(engine, spec, device, cuda_graph, tensorrt);
  std::unique_ptr<wan_trt::Runner> first_runner, steady_runner;
  std::unique_ptr<wan_trt::DecoderStream> decoder;
  if (pair) {
    first_runner = make_runner(pair->first, pair->first_spec, device, cuda_graph, tensorrt);
    steady_runner = make_runner(pair->steady, pair->steady_spec, device, cuda_graph, tensorrt);
    decoder = std::make_unique<wan_trt::DecoderStream>(*first_runner, pair->first_spec, *steady_runner,
                                                       pair->steady_spec);
  }
  wan_trt::StreamingSession session(*runner, spec, seed, decoder.get());
  session.start(visual, first);  // the session checks, then converts to its device and dtype
  std::vector<at::Tensor> latents, frames;
  for (int64_t b = first; b < first + blocks; ++b) {
    // this block's new raw frames, as a live client would send them
    const int64_t begin = wan_trt::first_raw_frame(spec, b), n = wan_trt::first_raw_frame(spec, b + 1) - begin;
    auto cut = [&](const at::Tensor& h) { return h.defined() ? h.narrow(1, begin - held_from, n) : at::Tensor(); };
    wan_trt::Block block =
        session.step(cond.narrow(2, (b - first) * f, f), cut(mouse), cut(keyboard));
    latents.push_back(block.latents.to(at::kCPU));
    if (block.frames.defined()) frames.push_back(block.frames.to(at::kCPU));
    std::cout << "block " << b << ": " << block.ms << " ms (";
    for (size_t i = 0; i < block.stage_ms.size(); ++i)
      std::cout << (i ? ", " : "") << block.stage_ms[i].first << " " << block.stage_ms[i].second;
    std::cout << ")\n";
  }
  std::vector<std::pair<at::Tensor, std::string>> outputs{{at::cat(latents, 2), args["--out"]}};
  if (decoder) outputs.emplace_back(at::cat(frames), args["--frames"]);
  save_all(outputs, overwrite);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const wan_trt::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // from libtorch or AOTInductor: not the input's fault
    std::cerr << "internal error: " << e.what() << "\n";
    return 2;
  }
}
