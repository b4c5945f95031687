// The checks of a capture against the model it is judged on (tracer/capture_check.h).
#include "tracer/capture_check.h"

#include <nlohmann/json.hpp>

#include "model/error.h"
#include "model/untrusted.h"

namespace parity {

CaptureCheck check_capture(const TraceReader& capture, const Model& m,
                           const std::vector<int32_t>* tokens_flag) {
  const std::string& capture_path = capture.path();
  const TraceMeta& cm = capture.meta();
  const Config& c = m.config;
  // The capture must be of this model: its config, its checkpoint, positions 0..n-1.
  const nlohmann::json want = c.to_json(), got = capture.config().to_json();
  if (want != got) {
    std::string what = "config differs";
    for (const auto& [k, v] : want.items())
      if (!got.contains(k) || got[k] != v) {
        what = fmt::format("config field {}: {} in the capture, {} in {}", k,
                           got.contains(k) ? json_excerpt(got[k]) : "(absent)", json_excerpt(v),
                           m.dir);
        break;
      }
    fail("{}: a capture of another model than {} ({})", capture_path, m.dir, what);
  }
  if (!cm.fingerprint.empty() && cm.fingerprint != m.fingerprint)
    fail("{}: a capture of another checkpoint (fingerprint {}) than {} ({})", capture_path,
         quoted(cm.fingerprint), m.dir, m.fingerprint);
  const std::vector<int32_t>& tokens = cm.tokens;
  if (tokens.empty())
    fail("{}: the capture records no tokens (attribute \"tokens\" of /)", capture_path);
  if (!cm.positions.empty()) {
    if (cm.positions.size() != tokens.size())
      fail("{}: {} positions for {} tokens", capture_path, cm.positions.size(), tokens.size());
    for (size_t i = 0; i < cm.positions.size(); ++i)
      if (cm.positions[i] != int32_t(i))
        fail("{}: token {} is at position {}; a capture holds positions 0, 1, ... in order",
             capture_path, i, cm.positions[i]);
  }
  if (int64_t(tokens.size()) > c.max_position_embeddings)
    fail("{}: {} tokens, past the context of {} ({} positions)", capture_path, tokens.size(), m.dir,
         c.max_position_embeddings);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("{}: token id {} at position {} is out of range for {} (vocabulary 0..{})", capture_path,
           tokens[i], i, m.dir, c.vocab_size - 1);
  if (tokens_flag != nullptr && *tokens_flag != tokens) {
    size_t i = 0;
    while (i < tokens_flag->size() && i < tokens.size() && (*tokens_flag)[i] == tokens[i]) ++i;
    fail("{}: captured on other tokens than --tokens (position {}: {} in the capture, {} given)",
         capture_path, i, i < tokens.size() ? std::to_string(tokens[i]) : "none",
         i < tokens_flag->size() ? std::to_string((*tokens_flag)[i]) : "none");
  }
  CaptureCheck check;
  check.cached = capture.cache_length();
  if (size_t(check.cached) > tokens.size())
    fail("{}: KV-cache rows of {} positions, but the capture has {} tokens", capture_path,
         check.cached, tokens.size());
  for (const auto& e : capture.entries()) {
    if (size_t(e.key.position) >= tokens.size())
      fail("{}: {} is at position {}, but the capture has {} tokens", capture_path, e.path,
           e.key.position, tokens.size());
    if (e.key.position < check.cached)
      fail(
          "{}: {} lies inside the capture's KV-cache prefix (positions 0..{}): a position has "
          "stage rows or cache rows, not both",
          capture_path, e.path, check.cached - 1);
    check.positions.insert(e.key.position);
  }
  if (check.positions.empty())
    fail("{}: the capture holds no stage rows; nothing to compare", capture_path);
  return check;
}

}  // namespace parity
