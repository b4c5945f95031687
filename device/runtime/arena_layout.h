// Where each stage's output lives in the activation arena, for a given number of rows per step
// (host arithmetic, no GPU toolkit needed; device/runtime/activation_arena.h allocates it).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "model/config.h"
#include "model/stages.h"

namespace parity::device {

// Floats per row of a stage's output (every stage but scores/att, whose rows grow with pos).
size_t stage_row_floats(const Config& c, Stage s);

// One allocation: every stage's output for `rows` rows at its offset (256-byte aligned; index
// stages keep int32 rows in their slot), the MoE routing and the two split-input workspaces, then
// the attention output's split workspace. The scores/att rows, whose size depends on the positions,
// are a second buffer (scores_bytes).
struct ArenaLayout {
  int rows = 0;
  int max_context = 0;
  std::array<size_t, kNumStages> stage_offset{};  // bytes; unused for scores/att
  // int32 scratch of launch_f32_moe_linear: rows k pairs sorted by expert, plus 2 (experts + 2)
  // offsets (moe_routing_ints in device/kernels.h).
  size_t moe_routing_offset = 0;
  size_t moe_routing_ints = 0;
  // int32 tickets of launch_f32_router (router_tickets in device/kernels.h: at most one per row),
  // zero when allocated; the kernel leaves them zero.
  size_t router_tickets_offset = 0;
  size_t router_tickets = 0;
  // float scratch of the epilogue over a subset of the rows (launch_sampled_stage): the sampled
  // rows of resid_ffn, gathered (rows x hidden).
  size_t sampled_rows_offset = 0;
  // uint32 scratch of the MMA kernels: a projection's inputs split into BF16 parts
  // (split_bf16x3_words in device/kernels.h), for the largest row-sized input of a step (qkv,
  // o_proj, mlp1, lm_head), and apart from it for mlp2's (rows x k x intermediate), which mlp1's
  // epilogue writes while mlp1 reads its own input's split.
  size_t split_offset = 0;
  size_t split_words = 0;
  size_t expert_split_offset = 0;
  size_t expert_split_words = 0;
  // float scratch of the attention kernels (attention_workspace_floats in device/kernel_types.h).
  size_t workspace_offset = 0;
  size_t workspace_floats = 0;
  size_t bytes = 0;

  static ArenaLayout of(const Config& c, int rows, int max_context);
};

// Which of the two split-input scratches holds stage s's output split: 1 (expert_split_*) for
// mlp2's input, swiglu; 0 (split_*) for every other.
inline int split_scratch_of(Stage s) {
  return s == Stage::swiglu ? 1 : 0;
}

// Bytes of the packed scores and att buffers for `floats` elements each.
inline size_t scores_bytes(int64_t floats) {
  return 2 * size_t(floats) * sizeof(float);
}
// Scores/att floats for one row at the last position of the context: what the arena is first
// sized for.
inline int64_t scores_floats_for_one_row(const Config& c, int max_context) {
  return int64_t(c.num_attention_heads) * (int64_t(max_context) + 1);
}

}  // namespace parity::device
