// A tensor-parallel group whose ranks are MPI processes (`mpirun -np N run ... --tensor-parallel
// T`): world ranks r with the same r / T form a group of T ranks, one GPU each, on one host; the
// group's first rank is its leader. The leader runs the engine on a runner that also sends each of
// its calls (engine/step_message.h) to the other ranks, which replay them on their own runners:
// every rank runs every step, the device all-reduces meeting over NCCL. The leaders share the
// world's request queue as single ranks do (engine/mpi_work.h).
//
// The leader's engine thread broadcasts while rank 0's main thread serves the queue: the group
// needs MPI_THREAD_MULTIPLE. A rank that fails while the group runs ends the world
// (MpiSession::abort): the others may be waiting for it in a collective.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/mpi_work.h"
#include "engine/step_runner.h"

namespace parity {

class MpiGroup {
 public:
  // Collective over the world: the groups of `size` consecutive ranks. Throws parity::Error, one
  // line, when `size` does not divide the world or the library lacks MPI_THREAD_MULTIPLE (the
  // same on every rank).
  MpiGroup(const MpiSession& mpi, int size);
  ~MpiGroup();
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  int size() const { return size_; }
  int rank() const { return rank_; }  // in the group; 0 is the leader
  bool leader() const { return rank_ == 0; }
  int first_world_rank() const { return first_world_rank_; }  // the leader's, in the world
  // Collective over the group: the leader's bytes, on every rank.
  std::string broadcast(const std::string& bytes) const;
  // Collective over the group: whether every rank gave the same value.
  bool same(uint64_t value) const;
  // Collective over the group: the smallest value given.
  int64_t min(int64_t value) const;

 private:
  int size_ = 1, rank_ = 0, first_world_rank_ = 0;
  void* comm_ = nullptr;  // MPI_Comm (mpi.h stays out of this header)
};

// The leader's runner: `own` (its rank's), each call sent to the group first; each step's tokens
// checked to be the same on every rank. Its destruction tells the other ranks to stop.
std::unique_ptr<StepRunner> make_mpi_group_leader(const MpiGroup& group,
                                                  std::unique_ptr<StepRunner> own);

// The other ranks: replays the leader's calls on `runner` until the leader's stop.
void follow_group_leader(const MpiGroup& group, StepRunner& runner);

}  // namespace parity
