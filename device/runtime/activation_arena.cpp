#include "device/runtime/activation_arena.h"

#include <algorithm>

#include "model/error.h"

namespace parity::device {

ActivationArena::ActivationArena(const Config& c, int max_context, int rows, int64_t scores_floats,
                                 int max_rows)
    : c_(c), max_context_(max_context), max_rows_(max_rows) {
  allocate_rows(rows);
  allocate_scores(scores_floats);
}

void ActivationArena::allocate_rows(int rows) {
  layout_ = ArenaLayout::of(c_, rows, max_context_);
  act_.allocate(layout_.bytes);
  const std::span<int32_t> tickets = router_tickets();
  HIP_CHECK(hipMemset(tickets.data(), 0, tickets.size_bytes()));
  HIP_CHECK(hipDeviceSynchronize());  // zero before any stream's kernel reads them
}

void ActivationArena::allocate_scores(int64_t floats) {
  scores_.allocate(scores_bytes(floats));
  scores_capacity_ = floats;
}

bool ActivationArena::reserve(int rows, int64_t scores_floats, hipStream_t stream) {
  if (max_rows_ > 0 && rows > max_rows_)
    fail("activation arena: a step of {} rows exceeds the limit of {} rows per step", rows,
         max_rows_);
  const bool grow_rows = rows > layout_.rows;
  const bool grow_scores = scores_floats > scores_capacity_;
  if (!grow_rows && !grow_scores) return false;
  HIP_CHECK(hipStreamSynchronize(stream));  // the old buffers may still be in use
  if (grow_rows) {
    int cap = std::max(rows, 2 * layout_.rows);
    if (max_rows_ > 0) cap = std::min(cap, max_rows_);
    allocate_rows(cap);
  }
  if (grow_scores) {
    int64_t floats = std::max(scores_floats, 2 * scores_capacity_);
    // Doubling stops at the largest step's need (every row at the end of the context), the size
    // the serving limits set aside for it (device/runtime/serving_limits.h).
    if (max_rows_ > 0)
      floats =
          std::min(floats, std::max(scores_floats, int64_t(max_rows_) * c_.num_attention_heads *
                                                       (int64_t(max_context_) + 1)));
    allocate_scores(floats);
  }
  return true;
}

}  // namespace parity::device
