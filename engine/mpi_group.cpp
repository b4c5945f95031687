#include "engine/mpi_group.h"

#include <fmt/format.h>
#include <mpi.h>

#include <exception>
#include <vector>

#include "engine/step_message.h"
#include "model/error.h"

namespace parity {
namespace {

MPI_Comm as_comm(void* c) {
  return *static_cast<MPI_Comm*>(c);
}

// FNV-1a over the tokens: what the ranks compare after each step.
uint64_t token_hash(const std::vector<TokenId>& tokens) {
  uint64_t h = 1469598103934665603ull;
  for (const TokenId t : tokens) {
    h ^= uint64_t(uint32_t(t));
    h *= 1099511628211ull;
  }
  return h ^ tokens.size();
}

class LeaderRunner final : public StepRunner {
 public:
  LeaderRunner(const MpiGroup& g, std::unique_ptr<StepRunner> own) : g_(g), own_(std::move(own)) {}
  ~LeaderRunner() override {
    try {
      send(StepMessage{});             // stop
    } catch (const std::exception&) {  // the world is ending anyway
    }
  }
  std::string name() const override {
    return fmt::format("tensor parallel over {} MPI ranks (world ranks {}..{}): rank 0 on {}",
                       g_.size(), g_.first_world_rank(), g_.first_world_rank() + g_.size() - 1,
                       own_->name());
  }
  const Config& config() const override { return own_->config(); }
  int max_context() const override { return own_->max_context(); }
  int kv_blocks() const override { return own_->kv_blocks(); }
  int kv_block_size() const override { return own_->kv_block_size(); }
  std::vector<TokenId> step(const Batch& batch, std::span<const RowSample> samples,
                            const SamplingParams& sampling) override {
    StepMessage m;
    m.kind = StepMessage::Kind::step;
    m.batch = batch;
    m.samples.assign(samples.begin(), samples.end());
    m.sampling = sampling;
    send(m);
    std::vector<TokenId> tokens = own_->step(batch, samples, sampling);
    PARITY_CHECK(g_.same(token_hash(tokens)),
                 "tensor parallel: a rank of the MPI group sampled other tokens than its leader");
    return tokens;
  }
  void release(int seq) override {
    StepMessage m;
    m.kind = StepMessage::Kind::release;
    m.seq = seq;
    send(m);
    own_->release(seq);
  }
  void reset() override {
    StepMessage m;
    m.kind = StepMessage::Kind::reset;
    send(m);
    own_->reset();
  }
  std::string kernel_times() const override { return own_->kernel_times(); }
  std::string launches() const override { return own_->launches(); }

 private:
  void send(const StepMessage& m) const { (void)g_.broadcast(encode_step_message(m)); }
  const MpiGroup& g_;
  std::unique_ptr<StepRunner> own_;
};

}  // namespace

MpiGroup::MpiGroup(const MpiSession& mpi, int size) : size_(size), first_world_rank_(mpi.rank()) {
  PARITY_CHECK(size >= 1, "tensor parallel: a group of {} MPI ranks", size);
  if (mpi.size() % size != 0)
    fail("--tensor-parallel {}: the MPI world's {} ranks are not whole groups of {}", size,
         mpi.size(), size);
  if (size > 1 && mpi.thread_level() < MPI_THREAD_MULTIPLE)
    fail(
        "--tensor-parallel {} under MPI: the MPI library gives thread level {}; a group's leader "
        "broadcasts from its engine thread and needs MPI_THREAD_MULTIPLE ({})",
        size, mpi.thread_level(), int(MPI_THREAD_MULTIPLE));
  auto* comm = new MPI_Comm;
  MPI_Comm_split(MPI_COMM_WORLD, mpi.rank() / size, mpi.rank(), comm);
  comm_ = comm;
  MPI_Comm_rank(*comm, &rank_);
  first_world_rank_ = mpi.rank() - rank_;  // the leader's world rank
}

MpiGroup::~MpiGroup() {
  auto* comm = static_cast<MPI_Comm*>(comm_);
  MPI_Comm_free(comm);
  delete comm;
}

std::string MpiGroup::broadcast(const std::string& bytes) const {
  uint64_t n = bytes.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, as_comm(comm_));
  PARITY_CHECK(n < uint64_t(1) << 31, "tensor parallel: a group message of {} bytes", n);
  std::string out = leader() ? bytes : std::string(size_t(n), '\0');
  if (n > 0) MPI_Bcast(out.data(), int(n), MPI_BYTE, 0, as_comm(comm_));
  return out;
}

bool MpiGroup::same(uint64_t value) const {
  const uint64_t mine[2] = {value, ~value};
  uint64_t most[2] = {0, 0};
  MPI_Allreduce(mine, most, 2, MPI_UINT64_T, MPI_MAX, as_comm(comm_));
  return most[0] == ~most[1];  // the largest value is also the smallest
}

int64_t MpiGroup::min(int64_t value) const {
  int64_t out = value;
  MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MIN, as_comm(comm_));
  return out;
}

std::unique_ptr<StepRunner> make_mpi_group_leader(const MpiGroup& group,
                                                  std::unique_ptr<StepRunner> own) {
  return std::make_unique<LeaderRunner>(group, std::move(own));
}

void follow_group_leader(const MpiGroup& group, StepRunner& runner) {
  for (;;) {
    const StepMessage m = decode_step_message(group.broadcast({}));
    switch (m.kind) {
      case StepMessage::Kind::step: {
        const std::vector<TokenId> tokens = runner.step(m.batch, m.samples, m.sampling);
        PARITY_CHECK(group.same(token_hash(tokens)),
                     "tensor parallel: rank {} of an MPI group sampled other tokens than its "
                     "leader",
                     group.rank());
        break;
      }
      case StepMessage::Kind::release:
        runner.release(m.seq);
        break;
      case StepMessage::Kind::reset:
        runner.reset();
        break;
      case StepMessage::Kind::stop:
        return;
    }
  }
}

}  // namespace parity
