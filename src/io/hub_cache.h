#pragma once
// --model as a Hugging Face model id ("black-forest-labs/FLUX.1-dev"), found in the local hub cache the way
// huggingface_hub lays it out, without any network access:
//   <cache>/models--ORG--NAME/refs/<revision>     the commit hash a branch or tag points at
//   <cache>/models--ORG--NAME/snapshots/<commit>/  the files, as symbolic links into ../../blobs/
// where <cache> is HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub. Torch-free.
#include <string>

namespace dp::io {

// The hub cache folder the environment names (it need not exist).
std::string hub_cache_dir();

// Whether `model` is written as a model id: ORG/NAME, each part letters, digits, '.', '_' or '-', not starting
// with '.' or '-'. A local folder of that name is still a folder (resolve_model_argument looks there first).
bool looks_like_hub_id(const std::string& model);

// The folder --model names: a local folder as given; else a model id's snapshot in the hub cache for
// `revision` (a branch or tag under refs/, or a commit hash under snapshots/; empty: "main"). An id that is not
// cached is refused with one line saying how to download it; --revision with a local folder is refused too.
// Anything else is returned as given, for the folder check to name what is wrong.
std::string resolve_model_argument(const std::string& model, const std::string& revision);

}  // namespace dp::io
