/* parity_capture: trace your own gpt-oss port into a gpt-oss-parity trace, from C, C++ or
 * HIP/CUDA host code, then diff it against the float64 reference with
 *
 *     parity-trace --model MODEL_DIR --candidate-trace capture.h5 --out DIR
 *
 * A capture is opened for a model directory (the checkpoint the port runs: its config and its
 * fingerprint are recorded, so a capture is never diffed against another model) and the token
 * ids at positions 0, 1, ...; then the port records the output row of each stage it wants
 * compared, for (position, layer[, expert slot]), and closes the capture. The file appears
 * under its name only when close() succeeds: each handle writes a temporary file of its own
 * (PATH.tmp-PID-N), which close() renames into place, so two handles on one path never share a
 * file and the last to close successfully is the file found there (a rename replaces it whole).
 *
 * Stages, their names and shapes are the stage list of gpt-oss-parity (model/stages.h), per
 * position (one token row):
 *
 *   embedding  [H]                 model scope (layer -1)
 *   attn_norm  [H]                 per layer
 *   qkv        [(nH + 2 nKV) d]    q | k | v, the q/k/v projections concatenated (pre-RoPE)
 *   q_rope     [nH, d]             half-split RoPE pairs (i, i + d/2), as the checkpoint stores q
 *   k_rope     [nKV, d]
 *   v          [nKV, d]
 *   scores     [nH, pos + 2]       scaled q.k for keys 0..pos, then the sink; masked keys -inf
 *   att        [nH, pos + 2]       softmax of scores (masked keys 0; the sink's share last)
 *   attn_out   [nH d]
 *   o_proj, resid_attn, ffn_norm [H]
 *   router     [E]                 router logits
 *   topk_idx   [k]  int32          selected experts, by descending router logit
 *   topk_w     [k]                 their routing weights (softmax over the k)
 *   mlp1       [k, 2 I]            per expert slot: gate/linear interleaved (even = gate)
 *   swiglu     [k, I]              per expert slot
 *   mlp2       [k, H]              per expert slot, bias included, before the routing weight
 *   moe_out, resid_ffn [H]
 *   final_norm [H], logits [V], sampled [1] int32   model scope (layer -1)
 *
 * Expert stages are recorded either whole (slot -1, [k, n] in topk_idx's slot order) or one
 * slot at a time (slot 0..k-1, [n]); every other stage takes slot -1. Stages a port does not
 * record are reported as "not captured" by the diff, never as a pass.
 *
 * Layouts ports really use are declared per record and converted here, so a port need not
 * reshape its tensors (flags may be combined where they apply):
 *   PARITY_LAYOUT_ROPE_INTERLEAVED  q/k heads in interleaved RoPE pairs (2i, 2i+1) instead of
 *                                   half-split (i, i + d/2): q_rope, k_rope, and the q and k
 *                                   parts of qkv (ports that permute the weights, as the Metal
 *                                   format does, have them so before RoPE too)
 *   PARITY_LAYOUT_SINK_FIRST        scores, att: the sink is column 0, keys 0..pos follow
 *   PARITY_LAYOUT_NO_SINK           att only: [nH, pos + 1] without the sink's column; its share
 *                                   is taken as 1 - sum of the keys' (what a correct softmax with
 *                                   a sink leaves; a softmax without the sink leaves 0)
 *   PARITY_LAYOUT_GATE_UP_HALVES    mlp1: [gate (I) | linear (I)] instead of interleaved
 *   PARITY_LAYOUT_QKV_Q / _K / _V   qkv: this record is only the q [nH d], k or v [nKV d] part;
 *                                   the row is complete when all three are recorded
 *
 * Errors are found at the call: an unknown stage, a layer, position or slot out of range, a
 * count that is not the stage's shape, a dtype the stage cannot take, a layout that does not
 * apply, a row recorded twice. Every function returns PARITY_CAPTURE_OK (0) or an error code;
 * parity_capture_last_error() gives the message of this thread's last failure, one line naming
 * the file, stage, layer and position. A capture with a refused record is not written by close()
 * (it would hold a hole), nor is one with a row left incomplete. Any refused call that records
 * (record, record_copy, including one without a copy function or whose copy failed, and
 * record_cache) counts; a refused append_tokens appends nothing and leaves the capture as it was.
 *
 * Disabled capture costs nothing: every function takes a null handle as a no-op returning
 * PARITY_CAPTURE_OK, so `parity_capture* cap = NULL;` (or not opening one) turns capture off.
 * A handle may be used from several threads (calls are serialised).
 *
 * Device memory: parity_capture_record_copy() takes a copy callback, called with a host buffer
 * to fill; parity_capture_device.h (compiled by the port's HIP or CUDA compiler) provides
 * parity_capture_record_device(), which copies with the runtime the port links. This library
 * needs no GPU toolkit.
 */
#ifndef PARITY_CAPTURE_H
#define PARITY_CAPTURE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define PARITY_CAPTURE_API
#elif defined(PARITY_CAPTURE_BUILDING)
#define PARITY_CAPTURE_API __attribute__((visibility("default")))
#else
#define PARITY_CAPTURE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define PARITY_CAPTURE_VERSION_MAJOR 2
#define PARITY_CAPTURE_VERSION_MINOR 0

typedef struct parity_capture parity_capture;

/* Return codes. */
enum parity_capture_status {
  PARITY_CAPTURE_OK = 0,
  PARITY_CAPTURE_ERR_ARGUMENT = 1,  /* a null pointer, a bad dtype, layout or option */
  PARITY_CAPTURE_ERR_STAGE = 2,     /* unknown stage, or layer/position/slot out of range */
  PARITY_CAPTURE_ERR_SHAPE = 3,     /* the count is not the stage's shape */
  PARITY_CAPTURE_ERR_DUPLICATE = 4, /* the row (or part, or slot) was recorded before */
  PARITY_CAPTURE_ERR_MODEL = 5,     /* the model directory or the tokens are unusable */
  PARITY_CAPTURE_ERR_IO = 6,        /* writing the file failed (the capture is abandoned) */
  PARITY_CAPTURE_ERR_STATE = 7,     /* close() refused, or the capture was abandoned */
  PARITY_CAPTURE_ERR_COPY = 8       /* the copy callback failed */
};

/* Element types of recorded data. float16 and bfloat16 are raw uint16 bit patterns. The two
 * bounds are not types: they give the enumeration the range of an int, so that any value a caller
 * passes is a value of this type (in C++ a value outside an enumeration's range is undefined),
 * and one that is not a type above is refused at the call. */
typedef enum parity_capture_dtype {
  PARITY_CAPTURE_F32 = 0,
  PARITY_CAPTURE_F16 = 1,
  PARITY_CAPTURE_BF16 = 2,
  PARITY_CAPTURE_F64 = 3,
  PARITY_CAPTURE_I32 = 4,
  PARITY_CAPTURE_DTYPE_MIN_BOUND = -0x7fffffff - 1,
  PARITY_CAPTURE_DTYPE_MAX_BOUND = 0x7fffffff
} parity_capture_dtype;

/* Layout flags (see above). */
#define PARITY_LAYOUT_DEFAULT 0u
#define PARITY_LAYOUT_ROPE_INTERLEAVED (1u << 0)
#define PARITY_LAYOUT_SINK_FIRST (1u << 1)
#define PARITY_LAYOUT_NO_SINK (1u << 2)
#define PARITY_LAYOUT_GATE_UP_HALVES (1u << 3)
#define PARITY_LAYOUT_QKV_Q (1u << 4)
#define PARITY_LAYOUT_QKV_K (1u << 5)
#define PARITY_LAYOUT_QKV_V (1u << 6)

/* Layer of the model-scope stages (embedding, final_norm, logits, sampled); slot of every record
 * that is not one expert slot. */
#define PARITY_CAPTURE_MODEL_LAYER (-1)
#define PARITY_CAPTURE_ALL_SLOTS (-1)

typedef struct parity_capture_options {
  /* Name of the port, recorded as the trace's backend ("my-hip-port"); NULL: "capture". */
  const char* port;
  /* How the port rounds, as a preset name (NULL: "float32"): "float64", "float32", "bfloat16",
   * "float16" (stored in that format, computed in float32 inside each stage), "vllm-like",
   * "bf16-operands", "transformers-f64", "transformers-f32", "transformers-bf16", "transformers-f16". The error
   * bounds each stage is held to are derived from it (README "Verdict of a capture"; what each
   * preset declares: model/precision.h, python/parity_capture/precision.py). */
  const char* precision;
  /* Free text about the device, driver and build (recorded, not interpreted); NULL: none. */
  const char* device;
} parity_capture_options;

/* Opens a capture written to `path` (created when close() succeeds) for the checkpoint in
 * `model_dir` (a Hugging Face directory: config.json and safetensors) and `n_tokens` token ids at
 * positions 0..n_tokens-1. `options` may be NULL. On success *out is the handle; on failure
 * *out is NULL and the error code is returned. */
PARITY_CAPTURE_API int parity_capture_open(parity_capture** out, const char* path,
                                           const char* model_dir, const int32_t* tokens,
                                           size_t n_tokens, const parity_capture_options* options);

/* Records one stage row (or one expert slot, or one qkv part) from host memory: `count`
 * elements of `dtype` at `data`. `layer` is PARITY_CAPTURE_MODEL_LAYER for model-scope stages;
 * `slot` is an expert slot for mlp1/swiglu/mlp2 or PARITY_CAPTURE_ALL_SLOTS. */
PARITY_CAPTURE_API int parity_capture_record(parity_capture* cap, const char* stage, int position,
                                             int layer, int slot, const void* data,
                                             parity_capture_dtype dtype, size_t count,
                                             unsigned layout);

/* Copies `bytes` bytes from `src` (e.g. device memory) into the host buffer `dst`; returns 0 on
 * success. `user` is passed through (a stream, a context). */
typedef int (*parity_capture_copy_fn)(void* dst, const void* src, size_t bytes, void* user);

/* As parity_capture_record, with the data at `src` fetched through `copy` into a host buffer
 * first. The arguments are checked before anything is copied; a null handle copies nothing. */
PARITY_CAPTURE_API int parity_capture_record_copy(parity_capture* cap, const char* stage,
                                                  int position, int layer, int slot,
                                                  const void* src, parity_capture_dtype dtype,
                                                  size_t count, unsigned layout,
                                                  parity_capture_copy_fn copy, void* user);

/* Appends `n_tokens` token ids at the next positions: a port that generates as it goes appends
 * each generated token, then records that position's rows. Refused, appending nothing, for an
 * id outside the vocabulary or a count past the context. */
PARITY_CAPTURE_API int parity_capture_append_tokens(parity_capture* cap, const int32_t* tokens,
                                                    size_t n_tokens);

/* Records the KV-cache rows of positions 0..count-1 of `layer` in one call: `k` (rotated keys)
 * and `v`, each count x nKV x d elements of `dtype` (a real dtype; `layout` ROPE_INTERLEAVED for
 * k's pairs, or 0). A capture with cache rows for every layer and stage rows only at positions
 * count and later is judged at those positions alone: the reference takes this cache as its own
 * instead of running the prefix (long positions at the cost of one). Once per layer, the same
 * count for every layer. */
PARITY_CAPTURE_API int parity_capture_record_cache(parity_capture* cap, int layer, size_t count,
                                                   const void* k, const void* v,
                                                   parity_capture_dtype dtype, unsigned layout);

/* Writes the capture and renames it into place, then frees the handle and sets *cap to NULL
 * (whatever the outcome), so a second close(&cap) or abandon(&cap) is a no-op. Refuses (and
 * writes nothing) when a record was refused or a row is incomplete.
 * Version 2 takes the handle's address: a handle freed behind a caller's pointer cannot be told
 * from a live one, so a second close of version 1's `parity_capture*` read freed memory; with
 * the address, the library clears the caller's pointer itself. (A copy of the pointer kept
 * elsewhere is still the caller's to clear, as with free().) */
PARITY_CAPTURE_API int parity_capture_close(parity_capture** cap);

/* Frees the handle without writing anything (the temporary file is removed) and sets *cap to
 * NULL. */
PARITY_CAPTURE_API void parity_capture_abandon(parity_capture** cap);

/* The message of this thread's last failed call ("" when none failed); valid until the next
 * call on this thread. */
PARITY_CAPTURE_API const char* parity_capture_last_error(void);

/* Elements of one row of `stage` at `position` under the capture's model (the whole row, all
 * slots for expert stages); 0 for an unknown stage or a null handle. */
PARITY_CAPTURE_API size_t parity_capture_row_elements(const parity_capture* cap, const char* stage,
                                                      int position);

#ifdef __cplusplus
}
#endif

#endif /* PARITY_CAPTURE_H */
