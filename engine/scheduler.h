// Continuous batching, the book-keeping half (engine/engine.h runs the steps): a waiting queue
// of requests, at most max_batch running sequences, and a plan per step.
//
// A running sequence holds one backend sequence id (a slot, 0..max_batch-1) from admission to
// retirement; a retired slot is handed to the next waiting request at once, whose first row at
// position 0 truncates the slot's old KV cache (model/backend.h check_batch), so nothing else
// needs releasing. Each step, every sequence that is decoding gets its one row first, then the
// sequences still prefilling get chunks of their prompts, in admission order, while the step's
// token budget lasts (several sequences can prefill in one step). A sequence whose rows in the
// step reach the end of its tokens is sampled from its last row.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "model/backend.h"

namespace parity {

struct SchedulerLimits {
  int max_batch = 16;     // running sequences at most
  int step_tokens = 256;  // rows per step at most (raised to max_batch: every decode row fits)

  // Each running sequence holds a slot (the scheduler's, the engine's, a row of the device's step
  // arena and at least one KV-cache block) from the start, so the bound is checked before any is
  // allocated: 2^31 - 1 slots would ask for over 100 GB at once. 65,536 sequences is far beyond
  // what any cache holds; a step of 2^24 rows is a whole context of the largest model (a
  // ConfigLimits::kMaxContext).
  static constexpr int kMaxBatch = 1 << 16;
  static constexpr int kMaxStepTokens = 1 << 24;
  // Throws parity::Error naming the option (--max-batch, --step-tokens) and the bound.
  void validate() const;
};

struct ScheduledSequence {
  size_t request = 0;           // index of the request in the engine's list
  int slot = 0;                 // backend sequence id
  std::vector<TokenId> tokens;  // the prompt, then what was generated
  size_t prompt_length = 0;
  size_t cached = 0;  // positions run so far (the backend's cached length)
};

// One step: the rows, and for each sequence sampled after it, its slot and its row.
struct StepPlan {
  Batch batch;
  struct Sample {
    int slot;
    int row;
  };
  std::vector<Sample> samples;
  int prefill_rows = 0, decode_rows = 0;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerLimits& limits);

  // Queues request `request` with its prompt (not empty).
  void enqueue(size_t request, std::vector<TokenId> prompt);
  // Moves waiting requests into free slots, first come first served, while `fits` (when given)
  // accepts the next one; returns the slots filled.
  std::vector<int> admit(const std::function<bool(const ScheduledSequence&)>& fits = {});
  // The next step's rows; empty when nothing runs. Marks the planned rows as cached.
  StepPlan plan();
  // A token sampled for the sequence in `slot`: it becomes the next row of that sequence.
  void append(int slot, TokenId token);
  // Frees `slot`.
  void retire(int slot);

  ScheduledSequence& sequence(int slot);
  bool idle() const { return waiting_.empty() && running_.empty(); }
  bool full() const { return running_.size() + waiting_.size() >= slots_.size(); }
  const std::vector<int>& running_slots() const { return running_; }
  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }

 private:
  SchedulerLimits limits_;
  std::deque<ScheduledSequence> waiting_;
  std::vector<int> running_;     // slots, in admission order
  std::vector<int> free_slots_;  // a stack, lowest slot on top
  std::vector<ScheduledSequence> slots_;
};

}  // namespace parity
