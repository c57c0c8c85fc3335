#include "io/embeddings_cache_file.h"

#include <sys/stat.h>

#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_records.h"

namespace dp::io {
namespace {

using namespace hdf5;

std::string entry_digest(const CachedEmbedding& e) {
  Digest d;
  d.add(e.prompt);
  d.add(std::to_string(e.max_sequence_length) + " " + e.dtype + " " + e.encoder_fingerprint);
  for (const RawTensor* t : {&e.prompt_embeds, &e.pooled}) {
    d.add(t->dtype + shape_text(t->shape));
    d.add(t->data, t->nbytes);
  }
  return d.hex();
}

CachedEmbedding read_entry(hid_t file, const std::string& key, const std::string& path) {
  Handle group(H5Gopen2(file, ("entries/" + key).c_str(), H5P_DEFAULT), H5Gclose);
  DP_CHECK(group.ok(), path, ": cannot open entry ", key);
  const Reader r{path + ":/entries/" + key, group.get()};
  CachedEmbedding e;
  e.prompt = r.text("prompt");
  e.max_sequence_length = static_cast<int>(r.integer("max_sequence_length", 1, 1 << 16));
  e.dtype = r.text("dtype");
  e.encoder_fingerprint = r.text("encoder_fingerprint");
  e.prompt_embeds = r.tensor("prompt_embeds", 3);
  e.pooled = r.tensor("pooled_prompt_embeds", 2);
  DP_CHECK(e.prompt_embeds.shape[0] == 1 && e.pooled.shape[0] == 1 &&
               e.prompt_embeds.shape[1] == e.max_sequence_length && e.prompt_embeds.dtype == e.dtype &&
               e.pooled.dtype == e.dtype,
           r.path, ": shapes or dtypes do not match the entry's attributes");
  DP_CHECK(r.text("content_digest") == entry_digest(e), r.path, ": content digest mismatch (damaged entry)");
  DP_CHECK(embedding_cache_key(e.prompt, e.max_sequence_length, e.dtype, e.encoder_fingerprint) == key, r.path,
           ": the entry's key does not match its attributes");
  return e;
}

}  // namespace

std::string embedding_cache_key(const std::string& prompt, int max_sequence_length, const std::string& dtype,
                                const std::string& encoder_fingerprint) {
  Digest d;
  d.add(prompt);
  d.add(std::to_string(max_sequence_length));
  d.add(dtype);
  d.add(encoder_fingerprint);
  return d.hex();
}

void check_embeddings_cache_target(const std::string& path) {
  silence_errors();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // a new cache
  const auto refuse = [&](const std::string& what) {
    DP_FAIL("--embeddings-cache ", path, ": exists and is ", what, ", not a diffpipe embeddings cache; a cache "
            "run writes only over its own cache file: name a new file (or the cache an earlier run wrote)");
  };
  if (!S_ISREG(st.st_mode)) return;  // the output policy names links, FIFOs and devices
  if (st.st_size == 0) refuse("empty");
  if (H5Fis_hdf5(path.c_str()) <= 0) refuse("not an HDF5 file (a text file? a PNG?)");
  Handle h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!h5.ok()) refuse("an HDF5 file that cannot be opened");
  Handle top(H5Gopen2(h5.get(), "/", H5P_DEFAULT), H5Gclose);
  const int root_attributes = top.ok() ? H5Aget_num_attrs(top.get()) : -1;
  if (root_attributes < 0) refuse("an HDF5 file whose root cannot be read");
  if (H5Aexists(top.get(), "format") > 0) {
    const std::string format = Reader{path, top.get()}.text("format");
    if (format == kEmbeddingsCacheFormatName) return;
    refuse(str("an HDF5 file of format '", format, "'"));
  }
  H5G_info_t root{};
  const bool only_entries = H5Gget_info(top.get(), &root) >= 0 && root.nlinks == 1 &&
                            H5Lexists(top.get(), "entries", H5P_DEFAULT) > 0 && root_attributes == 0;
  if (only_entries) return;  // written before the format attribute existed
  std::string names;
  for (hsize_t i = 0; i < root.nlinks && i < 4; ++i) {
    char name[64] = {};
    if (H5Lget_name_by_idx(top.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) > 0)
      names += str(names.empty() ? "" : ", ", name);
  }
  refuse(str("an HDF5 file holding ", names.empty() ? std::string("nothing") : names));
}

std::map<std::string, CachedEmbedding> read_embeddings_cache(const std::string& path) {
  silence_errors();
  std::map<std::string, CachedEmbedding> entries;
  if (!std::filesystem::exists(path)) return entries;
  check_embeddings_cache_target(path);
  Handle h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!h5.ok() || H5Lexists(h5.get(), "entries", H5P_DEFAULT) <= 0) {
    DP_WARN(path, ": --embeddings-cache has no entries group; it is read as empty");
    return entries;
  }
  Handle group(H5Gopen2(h5.get(), "entries", H5P_DEFAULT), H5Gclose);
  H5G_info_t info{};
  if (!group.ok() || H5Gget_info(group.get(), &info) < 0) return entries;
  for (hsize_t i = 0; i < info.nlinks && i < 100000; ++i) {
    char name[64] = {};
    const ssize_t length = H5Lget_name_by_idx(group.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name,
                                              H5P_DEFAULT);
    if (length <= 0 || length >= static_cast<ssize_t>(sizeof name)) continue;
    try {
      entries[name] = read_entry(h5.get(), name, path);
    } catch (const Error& e) {
      DP_WARN("--embeddings-cache: skipping an entry: ", e.what());
    }
  }
  return entries;
}

void write_embeddings_cache(const std::string& path, const std::map<std::string, CachedEmbedding>& entries) {
  silence_errors();
  check_embeddings_cache_target(path);
  AtomicFile output(path);
  output.write([&](const std::string& tmp_file) {
    const std::string& tmp = path;  // the name messages give
    Handle h5(H5Fcreate(tmp_file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    DP_CHECK(h5.ok(), tmp, ": cannot create HDF5 file");
    write_text(h5.get(), "format", kEmbeddingsCacheFormatName, tmp);
    Handle top(H5Gcreate2(h5.get(), "entries", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    DP_CHECK(top.ok(), tmp, ": cannot create group 'entries'");
    for (const auto& [key, e] : entries) {
      Handle group(H5Gcreate2(top.get(), key.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      DP_CHECK(group.ok(), tmp, ": cannot create entry ", key);
      write_tensor(group.get(), "prompt_embeds", e.prompt_embeds, tmp);
      write_tensor(group.get(), "pooled_prompt_embeds", e.pooled, tmp);
      write_text(group.get(), "prompt", e.prompt, tmp);
      write_number(group.get(), "max_sequence_length", e.max_sequence_length, tmp);
      write_text(group.get(), "dtype", e.dtype, tmp);
      write_text(group.get(), "encoder_fingerprint", e.encoder_fingerprint, tmp);
      write_text(group.get(), "content_digest", entry_digest(e), tmp);
    }
    DP_CHECK(H5Fflush(h5.get(), H5F_SCOPE_GLOBAL) >= 0, tmp, ": flush failed");
  });
  output.commit();
}

}  // namespace dp::io
