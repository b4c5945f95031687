#include "device/runtime/peer_group.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "device/hip_compat.h"
#include "device/kernels.h"
#include "model/error.h"

namespace parity::device {
namespace {

// A rank's device memory: the parts of both parities, then the flags, then the epochs.
struct PeerLayout {
  size_t parts, flags, epoch, bytes;
  explicit PeerLayout(int ranks) {
    parts = 0;
    flags = size_t(2) * size_t(ranks) * size_t(PeerGroup::kPartFloats) * sizeof(float);
    epoch = flags + size_t(kPeerBlocks) * kPeerMaxRanks * sizeof(uint32_t);
    bytes = epoch + size_t(kPeerBlocks) * sizeof(uint32_t);
  }
};

// The calling thread's current device, restored on leaving.
class CurrentDevice {
 public:
  CurrentDevice() { HIP_CHECK(hipGetDevice(&device_)); }
  ~CurrentDevice() { (void)hipSetDevice(device_); }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int device_ = 0;
};

// Peer access from the current device to `peer`, once per pair in this process: enabling it
// again is an error the runtime reports (and compute-sanitizer with it), so the pairs this
// process enabled are remembered. One enabled by another library first (NCCL enables its own
// when it first needs them) is the same error, taken as done.
void enable_peer_access(int peer) {
  static std::mutex m;
  static std::set<std::pair<int, int>> enabled;
  int device = 0;
  HIP_CHECK(hipGetDevice(&device));
  const std::lock_guard lock(m);
  if (enabled.count({device, peer}) != 0) return;
  const hipError_t err = hipDeviceEnablePeerAccess(peer, 0);
  if (err == hipErrorPeerAccessAlreadyEnabled)
    (void)hipGetLastError();
  else
    HIP_CHECK(err);
  enabled.insert({device, peer});
}

uint32_t load_word(const uint32_t* w) {
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(w)).load(std::memory_order_acquire);
}

}  // namespace

size_t PeerGroup::bytes_per_rank(int ranks) {
  return PeerLayout(ranks).bytes;
}

std::unique_ptr<PeerGroup> PeerGroup::open(std::span<const int> devices, double timeout_seconds) {
  const int n = int(devices.size());
  if (n < 2 || n > kPeerMaxRanks) return nullptr;
  PARITY_CHECK(timeout_seconds > 0, "peer all-reduce: a timeout of {} s", timeout_seconds);
  const CurrentDevice keep;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      int can = 0;
      HIP_CHECK(hipDeviceCanAccessPeer(&can, devices[size_t(i)], devices[size_t(j)]));
      if (can == 0) return nullptr;
    }
  std::unique_ptr<PeerGroup> g(new PeerGroup());
  g->devices_.assign(devices.begin(), devices.end());
  g->timeout_seconds_ = timeout_seconds;
  for (int i = 0; i < n; ++i) {
    HIP_CHECK(hipSetDevice(devices[size_t(i)]));
    for (int j = 0; j < n; ++j)
      if (i != j) enable_peer_access(devices[size_t(j)]);
  }

  // The host-mapped words, readable and writable by every GPU of the group.
  void* status = nullptr;
  HIP_CHECK(hipHostMalloc(&status, kStatusWords * sizeof(uint32_t),
                          hipHostMallocMapped | hipHostMallocPortable));
  g->status_ = static_cast<uint32_t*>(status);
  std::memset(g->status_, 0, kStatusWords * sizeof(uint32_t));

  const PeerLayout at(n);
  g->memory_.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    HIP_CHECK(hipSetDevice(devices[size_t(i)]));
    g->memory_[size_t(i)].allocate(at.bytes);
    // The flags and epochs start at 0 (every call's epoch is 1 or more); the parts need nothing.
    HIP_CHECK(hipMemset(g->memory_[size_t(i)].as<char>(at.flags), 0, at.bytes - at.flags));
  }
  g->ranks_.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    HIP_CHECK(hipSetDevice(devices[size_t(i)]));
    PeerRank& r = g->ranks_[size_t(i)];
    r.group_ = g.get();
    PeerReduceView& v = r.view_;
    v.ranks = n;
    v.rank = i;
    for (int q = 0; q < n; ++q) {
      const DeviceBuffer& m = g->memory_[size_t(q)];
      for (int p = 0; p < 2; ++p)
        v.parts[q][p] =
            m.as<float>(at.parts + size_t(p) * size_t(n) * size_t(kPartFloats) * sizeof(float));
      v.flags[q] = m.as<uint32_t>(at.flags);
    }
    v.epoch = g->memory_[size_t(i)].as<uint32_t>(at.epoch);
    void* mapped = nullptr;
    HIP_CHECK(hipHostGetDevicePointer(&mapped, g->status_, 0));
    v.abort = static_cast<const volatile uint32_t*>(mapped);
    v.failed = static_cast<uint32_t*>(mapped) + 1 + i;
    v.timeout_ticks = uint64_t(timeout_seconds * device_wall_clock_hz(devices[size_t(i)]));
    v.capacity = kPartFloats;
  }
  HIP_CHECK(hipDeviceSynchronize());  // the memsets, before any rank's kernel
  return g;
}

PeerGroup::~PeerGroup() {
  if (status_ != nullptr) (void)hipHostFree(status_);
}

void PeerGroup::abort() {
  std::atomic_ref<uint32_t>(status_[0]).store(1, std::memory_order_release);
}

bool PeerGroup::aborted() const {
  return load_word(&status_[0]) != 0;
}

void PeerRank::all_reduce(const float* data, int64_t n, const float* residual, float* sum,
                          float* resid_out, hipStream_t stream) const {
  launch_f32_peer_rank_sum_residual(view_, data, n, residual, sum, resid_out, stream);
}

void PeerRank::join_vocab(const float* shard, int64_t part, int rows, int vocab, float* logits,
                          hipStream_t stream) const {
  launch_f32_peer_vocab_join(view_, shard, part, rows, vocab, logits, stream);
}

const float* PeerRank::last_parts(hipStream_t stream) const {
  HIP_CHECK(hipStreamSynchronize(stream));
  check();
  uint32_t epoch = 0;  // every block counts the same calls: block 0's count is the last call's
  HIP_CHECK(hipMemcpy(&epoch, view_.epoch, sizeof(epoch), hipMemcpyDeviceToHost));
  return view_.parts[view_.rank][epoch & 1u];
}

void PeerRank::check() const {
  const uint32_t failed = load_word(view_.failed);
  if (failed != 0)
    fail(
        "tensor parallel: rank {} waited more than {} s at an all-reduce for rank {}'s partial "
        "sums; the group is given up",
        view_.rank, group_->timeout_seconds(), failed - 1);
  if (group_->aborted())
    fail("tensor parallel: rank {}: the group was given up (another rank failed)", view_.rank);
}

}  // namespace parity::device
