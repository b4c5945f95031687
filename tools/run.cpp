// run: the production engine's command line (engine/engine.h on a Backend).
//   run MODEL -m generate -i "prompt"            text streamed as it is generated
//   run MODEL -m getp -i requests.txt -o out.txt  a file of prompts, token ids out
//   run DIR -m tokenize|detokenize -i FILE        the tokenizer alone
// Exit 0 when every request ran, 1 when some request failed, 2 on an error.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "engine/engine.h"
#include "engine/harmony.h"
#include "engine/requests.h"
#include "engine/tiny_tokenizer.h"
#include "engine/tokenizer.h"
#include "engine/utf8.h"
#include "model/checkpoint.h"
#include "model/error.h"
#include "tools/common.h"

namespace parity {
namespace {

namespace fs = std::filesystem;

// The first id of o200k_harmony's special tokens: a model with a smaller vocabulary uses the tiny
// layout (engine/tiny_tokenizer.h) when its directory has no tokenizer.json.
constexpr int kO200kSpecialStart = 199998;

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read the {} {}: {}", what, path, std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail("cannot read the {} {}: read error", what, path);
  return s.str();
}

// The tokenizer of the model in `dir`: its tokenizer.json, else, for a model of the tiny layout's
// vocabulary (below o200k's special tokens), the tiny tokenizer -- written into the directory when
// `write_tiny` (the `tiny` preset), otherwise made in memory.
Tokenizer model_tokenizer(const std::string& dir, bool write_tiny) {
  const fs::path json = fs::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (fs::is_regular_file(dir, ec) || fs::exists(json, ec))
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

std::vector<TokenId> parse_ids(const std::string& text, const std::string& path) {
  std::vector<TokenId> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i])) != 0) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && std::isspace(static_cast<unsigned char>(text[end])) == 0) ++end;
    TokenId id = 0;
    const auto [ptr, err] = std::from_chars(text.data() + i, text.data() + end, id);
    if (err != std::errc() || ptr != text.data() + end || id < 0)
      fail("{}: `{}` at byte {} is not a token id", path,
           text.substr(i, std::min<size_t>(end - i, 40)), i + 1);
    ids.push_back(id);
    i = end;
  }
  return ids;
}

struct RunFlags {
  std::string model, models_dir, mode = "generate", input, output, backend = "cpu-f32";
  bool text = false, harmony = false, allow_special = false;
  int max_tokens = 128, max_batch = 16, step_tokens = 256, context = 0;
  SamplingParams sampling;
};

void print_summary(const EngineStats& s, size_t failed) {
  const double decode_tps = s.decode_seconds > 0 ? double(s.decode_rows) / s.decode_seconds : 0;
  const double prefill_tps = s.prefill_seconds > 0 ? double(s.prefill_rows) / s.prefill_seconds : 0;
  std::cerr << fmt::format(
      "run: {} requests ({} failed), {} prompt tokens, {} generated, wall {:.3f} s, TTFT p50 "
      "{:.1f} ms p99 {:.1f} ms, decode {:.1f} tokens/s, prefill {:.1f} tokens/s\n",
      s.requests + failed, failed, s.prompt_tokens, s.generated_tokens, s.wall_seconds,
      s.ttft_percentile(0.5) * 1e3, s.ttft_percentile(0.99) * 1e3, decode_tps, prefill_tps);
}

// `text` into the -o file (whole or not at all), or onto standard output without one.
void emit(const RunFlags& f, const std::string& text) {
  if (f.output.empty() || f.output == "-")
    std::cout << text << std::flush;
  else
    write_file_atomically(f.output, text);
}

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::optional<Tokenizer> tokenizer;
};

Loaded load(const RunFlags& f) {
  Loaded l;
  const std::string dir = resolve_model(f.model, f.models_dir);
  const bool preset_tiny = f.model == "tiny" && !fs::is_directory(f.model);
  l.tokenizer.emplace(model_tokenizer(dir, preset_tiny));
  l.model = Model::load(dir);
  l.backend = make_backend(f.backend, *l.model);
  return l;
}

EngineOptions engine_options(const RunFlags& f, const Loaded& l) {
  EngineOptions o;
  o.limits.max_batch = f.max_batch;
  o.limits.step_tokens = f.step_tokens;
  o.max_tokens = f.max_tokens;
  o.context = f.context;
  o.sampling = f.sampling;
  o.stop_tokens = model_stop_tokens(l.model->dir, *l.tokenizer);
  return o;
}

std::vector<TokenId> prompt_tokens(const Tokenizer& t, const std::string& prompt, bool harmony) {
  return harmony ? harmony_user_prompt(t, prompt) : t.encode(prompt, false);
}

int generate(const RunFlags& f) {
  Loaded l = load(f);
  Engine engine(*l.backend, engine_options(f, l));
  const std::vector<TokenId> prompt = prompt_tokens(*l.tokenizer, f.input, f.harmony);
  if (const std::string why = engine.check_prompt(prompt); !why.empty()) {
    std::cerr << "run: request failed: " << why << "\n";
    return kExitDiverged;
  }
  StreamingDecoder decoder(*l.tokenizer);
  engine.run({{0, prompt}}, [&](size_t, TokenId id) {
    std::cout << (l.tokenizer->contains(id) ? decoder.push(id) : fmt::format("<|id {}|>", id))
              << std::flush;
  });
  std::cout << decoder.finish() << "\n" << std::flush;
  print_summary(engine.stats(), 0);
  return kExitOk;
}

int getp(const RunFlags& f) {
  const std::vector<RequestLine> lines = read_request_file(f.input);
  Loaded l = load(f);
  Engine engine(*l.backend, engine_options(f, l));
  std::vector<RequestOutcome> outcomes(lines.size());
  std::vector<EngineRequest> requests;
  std::vector<size_t> outcome_of;  // request index -> line index
  for (size_t i = 0; i < lines.size(); ++i) {
    outcomes[i].line = lines[i].line;
    outcomes[i].error = lines[i].error;
    if (!outcomes[i].error.empty()) continue;
    std::vector<TokenId> prompt;
    try {
      prompt = prompt_tokens(*l.tokenizer, lines[i].prompt, f.harmony);
    } catch (const Error& e) {
      outcomes[i].error = e.what();
      continue;
    }
    outcomes[i].error = engine.check_prompt(prompt);
    if (!outcomes[i].error.empty()) continue;
    requests.push_back({uint64_t(lines[i].line - 1), std::move(prompt)});
    outcome_of.push_back(i);
  }
  const std::vector<EngineResult> results = engine.run(requests);
  size_t failed = 0;
  std::string out;
  for (size_t r = 0; r < results.size(); ++r) {
    RequestOutcome& o = outcomes[outcome_of[r]];
    o.tokens = results[r].generated;
    if (f.text) o.text = text_of(*l.tokenizer, o.tokens);
  }
  for (const RequestOutcome& o : outcomes) {
    failed += o.error.empty() ? 0 : 1;
    out += format_outcome(o, f.text) + "\n";
  }
  emit(f, out);
  for (const RequestOutcome& o : outcomes)
    if (!o.error.empty()) std::cerr << fmt::format("run: line {}: {}\n", o.line, o.error);
  print_summary(engine.stats(), failed);
  return failed == 0 ? kExitOk : kExitDiverged;
}

std::string tokenizer_dir(const RunFlags& f) {
  std::error_code ec;
  if (fs::exists(f.model, ec)) return f.model;
  return resolve_model(f.model, f.models_dir);
}

int tokenize(const RunFlags& f) {
  const std::string dir = tokenizer_dir(f);
  const Tokenizer t = model_tokenizer(dir, f.model == "tiny" && !fs::exists(f.model));
  const std::vector<TokenId> ids = t.encode(read_text_file(f.input, "text file"), f.allow_special);
  emit(f, fmt::format("{}\n", fmt::join(ids, " ")));
  return kExitOk;
}

int detokenize(const RunFlags& f) {
  const std::string dir = tokenizer_dir(f);
  const Tokenizer t = model_tokenizer(dir, f.model == "tiny" && !fs::exists(f.model));
  const std::vector<TokenId> ids = parse_ids(read_text_file(f.input, "token id file"), f.input);
  emit(f, t.decode(ids));
  return kExitOk;
}

int run_main(int argc, char** argv) {
  CLI::App app{"run: gpt-oss inference with continuous batching on a parity backend"};
  RunFlags f;
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
  app.add_option("-n,--max-tokens", f.max_tokens, "generated tokens per request at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-t,--temperature", f.sampling.temperature, "0: greedy")->capture_default_str();
  app.add_option("--top-k", f.sampling.top_k, "0: off")->capture_default_str();
  app.add_option("--top-p", f.sampling.top_p, "1: off")->capture_default_str();
  app.add_option("-s,--seed", f.sampling.seed, "the sampling generator's seed")
      ->capture_default_str();
  app.add_option("--backend", f.backend, "reference, cpu-f32, hip")->capture_default_str();
  app.add_option("--max-batch", f.max_batch, "sequences running at once at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--step-tokens", f.step_tokens, "rows per step at most (prefill chunks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--context", f.context,
                 "positions per sequence, prompt and generation (0: the model's context)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--harmony", f.harmony, "wrap each prompt as a harmony user message");
  app.add_flag("--allow-special", f.allow_special,
               "tokenize: special tokens in the text (<|start|>, ...) become their ids");
  app.add_option("--models-dir", f.models_dir, "where presets live");
  if (const auto done = parse_command_line(app, "run", argc, argv)) return *done;
  f.sampling.validate();
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
