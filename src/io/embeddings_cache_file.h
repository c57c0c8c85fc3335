#pragma once
// The prompt-embedding cache (`generate --embeddings-cache FILE.h5`): text-encoder outputs keyed by prompt,
// max sequence length, run dtype and the encoders' fingerprint, so that prompts seen by an earlier job skip
// CLIP and T5. One HDF5 file, written atomically (the whole file is rewritten through AtomicFile):
//   /entries/<key>/prompt_embeds         (1, max_sequence_length, D) T5 output, run dtype (as checkpoints)
//   /entries/<key>/pooled_prompt_embeds  (1, D_pooled) CLIP pooled output
//   attributes of each entry             prompt, max_sequence_length, dtype, encoder_fingerprint, content_digest
//   root attribute                       format = "diffpipe-embeddings-cache"
// A damaged entry is a miss (with a warning), never an error: the cache only ever saves work. The file is only
// ever replaced when it is recognisably a cache (check_embeddings_cache_target): a prompts file, a checkpoint
// or latents named by mistake are refused, not rewritten.
#include <map>
#include <string>

#include "io/checkpoint_file.h"

namespace dp::io {

struct CachedEmbedding {
  std::string prompt;
  int max_sequence_length = 0;
  std::string dtype;
  std::string encoder_fingerprint;
  RawTensor prompt_embeds;  // (1, N, D)
  RawTensor pooled;         // (1, D_pooled)
};

inline constexpr const char* kEmbeddingsCacheFormatName = "diffpipe-embeddings-cache";

// Throws, saying what the file is, unless `path` is absent or a cache this format wrote: an HDF5 file with the
// root attribute format = "diffpipe-embeddings-cache", or one from before that attribute whose root holds only
// the group "entries" and no attribute.
void check_embeddings_cache_target(const std::string& path);

std::string embedding_cache_key(const std::string& prompt, int max_sequence_length, const std::string& dtype,
                                const std::string& encoder_fingerprint);
// Entries by key; an absent file is an empty cache. A file that is not a cache is refused
// (check_embeddings_cache_target); an unreadable entry is skipped with a warning.
std::map<std::string, CachedEmbedding> read_embeddings_cache(const std::string& path);
void write_embeddings_cache(const std::string& path, const std::map<std::string, CachedEmbedding>& entries);

}  // namespace dp::io
