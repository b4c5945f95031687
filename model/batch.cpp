// check_batch: the one validator of a step's rows, shared by every backend (model/backend.h).
#include "model/backend.h"
#include "model/error.h"

namespace parity {

std::map<int, SequenceStep> check_batch(const Batch& b, const Config& c, int max_positions,
                                        const std::function<int(int)>& cached_length) {
  if (b.positions.size() != b.tokens.size() || b.seqs.size() != b.tokens.size())
    fail("batch: tokens, positions and seqs differ in length");
  if (b.rows() == 0) fail("batch: no tokens");
  std::map<int, SequenceStep> steps;
  for (int r = 0; r < b.rows(); ++r) {
    const int tok = b.tokens[size_t(r)], pos = b.positions[size_t(r)], seq = b.seqs[size_t(r)];
    if (tok < 0 || tok >= c.vocab_size)
      fail("token id {} out of range: the model's vocabulary has {} entries (0..{})", tok,
           c.vocab_size, c.vocab_size - 1);
    if (pos < 0 || pos >= c.max_position_embeddings)
      fail("position {} out of range: the model's context is {} positions (0..{})", pos,
           c.max_position_embeddings, c.max_position_embeddings - 1);
    if (pos >= max_positions)
      fail(
          "position {} is past the device KV cache of {} positions (HINT: set "
          "PARITY_DEVICE_MAX_CONTEXT, up to the model's {})",
          pos, max_positions, c.max_position_embeddings);
    auto it = steps.find(seq);
    if (it == steps.end()) {
      const int cached = cached_length(seq);
      if (pos > cached)
        fail(
            "sequence {}: position {} does not follow position {} (positions must be "
            "contiguous from 0)",
            seq, pos, cached - 1);
      steps[seq] = {pos, pos + 1};
    } else {
      if (pos != it->second.end)
        fail(
            "sequence {}: position {} does not follow position {} (positions must be "
            "contiguous from 0)",
            seq, pos, it->second.end - 1);
      it->second.end = pos + 1;
    }
  }
  return steps;
}

void Backend::load_cache(int, int, const KvRows&) {
  fail("backend {} cannot take another backend's KV cache rows", name());
}

}  // namespace parity
