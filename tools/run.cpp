// run: the production engine's command line (engine/engine.h).
//   run MODEL -m generate -i "prompt"            text streamed as it is generated
//   run MODEL -m getp -i requests.txt -o out.txt  a file of prompts, token ids out
//   run DIR -m tokenize|detokenize -i FILE        the tokenizer alone
// --backend hip runs the device runner (engine/device_runner.h), one engine per GPU (--gpus);
// the host backends (reference, cpu-f32) run the engine through the forward graph. Under mpirun
// or srun each rank runs one engine (its local rank's GPU) and rank 0 hands out the requests
// (engine/mpi_work.h). Exit 0 when every request ran, 1 when some request failed, 2 on an error.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "device/runtime/kv_blocks.h"
#include "device/runtime/options.h"
#include "engine/engine.h"
#include "engine/graph_runner.h"
#include "tokenizer/harmony.h"
#include "engine/progress.h"
#include "engine/requests.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "model/untrusted.h"
#include "tools/common.h"
#ifdef PARITY_HAVE_DEVICE_ENGINE
#include "device/runtime/communicator.h"
#include "device/runtime/device.h"
#include "device/runtime/peer_group.h"
#include "device/runtime/serving_limits.h"
#include "device/runtime/weight_plan.h"
#include "engine/device_runner.h"
#include "engine/tensor_parallel_runner.h"
#endif
#ifdef PARITY_HAVE_MPI
#include "engine/mpi_group.h"
#include "engine/mpi_work.h"
#endif

namespace parity {
namespace {

namespace fs = std::filesystem;

// The first id of o200k_harmony's special tokens: a model with a smaller vocabulary uses the tiny
// layout (tokenizer/tiny_tokenizer.h) when its directory has no tokenizer.json.
constexpr int kO200kSpecialStart = 199998;

// The device backend's products without --precision: bf16, the production precision (BF16
// operands, FP32 accumulation, as vLLM, SGLang and TensorRT-LLM run), which the harness verifies
// by its own declared bounds (parity-trace --candidate hip --precision bf16) and which is 1.4x
// the fp32 path's throughput at 256 sequences and in prefill (docs/measurements.md). fp32, the
// exact path, gives the tokens of the traced fp32 backend.
constexpr device::Precision kDefaultPrecision = device::Precision::bf16;

// A text or token id file for tokenize and detokenize: read whole, so bounded.
constexpr uint64_t kMaxTextFileBytes = uint64_t(1) << 30;

// The tokenizer of the model in `dir`: its tokenizer.json, else, for a model of the tiny layout's
// vocabulary (below o200k's special tokens), the tiny tokenizer -- written into the directory when
// `write_tiny` (the `tiny` preset), otherwise made in memory.
Tokenizer model_tokenizer(const std::string& dir, bool write_tiny) {
  const fs::path json = fs::path(dir) / "tokenizer.json";
  std::error_code ec;
  // Anything named tokenizer.json (a dangling link, a directory) is read, and refused by the
  // reader, rather than passed over for the tiny layout.
  if (fs::is_regular_file(dir, ec) || fs::exists(fs::symlink_status(json, ec)))
    return Tokenizer::load(find_tokenizer_json(dir));
  if (fs::exists(fs::path(dir) / "config.json", ec)) {
    const Config c = Config::load((fs::path(dir) / "config.json").string());
    if (c.vocab_size >= kTinyMinVocab && c.vocab_size < kO200kSpecialStart) {
      const std::string text = tiny_tokenizer_json(c.vocab_size);
      if (write_tiny) write_file_atomically(json.string(), text);
      return Tokenizer::parse(text, json.string() + " (the tiny layout)");
    }
  }
  return Tokenizer::load(find_tokenizer_json(dir));  // the Error with the way out
}

// The bytes of `ids` (an id the tokenizer lacks as <|id N|>), made valid UTF-8.
std::string text_of(const Tokenizer& t, const std::vector<TokenId>& ids) {
  std::string bytes;
  for (TokenId id : ids) {
    if (t.contains(id))
      bytes += t.token_bytes(id);
    else
      bytes += fmt::format("<|id {}|>", id);
  }
  return utf8_lossy(bytes);
}

// The host backends' limits when none is given; the device backend sizes its own from the GPU's
// memory (device/runtime/serving_limits.h).
constexpr int kHostMaxBatch = 16;
constexpr int kHostStepTokens = 256;

struct RunFlags {
  std::string model, models_dir, mode = "generate", input, output, backend;
  std::string gpus, kv_memory;
  bool text = false, harmony = false, allow_special = false, kernel_times = false;
  bool no_progress = false, no_graphs = false;
  int max_tokens = 128, max_batch = kHostMaxBatch, step_tokens = kHostStepTokens, context = 0;
  int tensor_parallel = 1;  // GPUs per engine, the model split over them
  std::optional<std::string> all_reduce_name;  // --all-reduce as given
  bool max_batch_given = false, step_tokens_given = false;
  SamplingParams sampling;
  std::optional<std::string> precision_name;        // --precision as given
  device::Precision precision = kDefaultPrecision;  // the device backend's, from it
};

// `text` into the -o file (whole or not at all), or onto standard output without one.
void emit(const RunFlags& f, const std::string& text) {
  if (f.output.empty() || f.output == "-")
    std::cout << text << std::flush;
  else
    write_file_atomically(f.output, text);
}

bool device_backend(const RunFlags& f) {
  return is_device_backend(f.backend);
}

// The engines of this process: one per GPU with the device backend, one per --gpus worker on a
// host backend (each with a backend of its own), one under MPI (the rank's).
struct Workers {
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;
#ifdef PARITY_HAVE_DEVICE_ENGINE
  // An MPI group rank's NCCL communicator: its runner uses it, so it goes after the runner.
  std::unique_ptr<device::Communicator> comm;
#endif
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<StepRunner>> runners;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::string> names;
  std::string limits;  // the engines' --max-batch and --step-tokens, and where they come from
};

// Where this process's engines run: `count` GPUs (host workers), the first on device
// `first_device`; an engine takes `group` of them (--tensor-parallel), so there are count / group.
struct Placement {
  int count = 1;
  int first_device = 0;
  int group = 1;
};

Placement placement(const RunFlags& f, int mpi_local_rank, int mpi_local_size) {
  Placement p;
  if (mpi_local_rank >= 0 && !f.gpus.empty())
    fail("--gpus {}: under MPI each rank runs one GPU, its local rank's", parity::quoted(f.gpus, 20));
  int available = 0;
  if (device_backend(f)) {
#ifdef PARITY_HAVE_DEVICE_ENGINE
    available = device_count();
    if (available == 0)
      fail("backend {}: no GPU here ({})", f.backend, device_unavailable_reason());
#else
    fail("backend {}: this build has no device backend (configure with -DGPU=cuda or -DGPU=hip)",
         f.backend);
#endif
  }
  p.group = f.tensor_parallel;
  if (f.tensor_parallel > 1 && !device_backend(f))
    fail("--tensor-parallel {}: the device backend's (--backend hip)", f.tensor_parallel);
  if (mpi_local_rank >= 0) {
    // One GPU a rank; a tensor-parallel group's ranks are MPI ranks (engine/mpi_group.h), its
    // rank's runner attached after load (attach_group_runner).
    p.group = 1;
    if (device_backend(f) && mpi_local_size > available)
      fail("MPI: {} ranks on this host, which has {} GPUs (one rank per GPU)", mpi_local_size,
           available);
    p.first_device = mpi_local_rank;
    return p;
  }
  int n = p.group;
  if (f.gpus == "all") {
    n = device_backend(f) ? available / p.group * p.group : 1;
  } else if (!f.gpus.empty()) {
    const auto [ptr, err] = std::from_chars(f.gpus.data(), f.gpus.data() + f.gpus.size(), n);
    if (err != std::errc() || ptr != f.gpus.data() + f.gpus.size() || n < 1)
      fail("--gpus {}: `all` or a positive number", parity::quoted(f.gpus, 20));
    if (n % p.group != 0)
      fail("--gpus {}: not a whole number of groups of --tensor-parallel {}", n, p.group);
  }
  if (device_backend(f) && (n > available || n == 0))
    fail("{} {} GPU{}, but this host has {}",
         p.group > 1 ? fmt::format("--tensor-parallel {} takes", p.group) : "--gpus: asked for",
         std::max(n, p.group), std::max(n, p.group) == 1 ? "" : "s", available);
  p.count = n;
  return p;
}

// 0 for `free` (the default: the device engine takes 90 % of the memory its weights leave free,
// a host engine has no limit).
size_t kv_memory_bytes(const RunFlags& f) {
  return f.kv_memory.empty() || f.kv_memory == "free" ? 0
                                                      : parse_byte_size(f.kv_memory, "--kv-memory");
}

#ifdef PARITY_HAVE_DEVICE_ENGINE
// The device engines' limits: those given, the others sized from the memory of the GPU of
// `where` with the least free (device/runtime/serving_limits.h), before any runtime loads.
device::ServingLimits device_limits(const RunFlags& f, const Model& m, const Placement& where,
                                    size_t kv_bytes) {
  device::ServingMemory s;
  s.free_bytes = SIZE_MAX;
  for (int i = 0; i < where.count; ++i)
    s.free_bytes =
        std::min(s.free_bytes, device::Device::open(where.first_device + i).free_bytes());
  Config c = m.config;
  if (where.group == 1) {
    s.weights_bytes = device::plan_weights(m).total;
  } else {  // the largest rank's part, its activations, and the all-reduces' parts
    const auto shard = [&](int r) {
      return device::ShardPlan::of(m.config, where.group, r, device::ExpertSplit::by_intermediate);
    };
    for (int r = 0; r < where.group; ++r)
      s.weights_bytes = std::max(s.weights_bytes, device::plan_weights(m, shard(r)).total);
    c = device::rank_config(m.config, shard(0));  // rank 0 holds the largest slices
  }
  device::DeviceOptions o;
  o.max_context = f.context;
  s.max_context = o.resolve_max_context(m.config);
  s.kv_block_size = o.kv_block_size;
  s.kv_free_fraction = o.kv_free_fraction;
  s.kv_bytes = kv_bytes;
  s.step_tokens = f.step_tokens_given ? f.step_tokens : 0;
  s.max_batch = f.max_batch_given ? f.max_batch : 0;
  s.precision = f.precision;
  if (where.group > 1) {
    const int rows = std::max(s.step_tokens, s.max_batch) > 0 ? std::max(s.step_tokens, s.max_batch)
                                                              : device::kServingMaxStepTokens;
    s.weights_bytes +=
        size_t(where.group) * sizeof(float) *
        size_t(device::shard_join_floats(c, where.group, rows, device::kShardJoinRows));
    s.weights_bytes += device::PeerGroup::bytes_per_rank(where.group);  // when it is set up
  }
  return device::size_serving_limits(c, s);
}
#endif

EngineOptions engine_options(const RunFlags& f, const Workers& w, SchedulerLimits limits) {
  EngineOptions o;
  o.limits = limits;
  o.max_tokens = f.max_tokens;
  o.context = f.context;
  o.sampling = f.sampling;
  o.stop_tokens = model_stop_tokens(w.model->dir, *w.tokenizer);
  return o;
}

Workers load(const RunFlags& f, int mpi_local_rank = -1, int mpi_local_size = 1) {
  Workers w;
  // Before anything is sized by them (the device's step arena, the engines' slots).
  SchedulerLimits{f.max_batch, f.step_tokens}.validate();
  const Placement where = placement(f, mpi_local_rank, mpi_local_size);
  const std::string dir = resolve_model(f.model, f.models_dir);
  const bool preset_tiny = f.model == "tiny" && !fs::is_directory(f.model);
  w.tokenizer.emplace(model_tokenizer(dir, preset_tiny && mpi_local_rank <= 0));
  w.model = Model::load(dir);
  size_t kv_bytes = kv_memory_bytes(f);
  SchedulerLimits limits{f.max_batch, f.step_tokens};
  w.limits = fmt::format("--max-batch {}{}, --step-tokens {}{}", f.max_batch,
                         f.max_batch_given ? "" : " (the host backends' default)", f.step_tokens,
                         f.step_tokens_given ? "" : " (the host backends' default)");
  // Before any GPU is touched: one line naming what the degree does not divide.
  if (f.tensor_parallel > 1)
    if (const std::string why = device::tensor_parallel_problem(
            w.model->config, f.tensor_parallel, device::ExpertSplit::by_intermediate);
        !why.empty())
      fail("--tensor-parallel {}: {}: {}", f.tensor_parallel, dir, why);
  // Under MPI a tensor-parallel rank's runner is attached once the world agreed that every rank
  // loaded (attach_group_runner): its setup meets the group's other ranks.
  if (mpi_local_rank >= 0 && f.tensor_parallel > 1) return w;
  w.runners.resize(size_t(where.count / where.group));
  if (device_backend(f)) {
#ifdef PARITY_HAVE_DEVICE_ENGINE
    // A group's ranks hold KV pools of one size: sized here unless --kv-memory gives it.
    if (!f.max_batch_given || !f.step_tokens_given || (where.group > 1 && kv_bytes == 0)) {
      const device::ServingLimits sized = device_limits(f, *w.model, where, kv_bytes);
      limits = {sized.max_batch, sized.step_tokens};
      // The pool it sized beside the largest step's activations, unless --kv-memory set one (even
      // one too small: the runtime refuses that with its sizes).
      if (kv_bytes == 0) kv_bytes = sized.kv_bytes;
      w.limits = sized.text();
      if (where.group > 1) w.limits += fmt::format(" (per GPU of a group of {})", where.group);
    } else {
      w.limits =
          fmt::format("--max-batch {}, --step-tokens {} (given)", f.max_batch, f.step_tokens);
    }
    // Each engine loads its weights on a thread of its own (a group's ranks on threads of theirs).
    std::vector<std::exception_ptr> errors(w.runners.size());
    std::vector<std::thread> threads;
    for (int i = 0; i < int(w.runners.size()); ++i)
      threads.emplace_back([&, i] {
        try {
          device::DeviceOptions o;
          o.device = where.first_device + i * where.group;
          o.max_context = f.context;
          o.kv_bytes = kv_bytes;
          o.arena_rows = o.max_step_rows = std::max(limits.step_tokens, limits.max_batch);
          o.graphs = !f.no_graphs;
          o.precision = f.precision;
          if (f.all_reduce_name)
            o.tensor_parallel.all_reduce =
                device::parse_all_reduce(*f.all_reduce_name, "--all-reduce");
          if (i == 0 && mpi_local_rank <= 0)
            o.log = [](const std::string& text) { std::cerr << text << std::flush; };
          if (where.group == 1) {
            w.runners[size_t(i)] = make_device_runner(*w.model, o, f.kernel_times);
          } else {
            std::vector<int> devices(size_t(where.group));
            for (int r = 0; r < where.group; ++r) devices[size_t(r)] = o.device + r;
            w.runners[size_t(i)] =
                make_tensor_parallel_runner(*w.model, o, devices, f.kernel_times);
          }
        } catch (...) {
          errors[size_t(i)] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
#endif
  } else {
    if (f.kernel_times) fail("--kernel-times: the device backend's (--backend hip)");
    if (f.no_graphs) fail("--no-graphs: the device backend's (--backend hip)");
    int kv_blocks = 0;
    const int block_size = device::kDefaultKvBlockSize;
    if (kv_bytes > 0) {
      const size_t block = device::KvLayout::of(w.model->config, block_size).block_bytes();
      if (kv_bytes < block)
        fail("--kv-memory {}: less than one KV-cache block ({} bytes)", f.kv_memory, block);
      kv_blocks = int(std::min<size_t>(kv_bytes / block, size_t(INT32_MAX)));
    }
    for (int i = 0; i < where.count; ++i) {
      w.backends.push_back(make_backend(f.backend, *w.model));
      w.runners[size_t(i)] = std::make_unique<GraphRunner>(*w.backends.back(), kv_blocks, block_size);
    }
  }
  const EngineOptions o = engine_options(f, w, limits);
  for (auto& r : w.runners) {
    w.engines.push_back(std::make_unique<Engine>(*r, o));
    w.names.push_back(device_backend(f) ? r->name()
                                        : fmt::format("engine {}: {}", w.names.size(), r->name()));
  }
  return w;
}

#if defined(PARITY_HAVE_MPI) && defined(PARITY_HAVE_DEVICE_ENGINE)
// Runs `local` on this rank, then agrees with its group: true when it went well on every rank. A
// rank whose own part failed rethrows its error; the others return false, and every rank then
// skips the group's remaining collectives alike (the world's agreement after says who failed).
bool group_step(const MpiGroup& g, const std::function<void()>& local) {
  std::exception_ptr e;
  try {
    local();
  } catch (...) {
    e = std::current_exception();
  }
  const bool every = g.min(e ? 0 : 1) == 1;
  if (e) std::rethrow_exception(e);
  return every;
}

// What the ranks of a group compare: the model's shape and its weights' bytes.
uint64_t model_identity(const Model& m) {
  const Config& c = m.config;
  uint64_t h = device::plan_weights(m).total;
  for (const int64_t x :
       {int64_t(c.hidden_size), int64_t(c.num_hidden_layers), int64_t(c.num_local_experts),
        int64_t(c.vocab_size), int64_t(c.num_attention_heads), int64_t(c.num_key_value_heads),
        int64_t(c.intermediate_size)})
    h = h * 1099511628211ull ^ uint64_t(x);
  return h;
}

// This MPI rank's part of its tensor-parallel group (engine/mpi_group.h), after load: the
// group's limits (each rank sizes them from its GPU; the smallest go), the same model on every
// rank, NCCL's communicator from the leader's id, and its runner: the leader's sends every call
// to the group and gets the engine; the others' replay them (follow_group_leader). Returns with
// no runner when another rank of the group failed.
void attach_group_runner(const RunFlags& f, Workers& w, const MpiGroup& g, int local_rank) {
  const int degree = g.size();
  SchedulerLimits limits{f.max_batch, f.step_tokens};
  size_t kv_bytes = kv_memory_bytes(f);
  const bool sizing = !f.max_batch_given || !f.step_tokens_given || kv_bytes == 0;
  device::ServingLimits sized;
  if (!group_step(g, [&] {
        if (local_rank >= device_count())
          fail("MPI: local rank {} on a host with {} GPUs (one rank per GPU)", local_rank,
               device_count());
        if (sizing) sized = device_limits(f, *w.model, Placement{1, local_rank, degree}, kv_bytes);
      }))
    return;
  if (sizing) {  // the group's smallest: every rank's pool and steps are the same
    if (!f.max_batch_given) limits.max_batch = int(g.min(sized.max_batch));
    if (!f.step_tokens_given) limits.step_tokens = int(g.min(sized.step_tokens));
    if (kv_bytes == 0) kv_bytes = size_t(g.min(int64_t(sized.kv_bytes)));
  }
  w.limits = fmt::format(
      "--max-batch {}, --step-tokens {}, KV cache {:.2f} GiB per GPU ({} of an MPI group of {})",
      limits.max_batch, limits.step_tokens, double(kv_bytes) / double(1 << 30),
      sizing ? "sized from the memory, the smallest" : "given", degree);
  if (!g.same(model_identity(*w.model)))
    fail(
        "tensor parallel: the ranks of the MPI group of world ranks {}..{} loaded different models",
        g.first_world_rank(), g.first_world_rank() + degree - 1);
  device::NcclId id{};
  if (!group_step(g, [&] {
        if (g.leader()) id = device::nccl_unique_id();
      }))
    return;
  const std::string got = g.broadcast(g.leader() ? std::string(id.data(), id.size()) : "");
  PARITY_CHECK(got.size() == id.size(), "tensor parallel: an NCCL id of {} bytes", got.size());
  std::memcpy(id.data(), got.data(), id.size());
  w.comm = device::nccl_rank(id, degree, g.rank(), local_rank);
  std::unique_ptr<StepRunner> runner;
  if (!group_step(g, [&] {
        device::DeviceOptions o;
        o.device = local_rank;
        o.max_context = f.context;
        o.kv_bytes = kv_bytes;
        o.arena_rows = o.max_step_rows = std::max(limits.step_tokens, limits.max_batch);
        o.graphs = !f.no_graphs;
        o.precision = f.precision;
        o.tensor_parallel.degree = degree;
        o.tensor_parallel.rank = g.rank();
        o.tensor_parallel.comm = w.comm.get();
        if (g.first_world_rank() == 0 && g.leader())
          o.log = [](const std::string& text) { std::cerr << text << std::flush; };
        runner = make_device_runner(*w.model, o, f.kernel_times);
      }))
    return;
  if (!g.same(uint64_t(runner->kv_blocks())))
    fail(
        "tensor parallel: the ranks of an MPI group hold KV pools of different sizes: give "
        "--kv-memory");
  if (!g.leader()) {
    w.runners.push_back(std::move(runner));
    return;
  }
  w.runners.push_back(make_mpi_group_leader(g, std::move(runner)));
  w.engines.push_back(std::make_unique<Engine>(*w.runners.back(), engine_options(f, w, limits)));
  w.names.push_back(w.runners.back()->name());
}
#endif

std::vector<TokenId> prompt_tokens(const Tokenizer& t, const std::string& prompt, bool harmony) {
  return harmony ? harmony_user_prompt(t, prompt) : t.encode(prompt, false);
}

// The device engines' kernel times (--kernel-times) and how their steps were launched.
void print_device_reports(const Workers& w) {
  for (size_t i = 0; i < w.runners.size(); ++i) {
    if (const std::string t = w.runners[i]->kernel_times(); !t.empty())
      std::cerr << fmt::format("run: kernel times, {}\n{}", w.names[i], t);
    if (const std::string l = w.runners[i]->launches(); !l.empty())
      std::cerr << fmt::format("run: {}: {}\n", w.names[i], l);
  }
}

int generate(const RunFlags& f) {
  Workers w = load(f);
  Engine& engine = *w.engines.front();
  const std::vector<TokenId> prompt = prompt_tokens(*w.tokenizer, f.input, f.harmony);
  if (const std::string why = engine.check_prompt(prompt); !why.empty()) {
    std::cerr << "run: request failed: " << why << "\n";
    return kExitDiverged;
  }
  StreamingDecoder decoder(*w.tokenizer);
  engine.run({{0, prompt}}, [&](size_t, TokenId id) {
    std::cout << (w.tokenizer->contains(id) ? decoder.push(id) : fmt::format("<|id {}|>", id))
              << std::flush;
  });
  std::cout << decoder.finish() << "\n" << std::flush;
  std::cerr << summary_text(engine.stats(), {engine.stats()}, {w.names.front()});
  print_device_reports(w);
  return kExitOk;
}

// The request file's lines, tokenized: requests for the engines (id = line number - 1) and, per
// line, its outcome so far (errors of reading or tokenizing).
struct Prepared {
  std::vector<RequestOutcome> outcomes;
  std::vector<EngineRequest> requests;
  std::vector<size_t> outcome_of;  // request -> line
};

Prepared prepare(const RunFlags& f, const std::vector<RequestLine>& lines, const Tokenizer& t) {
  Prepared p;
  p.outcomes.resize(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    p.outcomes[i].line = lines[i].line;
    p.outcomes[i].error = lines[i].error;
    if (!p.outcomes[i].error.empty()) continue;
    try {
      EngineRequest r;
      r.id = uint64_t(lines[i].line - 1);
      // Token ids run as they are (--harmony wraps text prompts only).
      r.prompt = lines[i].prompt_ids.empty() ? prompt_tokens(t, lines[i].prompt, f.harmony)
                                             : lines[i].prompt_ids;
      r.max_tokens = lines[i].max_tokens;
      r.ignore_eos = lines[i].ignore_eos;
      p.requests.push_back(std::move(r));
      p.outcome_of.push_back(i);
    } catch (const Error& e) {
      p.outcomes[i].error = e.what();
    }
  }
  return p;
}

// Writes the output and the errors; the exit code.
int finish_getp(const RunFlags& f, Prepared& p, std::vector<EngineResult> results,
                const Tokenizer& t) {
  for (size_t r = 0; r < results.size(); ++r) {
    RequestOutcome& o = p.outcomes[p.outcome_of[r]];
    if (results[r].finish == FinishReason::error) {
      o.error = results[r].error;
      continue;
    }
    o.tokens = std::move(results[r].generated);
    if (f.text) o.text = text_of(t, o.tokens);
  }
  size_t failed = 0;
  std::string out;
  for (const RequestOutcome& o : p.outcomes) {
    failed += o.error.empty() ? 0 : 1;
    out += format_outcome(o, f.text) + "\n";
  }
  emit(f, out);
  for (const RequestOutcome& o : p.outcomes)
    if (!o.error.empty()) std::cerr << fmt::format("run: line {}: {}\n", o.line, o.error);
  return failed == 0 ? kExitOk : kExitDiverged;
}

// Lines that failed before reaching an engine count as failed requests in the summary.
EngineStats with_line_errors(EngineStats total, const Prepared& p) {
  const size_t early = p.outcomes.size() - p.requests.size();
  total.requests += early;
  total.failed += early;
  return total;
}

int getp(const RunFlags& f) {
  const std::vector<RequestLine> lines = read_request_file(f.input);
  Workers w = load(f);
  std::cerr << "run: limits: " << w.limits << "\n";
  Prepared p = prepare(f, lines, *w.tokenizer);
  LocalQueue queue(p.requests);
  Progress progress(std::cerr, queue.size(), isatty(STDERR_FILENO) == 1, !f.no_progress);
  const auto start = Clock::now();
  std::vector<std::exception_ptr> errors(w.engines.size());
  std::vector<std::thread> threads;
  std::atomic<size_t> running = w.engines.size();
  for (size_t i = 0; i < w.engines.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        w.engines[i]->run(queue, {}, start, int(i));
      } catch (...) {
        errors[i] = std::current_exception();
      }
      --running;
    });
  for (auto shown = start; running > 0;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (Clock::now() - shown < std::chrono::milliseconds(200)) continue;
    shown = Clock::now();
    progress.update(queue.completed(), queue.generated_tokens());
  }
  for (std::thread& t : threads) t.join();
  progress.update(queue.completed(), queue.generated_tokens());
  progress.finish();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  const int code = finish_getp(f, p, queue.take_results(), *w.tokenizer);
  std::vector<EngineStats> per;
  EngineStats total;
  for (const auto& e : w.engines) {
    per.push_back(e->stats());
    total.merge(e->stats());
  }
  std::cerr << summary_text(with_line_errors(total, p), per, w.names);
  print_device_reports(w);
  return code;
}

#ifdef PARITY_HAVE_MPI
// getp on every rank of an MPI world: rank 0 hands out the requests and writes; the others run.
// `lines` (rank 0's) and `w` are read and loaded on every rank before.
int getp_mpi(const RunFlags& f, const MpiSession& mpi, const std::vector<RequestLine>& lines,
             Workers& w, const MpiGroup* group) {
  if (group != nullptr && !group->leader()) {
    follow_group_leader(*group, *w.runners.front());
    return kExitOk;
  }
  if (mpi.rank() != 0) {
    work_for_rank0(mpi, *w.engines.front());
    return kExitOk;
  }
  const int engine_every = group != nullptr ? group->size() : 1;
  std::cerr << "run: limits: " << w.limits << "\n";
  Prepared p = prepare(f, lines, *w.tokenizer);
  LocalQueue queue(p.requests);
  Progress progress(std::cerr, queue.size(), isatty(STDERR_FILENO) == 1, !f.no_progress);
  std::vector<EngineStats> per;
  serve_work(
      mpi, queue,
      [&] {
        w.engines.front()->run(queue, {}, Clock::now(), 0);
        return w.engines.front()->stats();
      },
      per, [&] { progress.update(queue.completed(), queue.generated_tokens()); }, engine_every);
  progress.finish();
  const int code = finish_getp(f, p, queue.take_results(), *w.tokenizer);
  EngineStats total;
  std::vector<EngineStats> engines;
  std::vector<std::string> names;
  for (size_t r = 0; r < per.size(); r += size_t(engine_every)) {
    total.merge(per[r]);
    engines.push_back(per[r]);
    names.push_back(engine_every == 1
                        ? fmt::format("rank {}", r)
                        : fmt::format("ranks {}..{}", r, r + size_t(engine_every) - 1));
  }
  std::cerr << summary_text(with_line_errors(total, p), engines, names);
  print_device_reports(w);
  return code;
}
#endif

std::string tokenizer_dir(const RunFlags& f) {
  std::error_code ec;
  if (fs::exists(f.model, ec)) return f.model;
  return resolve_model(f.model, f.models_dir);
}

int tokenize(const RunFlags& f) {
  const std::string dir = tokenizer_dir(f);
  const Tokenizer t = model_tokenizer(dir, f.model == "tiny" && !fs::exists(f.model));
  const std::string text = read_small_file(f.input, kMaxTextFileBytes, "text file");
  if (const size_t bad = utf8_invalid_offset(text); bad != std::string::npos)
    fail("{}: invalid UTF-8 at byte {} (line {}): {}", f.input, bad + 1,
         std::count(text.begin(), text.begin() + long(bad), '\n') + 1,
         quoted(text.substr(bad, 4), 20));
  const std::vector<TokenId> ids = t.encode(text, f.allow_special);
  emit(f, fmt::format("{}\n", fmt::join(ids, " ")));
  return kExitOk;
}

int detokenize(const RunFlags& f) {
  const std::string dir = tokenizer_dir(f);
  const Tokenizer t = model_tokenizer(dir, f.model == "tiny" && !fs::exists(f.model));
  emit(f, decode_token_id_file(read_small_file(f.input, kMaxTextFileBytes, "token id file"),
                               f.input, t));
  return kExitOk;
}

void add_run_options(CLI::App& app, RunFlags& f) {
  app.add_option("model", f.model,
                 "checkpoint directory or preset (tiny, 20b, 120b); for "
                 "tokenize/detokenize also a tokenizer directory")
      ->required();
  app.add_option("-m,--mode", f.mode, "generate, getp, tokenize or detokenize")
      ->check(CLI::IsMember({"generate", "getp", "tokenize", "detokenize"}))
      ->capture_default_str();
  app.add_option("-i,--input", f.input,
                 "generate: the prompt; getp: the request file; tokenize/detokenize: the file")
      ->required();
  app.add_option("-o,--output", f.output,
                 "getp, tokenize, detokenize: the output file (standard output when absent)");
  app.add_flag("--text", f.text, "getp: the decoded text after a tab on each output line");
  add_decimal_option(app, "-n,--max-tokens", f.max_tokens, "generated tokens per request at most",
                     1);
  app.add_option("-t,--temperature", f.sampling.temperature, "0: greedy")->capture_default_str();
  add_decimal_option(app, "--top-k", f.sampling.top_k, "0: off", 0);
  app.add_option("--top-p", f.sampling.top_p, "1: off")->capture_default_str();
  add_decimal_option(app, "-s,--seed", f.sampling.seed,
                     "the sampling generator's seed (0 to 2^64 - 1)");
  app.add_option("--backend", f.backend,
                 "hip (the device engine), cpu-f32 or reference (the host backends); default hip "
                 "where a GPU is there and the build has the device engine, else cpu-f32")
      ->check(non_empty_value());
  app.add_option("--gpus", f.gpus,
                 "engines of this process: `all` or N GPUs with hip, one engine per GPU (per "
                 "group of --tensor-parallel GPUs), sharing one queue (N host engines with a "
                 "host backend); default 1 (one group)")
      ->check(non_empty_value());
  add_decimal_option(app, "--tensor-parallel", f.tensor_parallel,
                     "hip: GPUs per engine, the model split over them (attention by heads, the "
                     "experts by their intermediate dimension, lm_head by vocabulary; NCCL/RCCL "
                     "all-reduces); --gpus then counts GPUs in groups of it; default 1",
                     1);
  app.add_option_function<std::string>(
      "--all-reduce", [&f](const std::string& name) { f.all_reduce_name = name; },
      "with --tensor-parallel: peer (the default: each rank's partial sums stored into the other "
      "GPUs' memory by one kernel where they reach each other, NCCL otherwise) or nccl (NCCL's "
      "all-gather always); both add the parts in rank order, the same bits");
  app.add_option("--kv-memory", f.kv_memory,
                 "KV-cache size per engine: bytes with an optional K, M or G suffix, or `free` "
                 "(the default; hip: 90 % of what the weights leave free; host backends: no limit)")
      ->check(non_empty_value());
  app.add_flag("--kernel-times", f.kernel_times,
               "hip: time each stage's kernels with device events and print the table");
  app.add_option_function<std::string>(
      "--precision", [&f](const std::string& name) { f.precision_name = name; },
      fmt::format("hip: the precision of the products, fp32 (exact, the path the harness "
                  "traces) or bf16 (each product's input rounded once to BF16, FP32 "
                  "accumulation); default {}; a host backend takes fp32 alone",
                  device::precision_name(kDefaultPrecision)));
  app.add_flag("--no-progress", f.no_progress, "getp: no progress display");
  app.add_flag("--no-graphs", f.no_graphs,
               "hip: launch each kernel of a step on its own (default: a step's layers as one "
               "captured graph, replayed for the steps of its shape)");
  add_decimal_option(
      app, "--max-batch", f.max_batch,
      fmt::format("sequences running at once at most ({} at most); default: hip sizes it from "
                  "the GPU's memory (at most 512), a host backend {}",
                  SchedulerLimits::kMaxBatch, kHostMaxBatch),
      1);
  add_decimal_option(app, "--step-tokens", f.step_tokens,
                     fmt::format("rows per step at most (prefill chunks); default: hip sizes it "
                                 "from the GPU's memory (at most 4096), a host backend {}",
                                 kHostStepTokens),
                     1);
  add_decimal_option(app, "--context", f.context,
                     "positions per sequence, prompt and generation (0: the model's context)", 0);
  app.add_flag("--harmony", f.harmony, "wrap each prompt as a harmony user message");
  app.add_flag("--allow-special", f.allow_special,
               "tokenize: special tokens in the text (<|start|>, ...) become their ids");
  app.add_option("--models-dir", f.models_dir, "where presets live");
}

// What the options say before any file is read: sampling values, the default backend, the
// precision (bf16 is the device backend's alone), and which limits were given (the device backend
// sizes the others).
void check_flags(const CLI::App& app, RunFlags& f) {
  f.max_batch_given = app.count("--max-batch") > 0;
  f.step_tokens_given = app.count("--step-tokens") > 0;
  f.sampling.validate();
  if (f.backend.empty()) f.backend = default_candidate();
  if (f.precision_name) f.precision = backend_precision_option(*f.precision_name, f.backend);
  if (f.all_reduce_name) {
    (void)device::parse_all_reduce(*f.all_reduce_name, "--all-reduce");
    if (f.tensor_parallel < 2)
      fail("--all-reduce {}: a tensor-parallel group's (--tensor-parallel 2 or more)",
           *f.all_reduce_name);
  }
}

#ifdef PARITY_HAVE_MPI
// Standard output and error silenced for this scope (restored after), on ranks that must not
// repeat what rank 0 says.
class Silenced {
 public:
  explicit Silenced(bool silent) {
    if (!silent) return;
    out_ = std::cout.rdbuf(nullptr);
    err_ = std::cerr.rdbuf(nullptr);
    silent_ = true;
  }
  ~Silenced() {
    if (!silent_) return;
    std::cout.rdbuf(out_);
    std::cerr.rdbuf(err_);
    std::cout.clear();
    std::cerr.clear();
  }
  Silenced(const Silenced&) = delete;
  Silenced& operator=(const Silenced&) = delete;

 private:
  bool silent_ = false;
  std::streambuf* out_ = nullptr;
  std::streambuf* err_ = nullptr;
};

// run on several ranks: every rank parses the same command line (rank 0 alone reports what is
// wrong with it), then each checks and loads what it needs; an error found so far is printed
// once, by the first rank that found it, and every rank exits 2 through MPI_Finalize. An error
// once the work has started ends every rank at once (a rank may be waiting on the one that
// failed).
int run_mpi(const MpiSession& mpi, int argc, char** argv) {
  CLI::App app{"run: gpt-oss inference with continuous batching, on GPUs or the host"};
  RunFlags f;
  add_run_options(app, f);
  std::optional<int> done;
  {
    const Silenced quiet(mpi.rank() != 0);
    done = parse_command_line(app, "run", argc, argv);
  }
  if (done) return *done;
  const auto report = [&](const std::exception& e) {
    std::cerr << fmt::format("run: error: {}{}\n",
                             mpi.rank() == 0 ? "" : fmt::format("rank {}: ", mpi.rank()),
                             one_line(e.what(), 2000))
              << std::flush;
  };
  std::vector<RequestLine> lines;
  std::optional<MpiGroup> group;  // outlives the workers: the leader's runner talks to it
  std::optional<Workers> w;
  std::optional<std::exception_ptr> failure;
  // Every rank reaches each agreement, so that a rank that failed is reported once and nobody
  // waits for it in a collective.
  const auto agreed = [&] {
    const int failed = mpi.first_failing_rank(failure.has_value());
    if (failed < 0) return true;
    if (failed == mpi.rank()) {
      try {
        std::rethrow_exception(*failure);
      } catch (const std::exception& e) {
        report(e);
      }
    }
    return false;
  };
  try {
    check_flags(app, f);
    if (f.mode != "getp") fail("-m {}: under MPI only getp runs on several ranks", f.mode);
    if (mpi.rank() == 0) lines = read_request_file(f.input);
    w.emplace(load(f, mpi.local_rank(), mpi.local_size()));
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  if (!agreed()) return kExitError;
  if (f.tensor_parallel > 1) {
#ifdef PARITY_HAVE_DEVICE_ENGINE
    try {
      group.emplace(mpi, f.tensor_parallel);
      attach_group_runner(f, *w, *group, mpi.local_rank());
    } catch (const std::exception&) {
      failure = std::current_exception();
    }
    if (!agreed()) return kExitError;
#endif
  }
  try {
    return getp_mpi(f, mpi, lines, *w, group ? &*group : nullptr);
  } catch (const std::exception& e) {
    report(e);
    mpi.abort(kExitError);
  }
}
#endif

int run_main(int argc, char** argv) {
#ifdef PARITY_HAVE_MPI
  std::optional<MpiSession> mpi;
  if (launched_by_mpi()) {
    mpi.emplace(&argc, &argv);
    if (mpi->size() > 1) return run_mpi(*mpi, argc, argv);
  }
#endif
  CLI::App app{"run: gpt-oss inference with continuous batching, on GPUs or the host"};
  RunFlags f;
  add_run_options(app, f);
  if (const auto done = parse_command_line(app, "run", argc, argv)) return *done;
  check_flags(app, f);
  if (f.mode == "generate") return generate(f);
  if (f.mode == "getp") return getp(f);
  if (f.mode == "tokenize") return tokenize(f);
  return detokenize(f);
}

}  // namespace
}  // namespace parity

int main(int argc, char** argv) {
  parity::prefer_passive_openmp_wait(argv);
  return parity::guarded_main("run", [&] { return parity::run_main(argc, argv); });
}
