// The engine's batch limits sized from a GPU's memory (device/runtime/serving_limits.h): host
// arithmetic, checked on the shapes of the synthetic 20b and 120b against an H100's memory as the
// device runtime reports it.
#include "device/runtime/serving_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>

#include "device/runtime/arena_layout.h"
#include "device/runtime/kv_blocks.h"
#include "model/synth.h"

namespace parity::device {
namespace {

using ::testing::HasSubstr;

constexpr size_t kGiB = size_t(1) << 30;
constexpr size_t kMiB = size_t(1) << 20;

// One H100 80GB as the runtime saw it (docs/device-runs/2026-11-25-packed-experts): 78.53 GiB
// free; the 20b's weights 12.83 GiB.
constexpr size_t kH100Free = size_t(78.53 * double(kGiB));
constexpr size_t k20bWeights = size_t(12.83 * double(kGiB));
constexpr size_t k120bWeights = size_t(60.8 * double(kGiB));

ServingMemory h100(size_t weights) {
  ServingMemory m;
  m.free_bytes = kH100Free;
  m.weights_bytes = weights;
  m.max_context = 4096;
  return m;
}

TEST(ServingLimits, StepActivationsAreTheArenaAndTheScoresAtTheEndOfTheContext) {
  const Config c = synth_preset("20b").config;
  // 64 heads x 4097 positions x scores and att x f32 per row.
  EXPECT_EQ(step_activation_bytes(c, 4096, 4096),
            ArenaLayout::of(c, 4096, 4096).bytes + size_t(4096) * 64 * 4097 * 2 * 4);
  EXPECT_GT(step_activation_bytes(c, 4096, 8192), step_activation_bytes(c, 4096, 4096));
}

TEST(ServingLimits, The20bOnAnH100GetsTheReferenceRunsLimits) {
  const Config c = synth_preset("20b").config;
  const ServingLimits l = size_serving_limits(c, h100(k20bWeights));
  // The limits vLLM-class serving uses on one H100 for the 20b: --max-batch 512 --step-tokens 4096.
  EXPECT_EQ(l.step_tokens, 4096);
  EXPECT_EQ(l.max_batch, 512);
  EXPECT_TRUE(l.step_tokens_sized);
  EXPECT_TRUE(l.max_batch_sized);
  EXPECT_EQ(l.budget_bytes, kH100Free - k20bWeights);
  EXPECT_EQ(l.activation_bytes, step_activation_bytes(c, 4096, 4096));
  EXPECT_LE(l.activation_bytes, l.budget_bytes / 4);
  // The pool: 90 % of what the weights and the activations leave, in whole 1.5 MiB blocks.
  const size_t block = KvLayout::of(c, 32).block_bytes();
  EXPECT_EQ(block, size_t(1536) * 1024);
  EXPECT_EQ(l.kv_blocks, int(double(l.budget_bytes - l.activation_bytes) * 0.9 / double(block)));
  EXPECT_EQ(l.kv_bytes, size_t(l.kv_blocks) * block);
  // A sequence of 512 positions holds 16 blocks on full layers and 16 on sliding ones.
  EXPECT_EQ(l.nominal_positions, 512);
  EXPECT_EQ(l.nominal_sequences, l.kv_blocks / 32);
  EXPECT_GT(l.nominal_sequences, 512);
  // Everything fits: weights, the largest step, the pool.
  EXPECT_LE(k20bWeights + l.activation_bytes + l.kv_bytes, kH100Free);
}

TEST(ServingLimits, TheBf16PrecisionsCacheHoldsTwiceTheBlocks) {
  // The same budget in blocks of BF16 (0.75 MiB): twice the blocks, within one, and twice the
  // sequences; the step and the batch as in float32.
  const Config c = synth_preset("20b").config;
  ServingMemory m = h100(k20bWeights);
  const ServingLimits f = size_serving_limits(c, m);
  m.precision = Precision::bf16;
  const ServingLimits b = size_serving_limits(c, m);
  const size_t block = KvLayout::of(c, 32, KvDtype::bf16).block_bytes();
  EXPECT_EQ(block, size_t(768) * 1024);
  EXPECT_EQ(b.kv_blocks, int(double(b.budget_bytes - b.activation_bytes) * 0.9 / double(block)));
  EXPECT_NEAR(b.kv_blocks, 2 * f.kv_blocks, 1);
  EXPECT_NEAR(b.nominal_sequences, 2 * f.nominal_sequences, 1);
  EXPECT_EQ(b.step_tokens, f.step_tokens);
  EXPECT_EQ(b.max_batch, f.max_batch);
}

TEST(ServingLimits, The120bOnAnH100TakesASmallerStepAndTheSequencesItsCacheHolds) {
  const Config c = synth_preset("120b").config;
  const ServingLimits l = size_serving_limits(c, h100(k120bWeights));
  // The largest power of two from 4096 down whose activations fit a quarter of what is left.
  EXPECT_LT(l.step_tokens, 4096);
  EXPECT_LE(step_activation_bytes(c, l.step_tokens, 4096), l.budget_bytes / 4);
  EXPECT_GT(step_activation_bytes(c, 2 * l.step_tokens, 4096), l.budget_bytes / 4);
  // Fewer than 512 sequences of 512 positions fit: the cache decides the batch.
  EXPECT_LT(l.nominal_sequences, 512);
  EXPECT_GT(l.nominal_sequences, 0);
  EXPECT_EQ(l.max_batch, std::min(l.step_tokens, l.nominal_sequences));
  EXPECT_LE(k120bWeights + l.activation_bytes + l.kv_bytes, kH100Free);
}

TEST(ServingLimits, ALongerContextCostsStepTokens) {
  const Config c = synth_preset("20b").config;
  ServingMemory m = h100(k20bWeights);
  m.max_context = 32768;  // scores of a 4096-row step: 64 GiB
  const ServingLimits l = size_serving_limits(c, m);
  EXPECT_LT(l.step_tokens, 4096);
  EXPECT_LE(l.activation_bytes, l.budget_bytes / 4);
  EXPECT_EQ(l.activation_bytes, step_activation_bytes(c, l.step_tokens, 32768));
}

TEST(ServingLimits, GivenLimitsAreKeptAndTheOthersSizedAroundThem) {
  const Config c = synth_preset("20b").config;
  ServingMemory m = h100(k20bWeights);
  m.step_tokens = 1000;
  ServingLimits l = size_serving_limits(c, m);
  EXPECT_EQ(l.step_tokens, 1000);
  EXPECT_FALSE(l.step_tokens_sized);
  EXPECT_EQ(l.activation_bytes, step_activation_bytes(c, 1000, 4096));
  EXPECT_EQ(l.max_batch, 512);
  EXPECT_TRUE(l.max_batch_sized);
  EXPECT_THAT(l.text(), HasSubstr("--step-tokens 1000 (given"));

  // A batch larger than a step: the step's rows are the batch's, and the activations with them.
  m.step_tokens = 0;
  m.max_batch = 6000;
  l = size_serving_limits(c, m);
  EXPECT_EQ(l.max_batch, 6000);
  EXPECT_FALSE(l.max_batch_sized);
  EXPECT_EQ(l.activation_bytes, step_activation_bytes(c, 6000, 4096));
  EXPECT_THAT(l.text(), HasSubstr("--max-batch 6000 (given"));

  // A batch never exceeds the step it must fit in.
  m.max_batch = 0;
  m.step_tokens = 128;
  EXPECT_EQ(size_serving_limits(c, m).max_batch, 128);
}

TEST(ServingLimits, AKvMemoryAskedForIsThePool) {
  const Config c = synth_preset("20b").config;
  ServingMemory m = h100(k20bWeights);
  m.kv_bytes = 3 * kGiB + 5;  // 2048 blocks of 1.5 MiB, and 5 bytes
  const ServingLimits l = size_serving_limits(c, m);
  EXPECT_EQ(l.kv_blocks, 2048);
  EXPECT_EQ(l.kv_bytes, 3 * kGiB);
  EXPECT_EQ(l.nominal_sequences, 64);
  EXPECT_EQ(l.max_batch, 64);
  EXPECT_THAT(l.text(),
              HasSubstr("the 64 sequences of 512 positions that the KV pool of 3.00 GiB"));
}

TEST(ServingLimits, ALittleMemoryGivesTheSmallestStepAndOneSequenceAtLeast) {
  const Config c = synth_preset("20b").config;
  ServingMemory m = h100(k20bWeights);
  m.free_bytes = k20bWeights + 200 * kMiB;
  ServingLimits l = size_serving_limits(c, m);
  EXPECT_EQ(l.step_tokens, 64);
  EXPECT_GT(l.activation_bytes, l.budget_bytes / 4);
  EXPECT_THAT(l.text(), HasSubstr("--step-tokens 64 (the smallest it sizes"));
  EXPECT_GE(l.max_batch, 1);
  // Less free than the weights: nothing left, the runtime refuses the model with its sizes.
  m.free_bytes = k20bWeights / 2;
  l = size_serving_limits(c, m);
  EXPECT_EQ(l.budget_bytes, 0u);
  EXPECT_EQ(l.kv_blocks, 0);
  EXPECT_EQ(l.max_batch, 1);
}

TEST(ServingLimits, AShortContextCountsSequencesOfTheContext) {
  const Config c = synth_preset("tiny").config;
  ServingMemory m;
  m.free_bytes = kGiB;
  m.weights_bytes = kMiB;
  m.max_context = 128;
  const ServingLimits l = size_serving_limits(c, m);
  EXPECT_EQ(l.nominal_positions, 128);
  EXPECT_EQ(l.nominal_sequences,
            l.kv_blocks / KvLayout::of(c, 32).blocks_per_sequence(128, l.step_tokens));
  EXPECT_EQ(l.step_tokens, 4096);
  EXPECT_EQ(l.max_batch, 512);
}

}  // namespace
}  // namespace parity::device
