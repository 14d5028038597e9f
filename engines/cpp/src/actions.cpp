// Actions from a JSON-lines file, the format of wan_trt/actions.py: one line per block, a JSON object
// with one key per action input ("mouse", "keyboard"), each one action held for the block (D numbers)
// or one row per video frame (n rows of D). Lines end at '\n' (a '\r' before it dropped); a line of JSON
// whitespace only is blank and skipped; lines past the blocks asked for are not parsed. A number, integer or not,
// is read as the double nearest it (with a point, whatever locale the program set: nearest_double), which must lie
// within +-torch.finfo(dtype).max of the stream's dtype (the engine's: fp16 holds up to 65504; the rule of
// wan_trt/actions.py), so that no block is refused after the blocks before it ran. A file is refused where the
// Python reader refuses it, with the same messages but for the parser's own wording of a line that is not JSON.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <locale>
#include <memory>
#include <set>
#include <sstream>
#include <system_error>

#include "wan_trt/runtime.h"

namespace wan_trt {
namespace {

// The double nearest ``text``, a number of JSON's grammar (+-inf past the range of doubles, +-0 below it), whatever
// locale the program set (strtod follows the process's: under a comma-decimal one it read 0.3 as 0), in standard C++:
// from_chars where the standard library has it for doubles, else a stream in the classic locale.
double nearest_double(const std::string& text) {
  double value = 0;
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
  const auto read = std::from_chars(text.data(), text.data() + text.size(), value);
  if (read.ec == std::errc() && read.ptr == text.data() + text.size()) return value;
#else
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  if ((in >> value) && in.peek() == std::char_traits<char>::eof() && std::isfinite(value)) return value;
#endif
  // out of range (neither reader says which end): the power of ten of its first non-zero digit says it
  const size_t e = std::min(text.find_first_of("eE"), text.size()), first = text.find_first_of("123456789");
  const double sign = text[0] == '-' ? -1.0 : 1.0;
  if (first >= e) return sign * 0.0;
  int64_t power = 0;  // the exponent's, held within +-1e9: a range error needs one past +-300 only
  for (size_t i = e + 1; i < text.size(); ++i)
    if (std::isdigit(static_cast<unsigned char>(text[i]))) power = std::min<int64_t>(power * 10 + (text[i] - '0'), 1e9);
  if (e + 1 < text.size() && text[e + 1] == '-') power = -power;
  const int64_t point = static_cast<int64_t>(std::min(text.find('.'), e)), at = static_cast<int64_t>(first);
  power += at < point ? point - at - 1 : point - at;
  return sign * (power > 0 ? std::numeric_limits<double>::infinity() : 0.0);
}

// The JSON this format needs: objects, arrays, numbers; strings only as keys; true/false/null are
// read (and refused where a number is expected).
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;
  std::string repeated;  // an object's first repeated key (refused by the reader, as in wan_trt.actions)
};

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  Json document() {
    Json v = value();
    space();
    if (i_ != s_.size()) fail("Extra data");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) { throw Error(what + " at column " + std::to_string(i_ + 1)); }

  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\r' || s_[i_] == '\n')) ++i_;
  }

  bool take(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }

  Json value() {
    if (++depth_ > kMaxDepth) fail("Nested too deeply");
    Json v = any();
    --depth_;
    return v;
  }

  Json any() {
    space();
    if (i_ >= s_.size()) fail("Expecting value");
    const char c = s_[i_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') {
      Json v;
      v.kind = Json::kString;
      v.text = string();
      return v;
    }
    for (const auto& [word, kind] : {std::make_pair("true", Json::kBool), std::make_pair("false", Json::kBool),
                                     std::make_pair("null", Json::kNull)})
      if (s_.compare(i_, std::string(word).size(), word) == 0) {
        i_ += std::string(word).size();
        Json v;
        v.kind = kind;
        return v;
      }
    return number();
  }

  Json object() {
    ++i_;  // '{'
    Json v;
    v.kind = Json::kObject;
    if (take('}')) return v;
    do {
      space();
      if (i_ >= s_.size() || s_[i_] != '"') fail("Expecting property name enclosed in double quotes");
      std::string key = string();
      if (!take(':')) fail("Expecting ':' delimiter");
      Json item = value();
      auto same = std::find_if(v.fields.begin(), v.fields.end(), [&](const auto& f) { return f.first == key; });
      if (same == v.fields.end()) v.fields.emplace_back(key, std::move(item));
      else if (v.repeated.empty()) v.repeated = key;
    } while (take(','));
    if (!take('}')) fail("Expecting ',' delimiter");
    return v;
  }

  Json array() {
    ++i_;  // '['
    Json v;
    v.kind = Json::kArray;
    if (take(']')) return v;
    do v.items.push_back(value());
    while (take(','));
    if (!take(']')) fail("Expecting ',' delimiter");
    return v;
  }

  std::string string() {
    ++i_;  // '"'
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        if (++i_ >= s_.size()) break;
        const char e = s_[i_];
        if (e == 'u') {
          unicode(out);
          continue;
        }
        const std::string plain = "\"\\/bfnrt", meant = "\"\\/\b\f\n\r\t";
        const size_t at = plain.find(e);
        if (at == std::string::npos) fail("Invalid \\escape");
        out += meant[at];
      } else {
        out += s_[i_];
      }
      ++i_;
    }
    if (i_ >= s_.size()) fail("Unterminated string");
    ++i_;
    return out;
  }

  // \uXXXX (i_ at the 'u'), appended as UTF-8; surrogate pairs are not needed for action names.
  void unicode(std::string& out) {
    if (i_ + 4 >= s_.size()) fail("Invalid \\uXXXX escape");
    unsigned code = 0;
    for (int n = 1; n <= 4; ++n) {
      const char h = s_[i_ + n];
      if (!std::isxdigit(static_cast<unsigned char>(h))) fail("Invalid \\uXXXX escape");
      code = code * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 32) - 'a' + 10);
    }
    i_ += 5;
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  Json number() {
    // JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const size_t begin = i_;
    auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      return i_ > from;
    };
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0') ++i_;
    else if (!digits()) fail("Expecting value");
    if (i_ < s_.size() && s_[i_] == '.' && (++i_, !digits())) fail("Expecting value");
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) fail("Expecting value");
    }
    Json v;
    v.kind = Json::kNumber;
    v.number = nearest_double(s_.substr(begin, i_ - begin));
    return v;
  }

  static constexpr int kMaxDepth = 64;  // far deeper than the format's 3 levels, far shallower than the stack
  const std::string& s_;
  size_t i_ = 0;
  int depth_ = 0;
};

// A number whose double is finite and within +-limit (the rule at the top of this file).
bool is_number(const Json& v, double limit) {
  return v.kind == Json::kNumber && std::isfinite(v.number) && std::abs(v.number) <= limit;
}

bool is_row(const Json& v, int64_t dim, double limit) {
  if (v.kind != Json::kArray || static_cast<int64_t>(v.items.size()) != dim) return false;
  for (const auto& x : v.items)
    if (!is_number(x, limit)) return false;
  return true;
}

// One held action (dim numbers) or n rows of dim numbers, as fp32 [n, dim]; |values| <= limit.
at::Tensor rows(const Json& v, int64_t n, int64_t dim, const std::string& where, double limit) {
  bool per_frame = v.kind == Json::kArray && static_cast<int64_t>(v.items.size()) == n;
  for (size_t i = 0; per_frame && i < v.items.size(); ++i) per_frame = is_row(v.items[i], dim, limit);
  const bool held = is_row(v, dim, limit);
  if (!held && !per_frame)
    throw Error(where + ": expected " + std::to_string(dim) + " finite numbers (held for the block) or " +
                std::to_string(n) + " rows of " + std::to_string(dim) + " (one per video frame), each within +-" +
                number_6g(limit) + " (the stream's precision)");
  at::Tensor out = at::empty({n, dim}, at::kFloat);
  float* p = out.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < dim; ++d)
      p[r * dim + d] = static_cast<float>((held ? v.items[d] : v.items[r].items[d]).number);
  return out;
}

}  // namespace

double dtype_max(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return static_cast<float>(std::numeric_limits<c10::Half>::max());
    case at::kBFloat16: return static_cast<float>(std::numeric_limits<c10::BFloat16>::max());
    case at::kFloat: return std::numeric_limits<float>::max();
    default:
      throw Error(std::string("runtime file: latents of dtype ") + c10::toString(dtype) +
                  "; expected float16, bfloat16 or float32 (rebuild the engine with `wan-trt build`)");
  }
}

std::string number_6g(double x) {
  std::ostringstream text;
  text.imbue(std::locale::classic());
  text << std::setprecision(6) << x;
  return text.str();
}

void check_input_file(const std::string& path, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) throw Error(flag + " " + path + ": no such file");
  if (!fs::is_regular_file(status))  // as wan_trt.outputs.check_input_file says it
    throw Error(flag + " " + path + ": " +
                (fs::is_directory(status) ? "a folder" : fs::is_fifo(status) ? "a pipe" : "not a regular file") +
                ", where a file is read; write it to a file first");
}

std::string read_bytes(const std::string& path, const std::string& what, size_t n) {
  errno = 0;  // stdio: it tells a read error from the end of the file
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  std::string bytes;
  std::vector<char> chunk(std::min<size_t>(n, 1 << 20));
  for (size_t got = chunk.size(); file && got == chunk.size() && bytes.size() < n;) {
    got = std::fread(chunk.data(), 1, std::min(chunk.size(), n - bytes.size()), file.get());
    bytes.append(chunk.data(), got);
  }
  if (!file || std::ferror(file.get()))
    throw Error((what.empty() ? "" : what + " ") + path + ": cannot be read (" + std::strerror(errno ? errno : EIO) +
                ")");
  return bytes;
}

std::map<std::string, at::Tensor> read_actions(const std::string& path, const RuntimeSpec& spec,
                                               int64_t first_block, int64_t blocks) {
  check_within_reach(spec, "--actions " + path + ": first_block", first_block, blocks);
  const double limit = dtype_max(spec.dtype());  // the stream's: the session converts the actions to it
  std::map<std::string, int64_t> dims;  // the action inputs the config has, by name
  for (const std::string name : {"keyboard", "mouse"})
    if (spec.has_input(name + "_window")) dims[name] = spec.input(name + "_window").shape.back();
  if (dims.empty())  // nothing of the file would reach the model
    throw Error("--actions " + path + ": the config " + spec.config + " has no action inputs (no mouse, no keyboard); "
                "drop --actions");
  check_input_file(path, "--actions");
  const std::string text = read_bytes(path, "--actions");
  std::vector<std::pair<int64_t, std::string>> lines;  // (line number, text) of the non-blank lines
  for (size_t begin = 0, number = 1; begin < text.size(); ++number) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    std::string line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t\r") != std::string::npos)  // JSON's spaces
      lines.emplace_back(static_cast<int64_t>(number), line);
    begin = end + 1;
  }
  if (lines.empty())
    throw Error("--actions " + path + ": no block lines (an empty or blank file); write one line per block");
  if (static_cast<int64_t>(lines.size()) < blocks)
    throw Error("--actions " + path + ": " + std::to_string(lines.size()) + " block line(s), " +
                std::to_string(blocks) + " block(s) asked; add lines or pass --blocks " + std::to_string(lines.size()));
  std::string expected = "[";
  for (const auto& [name, dim] : dims) expected += (expected.size() > 1 ? ", '" : "'") + name + "'";
  expected += "]";
  std::map<std::string, std::vector<at::Tensor>> frames;
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t block = first_block + k;
    const std::string where = "--actions " + path + ", line " + std::to_string(lines[k].first) + " (block " +
                              std::to_string(block) + ")";
    Json entry;
    try {
      entry = Parser(lines[k].second).document();
    } catch (const Error& e) {
      if (lines[k].second.rfind("\xEF\xBB\xBF", 0) == 0)  // 'Expecting value at column 1' of a line that looks right
        throw Error(where + ": not JSON (it begins with a UTF-8 byte-order mark, which some editors write); save the "
                            "file as UTF-8 without one");
      throw Error(where + ": not JSON (" + e.what() + ")");
    }
    if (entry.kind == Json::kObject && !entry.repeated.empty())
      throw Error(where + ": key '" + entry.repeated + "' given twice; give each action once");
    std::set<std::string> keys;
    for (const auto& [key, value] : entry.fields) keys.insert(key);
    std::set<std::string> want;
    for (const auto& [name, dim] : dims) want.insert(name);
    if (entry.kind != Json::kObject || keys != want) {
      std::string got = entry.kind == Json::kObject ? "[" : entry.kind == Json::kArray ? "list" : "a JSON scalar";
      for (const auto& key : keys) got += (got.size() > 1 ? ", '" : "'") + key + "'";
      throw Error(where + ": expected an object with keys " + expected + " (" + spec.config + "), got " +
                  (entry.kind == Json::kObject ? got + "]" : got));
    }
    const int64_t n = raw_frames_in_block(spec, block);
    for (const auto& [key, value] : entry.fields)
      frames[key].push_back(rows(value, n, dims.at(key), where + ", " + key, limit));
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, list] : frames) out[name] = at::cat(list).unsqueeze(0);
  return out;
}

}  // namespace wan_trt
