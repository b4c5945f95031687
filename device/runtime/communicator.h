// The all-reduce of a tensor-parallel group on the device (design.md "Model parallel"): each
// rank's device buffer of n floats becomes the group's sum, the same bits on every rank, ordered
// on the rank's stream. NCCL on NVIDIA, RCCL on AMD (device/hip_compat.h); the ranks as threads of
// one process (one communicator per GPU, nccl_group) or as MPI ranks (nccl_unique_id on one rank,
// handed to every rank, then nccl_rank). The host's stand-in is device/runtime/host_group.h.
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "device/hip_compat.h"

namespace parity::device {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data (n floats on this rank's GPU) becomes the sum over the group, enqueued on
  // `stream`; every rank of the group must call it with the same n, in the same order.
  virtual void all_reduce_sum(float* data, size_t n, hipStream_t stream) = 0;
  // recv [size()][n] gets every rank's send (n floats) at its rank's place, enqueued on `stream`;
  // send may be recv + rank() n (in place). The engine's all-reduces are this and a rank-order
  // sum (launch_f32_rank_sum_residual): the same bits on every rank and for every batch, which a
  // ring all-reduce of more than two ranks does not promise.
  virtual void all_gather(const float* send, float* recv, size_t n, hipStream_t stream) = 0;
  // Ends the group's pending and later collectives with an error instead of waiting for a rank
  // that will not come (one rank failed); callable from any thread, once the group is given up.
  virtual void abort() = 0;
};

// Whether this build has NCCL (RCCL on AMD).
bool collectives_built();

// One communicator per GPU of `devices` (distinct device ordinals), rank i on devices[i], for
// ranks that are threads of this process. Throws parity::Error, one line, when the build has no
// NCCL/RCCL, the devices repeat or are out of range, or the library fails to set the group up.
std::vector<std::unique_ptr<Communicator>> nccl_group(std::span<const int> devices);

// The group's identity, made on one rank and handed to every rank (MPI_Bcast of the bytes).
using NcclId = std::array<char, 128>;
NcclId nccl_unique_id();
// This process's communicator: rank `rank` of `size` on GPU `device`, of the group `id` names.
std::unique_ptr<Communicator> nccl_rank(const NcclId& id, int size, int rank, int device);

}  // namespace parity::device
