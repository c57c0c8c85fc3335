#pragma once
// What a text encoder's warm-up holds on a GPU besides the tensors its byte bound counts (ClipTextModel's and
// T5Encoder's warm_up_bytes), which a --max-memory cap must leave room for.
#include <cstdint>

namespace dp::models {

// LibTorch takes the cuBLAS and cuBLASLt workspaces from the caching allocator at a stream's first GEMM, 32 MiB
// on Hopper: a first warm-up in a fresh process held 34.46 MB where its own tensors needed at most 1.62 MB (H100,
// bench/RESULTS.md, session 21). A warm-up on a stream of its own may make a second one.
inline constexpr int64_t kWarmUpLibraryWorkspaceBytes = int64_t{64} << 20;
// The allocator rounds small tensors up, and attention makes temporaries the bound leaves out: at most 0.73 MB
// over it in fp32 (a tiny CLIP, same run).
inline constexpr int64_t kWarmUpSmallTensorsBytes = int64_t{2} << 20;

}  // namespace dp::models
