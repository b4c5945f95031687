#include "engine/step_message.h"

#include "engine/byte_message.h"
#include "model/error.h"

namespace parity {

std::string encode_step_message(const StepMessage& m) {
  ByteWriter w;
  w.put(uint8_t(m.kind));
  switch (m.kind) {
    case StepMessage::Kind::step:
      w.put_vector(m.batch.tokens).put_vector(m.batch.positions).put_vector(m.batch.seqs);
      w.put_vector(m.samples);
      w.put(m.sampling.temperature).put(int32_t(m.sampling.top_k)).put(m.sampling.top_p);
      w.put(m.sampling.seed);
      break;
    case StepMessage::Kind::release:
      w.put(int32_t(m.seq));
      break;
    case StepMessage::Kind::reset:
    case StepMessage::Kind::stop:
      break;
  }
  return w.bytes();
}

StepMessage decode_step_message(std::string_view bytes) {
  ByteReader r(bytes);
  StepMessage m;
  const uint8_t kind = r.get<uint8_t>();
  PARITY_CHECK(kind >= 1 && kind <= 4, "step message: kind {}", kind);
  m.kind = StepMessage::Kind(kind);
  if (m.kind == StepMessage::Kind::step) {
    m.batch.tokens = r.get_vector<int32_t>();
    m.batch.positions = r.get_vector<int32_t>();
    m.batch.seqs = r.get_vector<int32_t>();
    PARITY_CHECK(m.batch.positions.size() == m.batch.tokens.size() &&
                     m.batch.seqs.size() == m.batch.tokens.size(),
                 "step message: {} tokens, {} positions, {} sequences", m.batch.tokens.size(),
                 m.batch.positions.size(), m.batch.seqs.size());
    m.samples = r.get_vector<RowSample>();
    for (const RowSample& s : m.samples)
      PARITY_CHECK(s.row >= 0 && s.row < m.batch.rows(), "step message: a sample of row {} of {}",
                   s.row, m.batch.rows());
    m.sampling.temperature = r.get<double>();
    m.sampling.top_k = r.get<int32_t>();
    m.sampling.top_p = r.get<double>();
    m.sampling.seed = r.get<uint64_t>();
    m.sampling.validate();
  } else if (m.kind == StepMessage::Kind::release) {
    m.seq = r.get<int32_t>();
    PARITY_CHECK(m.seq >= 0, "step message: release of sequence {}", m.seq);
  }
  PARITY_CHECK(r.done(), "step message: bytes left over");
  return m;
}

}  // namespace parity
