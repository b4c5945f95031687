#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/harmony.h"
#include "model/error.h"
#include "model/forward.h"

namespace parity {

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::context:
      return "context";
  }
  return "?";
}

double EngineStats::ttft_percentile(double q) const {
  if (ttft_seconds.empty()) return 0;
  std::vector<double> v = ttft_seconds;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(q * double(v.size())));
  return v[std::clamp(rank, size_t(1), v.size()) - 1];
}

Engine::Engine(Backend& backend, const EngineOptions& options)
    : backend_(backend), options_(options) {
  options_.sampling.validate();
  if (options_.max_tokens < 1) fail("--max-tokens {}: at least one token", options_.max_tokens);
  const int model_context = backend_.config().max_position_embeddings;
  context_ = options_.context == 0 ? model_context : options_.context;
  if (context_ < 1 || context_ > model_context)
    fail("context of {} positions: the model has {}", context_, model_context);
  Scheduler check(options_.limits);  // validates the limits
  (void)check;
}

std::string Engine::check_prompt(const std::vector<TokenId>& prompt) const {
  if (prompt.empty()) return "empty prompt";
  if (prompt.size() > size_t(context_))
    return fmt::format("{} prompt tokens, longer than the context of {} positions", prompt.size(),
                       context_);
  const int vocab = backend_.config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      return fmt::format("token {} at index {} is outside the model's vocabulary of {}", prompt[i],
                         i, vocab);
  return "";
}

std::vector<EngineResult> Engine::run(const std::vector<EngineRequest>& requests,
                                      const TokenCallback& on_token) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto since_start = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  stats_ = EngineStats{};
  stats_.requests = requests.size();
  stats_.ttft_seconds.assign(requests.size(), 0);
  std::vector<EngineResult> results(requests.size());

  Scheduler scheduler(options_.limits);
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string why = check_prompt(requests[i].prompt);
    if (!why.empty()) fail("request {}: {}", requests[i].id, why);
    stats_.prompt_tokens += int64_t(requests[i].prompt.size());
    scheduler.enqueue(i, requests[i].prompt);
  }
  backend_.reset();
  std::vector<double> logits;
  while (!scheduler.idle()) {
    scheduler.admit();
    StepPlan plan = scheduler.plan();
    PARITY_CHECK(plan.batch.rows() > 0, "a step with no rows and {} sequences running",
                 scheduler.running());
    const auto step_start = Clock::now();
    forward(backend_, plan.batch);
    for (const StepPlan::Sample& s : plan.samples) {
      ScheduledSequence& seq = scheduler.sequence(s.slot);
      const StageData row = backend_.read(Stage::logits, kModelLayer, s.row);
      logits.resize(row.size());
      for (size_t i = 0; i < row.size(); ++i) logits[i] = row.at(i);
      EngineResult& result = results[seq.request];
      const uint64_t step = result.generated.size();
      const TokenId token = sample_token(logits, options_.sampling, requests[seq.request].id, step);
      if (result.generated.empty()) stats_.ttft_seconds[seq.request] = since_start();
      result.generated.push_back(token);
      ++stats_.generated_tokens;
      if (on_token) on_token(seq.request, token);
      const bool stop = std::find(options_.stop_tokens.begin(), options_.stop_tokens.end(),
                                  token) != options_.stop_tokens.end();
      const bool length = int(result.generated.size()) >= options_.max_tokens;
      // The new token would run at position tokens.size() (before the append): past the end?
      const bool full = seq.tokens.size() >= size_t(context_);
      if (stop || length || full) {
        result.finish = stop     ? FinishReason::stop
                        : length ? FinishReason::length
                                 : FinishReason::context;
        result.ttft_seconds = stats_.ttft_seconds[seq.request];
        scheduler.retire(s.slot);
      } else {
        scheduler.append(s.slot, token);
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    const double rows = plan.prefill_rows + plan.decode_rows;
    stats_.prefill_seconds += seconds * plan.prefill_rows / rows;
    stats_.decode_seconds += seconds * plan.decode_rows / rows;
    stats_.prefill_rows += plan.prefill_rows;
    stats_.decode_rows += plan.decode_rows;
    ++stats_.steps;
  }
  stats_.wall_seconds = since_start();
  return results;
}

std::vector<TokenId> model_stop_tokens(const std::string& model_dir, const Tokenizer& tokenizer) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return harmony_stop_tokens(tokenizer);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) fail("cannot read {}", path.string());
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", path.string());
  if (!j.contains("eos_token_id")) return harmony_stop_tokens(tokenizer);
  const nlohmann::json& eos = j["eos_token_id"];
  std::vector<TokenId> ids;
  const auto add = [&](const nlohmann::json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxTokenId)
      fail("{}: eos_token_id holds {}, not a token id", path.string(), v.dump());
    ids.push_back(v.get<TokenId>());
  };
  if (eos.is_array()) {
    for (const auto& v : eos) add(v);
  } else {
    add(eos);
  }
  if (ids.empty()) return harmony_stop_tokens(tokenizer);
  return ids;
}

}  // namespace parity
