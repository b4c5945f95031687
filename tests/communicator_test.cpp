// The tensor-parallel all-reduce: the host group (device/runtime/host_group.h) gives every rank
// the rank-order sum, the same bits whatever order the threads arrive in, and a rank that leaves
// or disagrees on the length fails every rank instead of hanging them; NCCL
// (device/runtime/communicator.h) does the same on two GPUs, where the machine has them; the
// peer-store all-reduce (device/runtime/peer_group.h) gives the bits of the all-gather and rank
// sum on every rank, call after call, and its join the vocabulary join's, and a rank that never
// comes or a group given up ends the others' waits with one line instead of hanging them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/runtime/host_group.h"
#include "model/error.h"

#ifdef PARITY_HAVE_DEVICE
#include "device/kernels.h"
#include "device/runtime/communicator.h"
#include "device/runtime/device.h"
#include "device/runtime/peer_group.h"
#include "device_test_util.h"
#endif

namespace parity::device {
namespace {

// Runs fn(rank) on `size` threads; the errors' messages, per rank ("" where none).
template <typename F>
std::vector<std::string> on_ranks(int size, F fn) {
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const Error& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<std::vector<float>> random_buffers(int size, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  std::vector<std::vector<float>> b(static_cast<size_t>(size), std::vector<float>(n));
  for (auto& v : b)
    for (float& x : v) x = u(rng);
  return b;
}

TEST(HostGroup, EveryRankGetsTheRankOrderSumWithTheSameBits) {
  for (const int size : {1, 2, 3, 4}) {
    SCOPED_TRACE(size);
    const size_t n = 1001;
    const auto inputs = random_buffers(size, n, 5 + uint64_t(size));
    std::vector<float> expected(n);
    for (size_t i = 0; i < n; ++i) {
      double s = 0;
      for (int r = 0; r < size; ++r) s += double(inputs[size_t(r)][i]);
      expected[i] = float(s);
    }
    HostGroup group(size);
    for (int round = 0; round < 3; ++round) {  // later arrivals first in some rounds
      auto buffers = inputs;
      const auto errors = on_ranks(size, [&](int r) {
        if ((r + round) % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        group.all_reduce_sum(r, buffers[size_t(r)]);
      });
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(errors[size_t(r)], "") << r;
        EXPECT_EQ(std::memcmp(buffers[size_t(r)].data(), expected.data(), n * sizeof(float)), 0)
            << "rank " << r << " round " << round;
      }
    }
  }
}

TEST(HostGroup, ARankThatLeavesFailsTheOthersInsteadOfHangingThem) {
  HostGroup group(3);
  std::vector<std::vector<float>> buffers(3, std::vector<float>(8, 1.0f));
  const auto errors = on_ranks(3, [&](int r) {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the others wait already
      group.leave(1, "its model did not load");
      return;
    }
    group.all_reduce_sum(r, buffers[size_t(r)]);
  });
  for (const int r : {0, 2})
    EXPECT_NE(errors[size_t(r)].find("rank 1 left the group: its model did not load"),
              std::string::npos)
        << errors[size_t(r)];
  // Later all-reduces fail at once.
  EXPECT_THROW(group.all_reduce_sum(0, buffers[0]), Error);
}

TEST(HostGroup, RanksThatDisagreeOnTheLengthAllFail) {
  HostGroup group(2);
  std::vector<float> a(8, 1.0f), b(9, 1.0f);
  const auto errors = on_ranks(2, [&](int r) { group.all_reduce_sum(r, r == 0 ? a : b); });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[size_t(r)].find("rank 1 all-reduces 9 floats, rank 0 8"), std::string::npos)
        << errors[size_t(r)];
  EXPECT_THROW(HostGroup(0), Error);
  HostGroup one(1);
  EXPECT_THROW(one.all_reduce_sum(1, a), Error);  // no rank 1 in a group of one
}

#ifdef PARITY_HAVE_DEVICE
TEST(NcclGroup, TwoGpusAllReduceToTheSameBits) {
  if (!collectives_built()) GTEST_SKIP() << "this build has no NCCL (RCCL on AMD)";
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs, this machine has " << device_count();
  const std::vector<int> devices = {0, 1};
  auto comms = nccl_group(devices);
  ASSERT_EQ(comms.size(), 2u);
  const size_t n = 4099;
  const auto inputs = random_buffers(2, n, 9);
  std::vector<std::vector<float>> out(2);
  const auto errors = on_ranks(2, [&](int r) {
    HIP_CHECK(hipSetDevice(devices[size_t(r)]));
    DeviceBuffer b = test::upload(inputs[size_t(r)]);
    comms[size_t(r)]->all_reduce_sum(b.as<float>(), n, nullptr);
    out[size_t(r)] = test::download<float>(b, n);
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), n * sizeof(float)), 0);
  for (size_t i = 0; i < n; ++i)  // two terms: one float32 rounding either order
    EXPECT_EQ(out[0][i], inputs[0][i] + inputs[1][i]) << i;
}

TEST(NcclGroup, TwoGpusGatherEveryRanksPart) {
  if (!collectives_built()) GTEST_SKIP() << "this build has no NCCL (RCCL on AMD)";
  if (device_count() < 2) GTEST_SKIP() << "needs two GPUs, this machine has " << device_count();
  const std::vector<int> devices = {0, 1};
  auto comms = nccl_group(devices);
  const size_t n = 1027;
  const auto inputs = random_buffers(2, n, 11);
  std::vector<std::vector<float>> out(2);
  const auto errors = on_ranks(2, [&](int r) {
    HIP_CHECK(hipSetDevice(devices[size_t(r)]));
    DeviceBuffer recv(2 * n * sizeof(float));
    DeviceBuffer send = test::upload(inputs[size_t(r)]);
    comms[size_t(r)]->all_gather(send.as<float>(), recv.as<float>(), n, nullptr);
    out[size_t(r)] = test::download<float>(recv, 2 * n);
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (int r = 0; r < 2; ++r)
    for (int part = 0; part < 2; ++part)
      EXPECT_EQ(0, std::memcmp(out[size_t(r)].data() + size_t(part) * n,
                               inputs[size_t(part)].data(), n * sizeof(float)))
          << "rank " << r << " part " << part;
}

// The GPUs of this machine as a peer group of `size`, or a reason to skip.
std::string peer_group_unavailable(int size) {
  if (device_count() < size)
    return "needs " + std::to_string(size) + " GPUs, this machine has " +
           std::to_string(device_count());
  std::vector<int> devices(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) devices[size_t(r)] = r;
  if (!PeerGroup::open(devices)) return "these GPUs do not reach each other's memory";
  return "";
}

TEST(PeerGroup, EveryRankGetsTheBitsOfTheGatherAndRankSumCallAfterCall) {
  for (const int size : {2, 3, 4}) {
    if (const std::string why = peer_group_unavailable(size); !why.empty()) {
      if (size == 2) GTEST_SKIP() << why;
      break;  // the larger groups this machine has not
    }
    SCOPED_TRACE(size);
    std::vector<int> devices(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) devices[size_t(r)] = r;
    auto group = PeerGroup::open(devices);
    ASSERT_TRUE(group);
    // A batch-1 row of the 20b's hidden size, a 64-row step, the largest part, a tiny one; with
    // and without the residual; five calls each, so both parities and a wrapped one, with the
    // ranks arriving in turn late.
    const std::vector<int64_t> sizes = {2880, 64 * 2880, PeerGroup::kPartFloats, 4};
    int round = 0;
    for (const int64_t n : sizes)
      for (const bool with_residual : {true, false})
        for (int call = 0; call < 5; ++call, ++round) {
          SCOPED_TRACE(testing::Message()
                       << "n " << n << " residual " << with_residual << " call " << call);
          const auto parts = random_buffers(size, size_t(n), 100 + uint64_t(round));
          const auto residual = random_buffers(1, size_t(n), 7 + uint64_t(round))[0];
          std::vector<float> sum(static_cast<size_t>(n)), resid_out(static_cast<size_t>(n));
          for (size_t i = 0; i < size_t(n); ++i) {
            float acc = parts[0][i];
            for (int r = 1; r < size; ++r) acc += parts[size_t(r)][i];
            sum[i] = acc;
            resid_out[i] = residual[i] + acc;
          }
          const auto ranks = static_cast<size_t>(size);
          std::vector<std::vector<float>> got(ranks), got_resid(ranks), got_parts(ranks);
          const auto errors = on_ranks(size, [&](int r) {
            HIP_CHECK(hipSetDevice(devices[size_t(r)]));
            if (r == round % size) std::this_thread::sleep_for(std::chrono::milliseconds(3));
            DeviceBuffer data = test::upload(parts[size_t(r)]);
            DeviceBuffer res = test::upload(residual);
            DeviceBuffer out_sum(size_t(n) * sizeof(float)), out_resid(size_t(n) * sizeof(float));
            const PeerRank& me = *group->rank(r);
            ASSERT_TRUE(me.takes(n));
            // The sum in place (the runtime's use) on even calls, into another buffer on odd ones.
            DeviceBuffer& sum_at = call % 2 == 0 ? data : out_sum;
            me.all_reduce(data.as<float>(), n, with_residual ? res.as<float>() : nullptr,
                          sum_at.as<float>(), with_residual ? out_resid.as<float>() : nullptr,
                          nullptr);
            HIP_CHECK(hipStreamSynchronize(nullptr));
            me.check();
            got[size_t(r)] = test::download<float>(sum_at, size_t(n));
            if (with_residual) got_resid[size_t(r)] = test::download<float>(out_resid, size_t(n));
            const float* all = me.last_parts(nullptr);
            got_parts[size_t(r)].resize(size_t(size) * size_t(n));
            HIP_CHECK(hipMemcpy(got_parts[size_t(r)].data(), all,
                                got_parts[size_t(r)].size() * sizeof(float),
                                hipMemcpyDeviceToHost));
          });
          for (int r = 0; r < size; ++r) {
            ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
            EXPECT_EQ(std::memcmp(got[size_t(r)].data(), sum.data(), size_t(n) * sizeof(float)), 0)
                << "rank " << r;
            if (with_residual) {
              EXPECT_EQ(std::memcmp(got_resid[size_t(r)].data(), resid_out.data(),
                                    size_t(n) * sizeof(float)),
                        0)
                  << "rank " << r;
            }
            for (int q = 0; q < size; ++q)
              EXPECT_EQ(std::memcmp(got_parts[size_t(r)].data() + size_t(q) * size_t(n),
                                    parts[size_t(q)].data(), size_t(n) * sizeof(float)),
                        0)
                  << "rank " << r << "'s copy of rank " << q << "'s part";
          }
        }
    EXPECT_FALSE(group->rank(0)->takes(PeerGroup::kPartFloats + 4));
    EXPECT_FALSE(group->rank(0)->takes(2882));  // not whole float4s
  }
}

// lm_head's vocabulary shards joined by peer stores: every rank gets launch_f32_vocab_join's
// rows, with shards of unequal size (a vocabulary the ranks do not divide), call after call.
TEST(PeerGroup, EveryRankJoinsTheVocabularyShards) {
  for (const int size : {2, 3, 4}) {
    if (const std::string why = peer_group_unavailable(size); !why.empty()) {
      if (size == 2) GTEST_SKIP() << why;
      break;
    }
    SCOPED_TRACE(size);
    std::vector<int> devices(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) devices[size_t(r)] = r;
    auto group = PeerGroup::open(devices);
    ASSERT_TRUE(group);
    const int vocab = 1000, base = vocab / size, extra = vocab % size;
    for (const int rows : {1, 2, 4}) {
      SCOPED_TRACE(rows);
      const int64_t part = int64_t(rows) * ((vocab + size - 1) / size);
      ASSERT_EQ(part % 4, 0);
      const auto shards = random_buffers(size, size_t(part), 300 + uint64_t(rows));
      std::vector<float> want(size_t(rows) * vocab);
      for (int r = 0; r < size; ++r) {
        const int begin = r * base + std::min(r, extra), cols = base + (r < extra ? 1 : 0);
        for (int b = 0; b < rows; ++b)
          for (int j = 0; j < cols; ++j)
            want[size_t(b) * vocab + size_t(begin + j)] = shards[size_t(r)][size_t(b * cols + j)];
      }
      std::vector<std::vector<float>> got(static_cast<size_t>(size));
      const auto errors = on_ranks(size, [&](int r) {
        HIP_CHECK(hipSetDevice(devices[size_t(r)]));
        DeviceBuffer shard = test::upload(shards[size_t(r)]);
        DeviceBuffer logits(size_t(rows) * vocab * sizeof(float));
        group->rank(r)->join_vocab(shard.as<float>(), part, rows, vocab, logits.as<float>(),
                                   nullptr);
        HIP_CHECK(hipStreamSynchronize(nullptr));
        group->rank(r)->check();
        got[size_t(r)] = test::download<float>(logits, size_t(rows) * vocab);
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
        EXPECT_EQ(std::memcmp(got[size_t(r)].data(), want.data(), want.size() * sizeof(float)), 0)
            << "rank " << r;
      }
    }
  }
}

TEST(PeerGroup, ARankThatNeverComesEndsTheWaitInOneLine) {
  if (const std::string why = peer_group_unavailable(2); !why.empty()) GTEST_SKIP() << why;
  const std::vector<int> devices = {0, 1};
  auto group = PeerGroup::open(devices, 0.25);
  HIP_CHECK(hipSetDevice(0));
  DeviceBuffer data = test::upload(std::vector<float>(2880, 1.0f));
  const auto start = std::chrono::steady_clock::now();
  group->rank(0)->all_reduce(data.as<float>(), 2880, nullptr, data.as<float>(), nullptr, nullptr);
  HIP_CHECK(hipStreamSynchronize(nullptr));  // rank 1 never calls: the wait ends by itself
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 30.0);
  try {
    group->rank(0)->check();
    ADD_FAILURE() << "a wait that timed out passed the check";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()),
                ::testing::HasSubstr("rank 0 waited more than 0.25 s at an all-reduce for rank "
                                     "1's partial sums"));
  }
  EXPECT_NO_THROW(group->rank(1)->check());  // rank 1 did not wait
}

TEST(PeerGroup, AGroupGivenUpEndsEveryWait) {
  if (const std::string why = peer_group_unavailable(2); !why.empty()) GTEST_SKIP() << why;
  const std::vector<int> devices = {0, 1};
  auto group = PeerGroup::open(devices);  // the default timeout, 60 s: the abort ends it
  HIP_CHECK(hipSetDevice(0));
  DeviceBuffer data = test::upload(std::vector<float>(2880, 1.0f));
  const auto start = std::chrono::steady_clock::now();
  group->rank(0)->all_reduce(data.as<float>(), 2880, nullptr, data.as<float>(), nullptr, nullptr);
  std::thread give_up([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    group->abort();
  });
  HIP_CHECK(hipStreamSynchronize(nullptr));
  give_up.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  EXPECT_TRUE(group->aborted());
  for (int r = 0; r < 2; ++r) try {
      group->rank(r)->check();
      ADD_FAILURE() << "rank " << r << " passed the check of a group given up";
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("the group was given up"));
    }
}

TEST(NcclGroup, AGroupTheBuildOrTheMachineCannotMakeIsOneLine) {
  if (device_count() < 1) GTEST_SKIP() << "needs a GPU";
  if (!collectives_built()) {
    const std::vector<int> one = {0};
    try {
      nccl_group(one);
      ADD_FAILURE() << "a build without NCCL made a group";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no NCCL"), std::string::npos) << e.what();
    }
    return;
  }
  const std::vector<int> beyond = {0, device_count()}, twice = {0, 0};
  EXPECT_THROW(nccl_group(beyond), Error);
  EXPECT_THROW(nccl_group(twice), Error);
}
#endif

}  // namespace
}  // namespace parity::device
