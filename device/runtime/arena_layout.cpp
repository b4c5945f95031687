#include "device/runtime/arena_layout.h"

#include <algorithm>

#include "device/kernel_types.h"
#include "model/backend.h"
#include "model/error.h"

namespace parity::device {

size_t stage_row_floats(const Config& c, Stage s) {
  PARITY_CHECK(info(s).shape != Shape::keys, "stage {} has rows that grow with the position",
               name(s));
  size_t n = 1;
  for (size_t d : stage_dims(c, s, 0)) n *= d;
  return n;
}

ArenaLayout ArenaLayout::of(const Config& c, int rows, int max_context) {
  PARITY_CHECK(rows > 0 && max_context > 0, "activation arena for {} rows, context {}", rows,
               max_context);
  ArenaLayout a;
  a.rows = rows;
  a.max_context = max_context;
  size_t bytes = 0;
  for (const auto& s : kStages) {
    if (s.shape == Shape::keys) continue;
    a.stage_offset[size_t(s.stage)] = bytes;
    bytes += (size_t(rows) * stage_row_floats(c, s.stage) * sizeof(float) + 255) / 256 * 256;
  }
  a.moe_routing_offset = bytes;
  a.moe_routing_ints =
      size_t(rows) * size_t(c.num_experts_per_tok) + 2 * (size_t(c.num_local_experts) + 2);
  bytes += (a.moe_routing_ints * sizeof(int32_t) + 255) / 256 * 256;
  a.router_tickets_offset = bytes;
  a.router_tickets = size_t(rows);
  bytes += (a.router_tickets * sizeof(int32_t) + 255) / 256 * 256;
  a.sampled_rows_offset = bytes;
  bytes += (size_t(rows) * size_t(c.hidden_size) * sizeof(float) + 255) / 256 * 256;
  // The MMA kernels' inputs split into BF16 parts (split_bf16x3_words: 3/2 words per float):
  // qkv, mlp1 and lm_head read rows x hidden floats, o_proj rows x heads x head_dim; mlp2, in its
  // own scratch, rows x k x intermediate.
  a.split_offset = bytes;
  a.split_words =
      size_t(rows) *
      std::max(size_t(c.hidden_size), size_t(c.num_attention_heads) * size_t(c.head_dim)) * 3 / 2;
  bytes += (a.split_words * sizeof(uint32_t) + 255) / 256 * 256;
  a.expert_split_offset = bytes;
  a.expert_split_words =
      size_t(rows) * size_t(c.num_experts_per_tok) * size_t(c.intermediate_size) * 3 / 2;
  bytes += (a.expert_split_words * sizeof(uint32_t) + 255) / 256 * 256;
  a.workspace_offset = bytes;
  AttentionShape shape;
  shape.n_heads = c.num_attention_heads;
  shape.n_kv = c.num_key_value_heads;
  shape.head_dim = c.head_dim;
  shape.max_context = max_context;
  a.workspace_floats = attention_workspace_floats(shape, rows);
  a.bytes = bytes + a.workspace_floats * sizeof(float);
  return a;
}

}  // namespace parity::device
