#include "device/runtime/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "model/error.h"

// Whether hip_compat.h included NCCL (RCCL on AMD): the build found the library.
#if defined(PARITY_HAVE_NCCL) && PARITY_HAVE_NCCL
#define PARITY_NCCL 1
#else
#define PARITY_NCCL 0
#endif

namespace parity::device {
namespace {

#if PARITY_NCCL
static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NCCL's unique id is 128 bytes");

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclCommunicator() override {
    (void)hipSetDevice(device_);
    if (!aborted_) (void)ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* data, size_t n, hipStream_t stream) override {
    NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream));
  }
  void all_gather(const float* send, float* recv, size_t n, hipStream_t stream) override {
    NCCL_CHECK(ncclAllGather(send, recv, n, ncclFloat32, comm_, stream));
  }
  void abort() override {
    if (aborted_.exchange(true)) return;
    (void)ncclCommAbort(comm_);
  }

 private:
  ncclComm_t comm_;
  int rank_, size_, device_;
  std::atomic<bool> aborted_{false};
};
#else
[[noreturn]] void no_collectives() {
  fail(
      "tensor parallel: this build has no NCCL (RCCL on AMD) for the all-reduces; build with the "
      "CUDA toolkit's NCCL or ROCm's RCCL");
}
#endif

}  // namespace

bool collectives_built() {
#if PARITY_NCCL
  return true;
#else
  return false;
#endif
}

std::vector<std::unique_ptr<Communicator>> nccl_group(std::span<const int> devices) {
  int count = 0;
  HIP_CHECK(hipGetDeviceCount(&count));
  PARITY_CHECK(!devices.empty(), "tensor parallel: a group of no GPUs");
  for (size_t i = 0; i < devices.size(); ++i) {
    PARITY_CHECK(devices[i] >= 0 && devices[i] < count,
                 "tensor parallel: GPU {} of a group, but this machine has {}", devices[i], count);
    PARITY_CHECK(std::count(devices.begin(), devices.end(), devices[i]) == 1,
                 "tensor parallel: GPU {} twice in one group", devices[i]);
  }
#if PARITY_NCCL
  std::vector<ncclComm_t> comms(devices.size());
  NCCL_CHECK(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < devices.size(); ++i)
    out.push_back(
        std::make_unique<NcclCommunicator>(comms[i], int(i), int(devices.size()), devices[i]));
  return out;
#else
  no_collectives();
#endif
}

NcclId nccl_unique_id() {
#if PARITY_NCCL
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
#else
  no_collectives();
#endif
}

std::unique_ptr<Communicator> nccl_rank(const NcclId& id, int size, int rank, int device) {
  PARITY_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor parallel: rank {} of a group of {}",
               rank, size);
#if PARITY_NCCL
  HIP_CHECK(hipSetDevice(device));
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, size, nid, rank));
  return std::make_unique<NcclCommunicator>(comm, rank, size, device);
#else
  (void)id, (void)device;
  no_collectives();
#endif
}

}  // namespace parity::device
