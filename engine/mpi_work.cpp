#include "engine/mpi_work.h"

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "engine/work_message.h"
#include "model/error.h"

namespace parity {
namespace {

enum Tag : int { kAsk = 1, kItem = 2, kNone = 3, kResult = 4, kStats = 5 };

void send(const std::string& bytes, int dest, int tag) {
  PARITY_CHECK(bytes.size() < size_t(1) << 31, "MPI message of {} bytes", bytes.size());
  MPI_Send(bytes.data(), int(bytes.size()), MPI_BYTE, dest, tag, MPI_COMM_WORLD);
}

// Receives the message `status` announced (after MPI_Probe / MPI_Iprobe).
std::string receive(const MPI_Status& status) {
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  std::string bytes(size_t(count), '\0');
  MPI_Recv(bytes.data(), count, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, MPI_COMM_WORLD,
           MPI_STATUS_IGNORE);
  return bytes;
}

// A rank's requests come from rank 0, one per question.
class RemoteWorkSource final : public WorkSource {
 public:
  std::optional<WorkItem> next() override {
    if (exhausted_) return std::nullopt;
    send({}, 0, kAsk);
    MPI_Status status;
    MPI_Probe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &status);
    const std::string bytes = receive(status);
    if (status.MPI_TAG == kNone) {
      exhausted_ = true;
      return std::nullopt;
    }
    PARITY_CHECK(status.MPI_TAG == kItem, "MPI: tag {} from rank 0", status.MPI_TAG);
    return decode_work_item(bytes);
  }
  void done(size_t index, EngineResult result) override {
    send(encode_work_result(index, result), 0, kResult);
  }

 private:
  bool exhausted_ = false;
};

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    fail("MPI: the library provides thread level {}, the engine needs MPI_THREAD_FUNNELED",
         provided);
  }
  thread_level_ = provided;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
}

MpiSession::~MpiSession() {
  MPI_Finalize();
}

int MpiSession::first_failing_rank(bool failed) const {
  const int mine = failed ? rank_ : size_;
  int first = size_;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return first < size_ ? first : -1;
}

void MpiSession::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

void serve_work(const MpiSession& mpi, LocalQueue& queue, const std::function<EngineStats()>& local,
                std::vector<EngineStats>& per_rank, const std::function<void()>& poll,
                int engine_every) {
  PARITY_CHECK(engine_every >= 1 && mpi.size() % engine_every == 0,
               "MPI: engines on every {}th of {} ranks", engine_every, mpi.size());
  per_rank.assign(size_t(mpi.size()), EngineStats{});
  std::atomic<bool> local_done = false, local_go = false;
  std::exception_ptr local_error;
  std::thread engine([&] {
    while (!local_go) std::this_thread::sleep_for(std::chrono::microseconds(50));
    try {
      per_rank[0] = local();
    } catch (...) {
      local_error = std::current_exception();
    }
    local_done = true;
  });
  int active = mpi.size() / engine_every - 1;  // the other ranks with an engine
  std::vector<bool> asked(size_t(mpi.size()), false);
  int first_asks = active;  // engines yet to ask for their first request
  const auto start = std::chrono::steady_clock::now();
  auto last_poll = start;
  while (active > 0 || !local_done) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &status);
    const auto now = std::chrono::steady_clock::now();
    if (!local_go && (first_asks == 0 || now - start > kFirstAskWait)) local_go = true;
    if (poll && now - last_poll > std::chrono::milliseconds(200)) {
      poll();
      last_poll = now;
    }
    if (flag == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    const std::string bytes = receive(status);
    switch (status.MPI_TAG) {
      case kAsk:
        if (!asked[size_t(status.MPI_SOURCE)]) {
          asked[size_t(status.MPI_SOURCE)] = true;
          --first_asks;
        }
        if (std::optional<WorkItem> item = queue.next())
          send(encode_work_item(*item), status.MPI_SOURCE, kItem);
        else
          send({}, status.MPI_SOURCE, kNone);
        break;
      case kResult: {
        auto [index, result] = decode_work_result(bytes);
        queue.done(index, std::move(result));
        break;
      }
      case kStats:
        per_rank[size_t(status.MPI_SOURCE)] = decode_work_stats(bytes);
        --active;
        if (!asked[size_t(status.MPI_SOURCE)]) {  // ended without asking: it takes no work
          asked[size_t(status.MPI_SOURCE)] = true;
          --first_asks;
        }
        break;
      default:
        fail("MPI: unknown tag {} from rank {}", status.MPI_TAG, status.MPI_SOURCE);
    }
  }
  engine.join();
  if (local_error) std::rethrow_exception(local_error);
  if (poll) poll();
}

void work_for_rank0(const MpiSession& mpi, Engine& engine) {
  RemoteWorkSource source;
  engine.run(source, {}, Clock::now(), mpi.rank());
  send(encode_work_stats(engine.stats()), 0, kStats);
}

}  // namespace parity
