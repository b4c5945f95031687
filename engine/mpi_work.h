// Several hosts through MPI (OpenMPI): one rank per GPU as mpirun or srun start them. Rank 0
// reads the requests, hands them out one at a time to whichever rank asks (its own engine, on a
// thread, included), collects the results and writes the output; the other ranks run an engine
// whose WorkSource is rank 0 (RemoteWorkSource). A rank's local rank picks its GPU.
//
// Rank 0's main thread serves the queue while its engine thread pulls from the same queue in
// memory. With tensor-parallel groups of MPI ranks (engine/mpi_group.h) only the groups' leaders
// take requests, and a leader's engine thread broadcasts to its group (MPI_THREAD_MULTIPLE).
#pragma once
#include <chrono>
#include <functional>
#include <memory>

#include "engine/engine.h"
#include "engine/work_queue.h"

namespace parity {

// True when this process was started by an MPI launcher (mpirun, srun): the environment names
// a world (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK).
bool launched_by_mpi();

class MpiSession {
 public:
  // MPI_Init_thread asking for MPI_THREAD_MULTIPLE; throws when the library gives less than
  // MPI_THREAD_FUNNELED (what single ranks need; groups check for more).
  MpiSession(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks of this host
  int local_size() const { return local_size_; }
  int thread_level() const { return thread_level_; }  // what MPI_Init_thread gave
  // Collective: every rank says whether it failed; all get the lowest rank that did, or -1. Lets
  // an error found before the work starts be printed once and every rank end through
  // MPI_Finalize with the same exit code, rather than through abort().
  int first_failing_rank(bool failed) const;
  // Ends every rank at once with `code` (an error one rank found that the others cannot know).
  [[noreturn]] void abort(int code) const;

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, thread_level_ = 0;
};

// Rank 0: serves `queue` to the other ranks while `local` (rank 0's own engine run, on a thread
// of its own) pulls from it too; returns when every rank that runs an engine (every
// `engine_every`-th: the leaders of tensor-parallel groups of that size) has reported its end,
// with their stats in `per_rank` (index = rank; empty for the others). The local engine starts
// once every other engine has asked for its first request (or kFirstAskWait has passed), so
// that each starts with work while there is work to go round: rank 0's engine, which loads no
// later than the others ask, would otherwise take a short queue whole. `poll` (may be empty) is
// called on this thread between messages (progress display).
inline constexpr std::chrono::seconds kFirstAskWait{30};
void serve_work(const MpiSession& mpi, LocalQueue& queue, const std::function<EngineStats()>& local,
                std::vector<EngineStats>& per_rank, const std::function<void()>& poll,
                int engine_every = 1);

// Ranks other than 0: runs `engine` on requests from rank 0 until there are none left, then
// reports its stats.
void work_for_rank0(const MpiSession& mpi, Engine& engine);

}  // namespace parity
