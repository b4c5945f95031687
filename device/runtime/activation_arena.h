// Step-sized activation buffers: every stage's output for `rows` rows (ArenaLayout) and the
// packed scores/att rows, in two allocations. Grown only between steps (reserve(), called when
// a step begins) for the largest step seen, never inside one; nothing is allocated per step.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "device/hip_compat.h"
#include "device/kernels.h"
#include "device/runtime/arena_layout.h"
#include "device/runtime/device_buffer.h"

namespace parity::device {

class ActivationArena {
 public:
  // Sized for `rows` rows and `scores_floats` scores/att elements; a later reserve() grows it
  // up to max_rows rows (0: no limit).
  ActivationArena(const Config& c, int max_context, int rows, int64_t scores_floats, int max_rows);

  // Makes room for a step of `rows` rows and `scores_floats` scores/att elements: at least
  // doubles what it outgrows, after waiting for `stream` (the old buffers may be in use).
  // Throws when rows exceeds max_rows. Returns whether the buffers moved.
  bool reserve(int rows, int64_t scores_floats, hipStream_t stream);

  float* out(Stage s) const { return act_.as<float>(layout_.stage_offset[size_t(s)]); }
  // Index stages (topk_idx, sampled) keep int32 rows in their slot.
  int32_t* index_out(Stage s) const { return act_.as<int32_t>(layout_.stage_offset[size_t(s)]); }
  float* workspace() const { return act_.as<float>(layout_.workspace_offset); }
  std::span<float> attention_workspace() const { return {workspace(), layout_.workspace_floats}; }
  // Scratch of the MMA kernels (a projection's inputs split into BF16 parts), sized for rows()
  // rows: split_inputs() for every input but mlp2's (swiglu), which has split_expert_inputs().
  std::span<uint32_t> split_inputs() const {
    return {act_.as<uint32_t>(layout_.split_offset), layout_.split_words};
  }
  std::span<uint32_t> split_expert_inputs() const {
    return {act_.as<uint32_t>(layout_.expert_split_offset), layout_.expert_split_words};
  }
  // The split scratch of stage s's output.
  std::span<uint32_t> split_of(Stage s) const {
    return split_scratch_of(s) == 1 ? split_expert_inputs() : split_inputs();
  }
  // launch_f32_moe_linear's workspace reading stage `in`'s output: the routing scratch (the pairs
  // sorted by expert) and in's split scratch.
  MoeWorkspace moe_workspace(Stage in) const {
    MoeWorkspace ws;
    ws.routing = {act_.as<int32_t>(layout_.moe_routing_offset), layout_.moe_routing_ints};
    ws.split = split_of(in);
    return ws;
  }
  // launch_f32_router's tickets (zero between its launches).
  std::span<int32_t> router_tickets() const {
    return {act_.as<int32_t>(layout_.router_tickets_offset), layout_.router_tickets};
  }
  // The epilogue's input over a subset of the rows: the sampled rows of resid_ffn, gathered.
  float* sampled_rows() const { return act_.as<float>(layout_.sampled_rows_offset); }
  float* scores() const { return scores_.as<float>(); }
  float* att() const { return scores_.as<float>() + scores_capacity_; }

  int rows() const { return layout_.rows; }
  int64_t scores_capacity() const { return scores_capacity_; }
  size_t bytes() const { return act_.bytes() + scores_.bytes(); }

 private:
  void allocate_rows(int rows);
  void allocate_scores(int64_t floats);

  const Config& c_;
  int max_context_ = 0;
  int max_rows_ = 0;
  ArenaLayout layout_;
  DeviceBuffer act_;
  int64_t scores_capacity_ = 0;
  DeviceBuffer scores_;  // scores then att, scores_capacity_ floats each
};

}  // namespace parity::device
