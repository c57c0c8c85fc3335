#!/usr/bin/env python3
"""Writes the seed corpora for the fuzz targets in tests/fuzz.

corpus/safetensors/: whole safetensors file images, valid ones (so the fuzzer starts from the success path),
accepted-but-questionable ones (quirk_*), and one per way a file can be broken (so every rejection branch is covered from the first execution, and
the replay test in the g++ build checks each of them cleanly raises dp::Error).
The prefix is the contract the replay (replay_main.cpp) checks per file: bad_* must be rejected, valid_* and
quirk_* accepted.
corpus/index/: *.safetensors.index.json bodies for index_fuzz.cpp, which pairs them with two fixed shards
(a, b in model-00001-of-00002.safetensors; c in model-00002-of-00002.safetensors).
corpus/lora_file/: LoRA adapter files for lora_file_fuzz.cpp in the three layouts (diffusers/PEFT, kohya, BFL) for its
fixed tiny model, and one per way an adapter can be broken (io_lora_file_test checks bad_* are refused, valid_*
accepted).
corpus/clip_tokenizer/, corpus/t5_tokenizer/: bundles of tokenizer files ("#file NAME" lines, see
tokenizer_fuzz_support.h), built from the tiny tokenizers that `diffpipe make-tiny` writes, small hand-made
ones, and one per way a file can be broken. corpus/png_text/: small PNG files with text chunks (tEXt, iTXt, zTXt)
and one per way a chunk can be broken (length, CRC, keyword, UTF-8, order, truncation). corpus/spiece/: spiece.model files (sentencepiece ModelProto),
written here field by field. The Precompiled charsmaps are small darts-clone tries built here too.

Deterministic: rerunning rewrites identical bytes. Files the fuzzer found (crash-*, regression-*) are kept.
Run: python3 tests/fuzz/make_corpus.py [--diffpipe build/diffpipe] [--only lora_file|png_text]
(the tokenizer seeds need the torch-free `diffpipe` binary for make-tiny).
"""
import argparse
import base64
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def image(header, data=b"", length=None):
    """Length prefix + header + data; `length` overrides the prefix to lie about the header size."""
    if isinstance(header, (dict, list)):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def all_dtypes():
    """One single-element tensor of every supported dtype, tiled back to back (47 bytes)."""
    sizes = [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2), ("I64", 8), ("I32", 4), ("I16", 2), ("I8", 1),
             ("U64", 8), ("U32", 4), ("U16", 2), ("U8", 1), ("BOOL", 1)]
    header, offset = {}, 0
    for name, size in sizes:
        header["t_" + name] = entry(name, [1], offset, offset + size)
        offset += size
    return header


def safetensors_cases():
    one = {"w": entry("F32", [2], 0, 8)}
    one_text = json.dumps(one, separators=(",", ":"))
    return {
        # --- accepted ---
        "valid_empty_header": image("{}"),
        "valid_padded_header": image("{}      "),  # reference writer pads with spaces to 8-byte alignment
        "valid_two_dtypes": image({"a": entry("BF16", [2], 0, 4), "b": entry("F32", [2], 4, 12)}, bytes(12)),
        "valid_all_dtypes": image(all_dtypes(), bytes(47)),
        "valid_metadata": image({"__metadata__": {"format": "pt", "note": "x"}, "w": entry("U8", [2, 2], 0, 4)},
                                bytes(4)),
        "valid_zero_sized": image({"empty": entry("F32", [0, 3], 0, 0), "scalar": entry("I64", [], 0, 8)},
                                  bytes(8)),
        "valid_zero_sized_between": image(
            {"a": entry("U8", [1], 0, 1), "z": entry("F16", [4, 0], 1, 1), "b": entry("U8", [1], 1, 2)}, bytes(2)),
        "valid_unicode_name": image({"gewicht.\u00e4\u4e2d": entry("U8", [1], 0, 1)}, b"\x00"),
        "valid_escaped_name": image('{"a\\u0000b\\"c":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00"),
        # --- once accepted, now rejected (the replay requires every bad_* to be rejected) ---
        # A zero extent makes the element count 0 however large the other extents are (the reference
        # implementation's checked product agrees), but stride products of the other dims overflow int64.
        "bad_zero_dim_huge_dims": image({"w": entry("F32", [0, 2**32, 2**32], 0, 0)}),
        # Duplicate fields inside an entry are not detected (only top-level keys are); the last one wins.
        "bad_duplicate_field_same_size": image(
            '{"w":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}}', bytes(4)),
        "bad_duplicate_metadata_key": image('{"__metadata__":{"k":"a","k":"b"}}'),
        # --- broken framing ---
        "bad_short_file": b"abc",
        "bad_empty_file": b"",
        "bad_huge_header_length": struct.pack("<Q", 200_000_000) + b"{}",
        "bad_max_header_length": struct.pack("<Q", 2**64 - 1) + b"{}",
        "bad_header_past_end": image(one_text, bytes(8))[:20],
        "bad_truncated_data": image(one, bytes(4)),
        "bad_trailing_bytes": image(one, bytes(12)),
        "bad_length_too_short": image(one, bytes(8), length=10),
        "bad_zero_length_header": image(b"", bytes(4)),
        # --- broken JSON ---
        "bad_json_unterminated": image('{"w":{"dtype":"F32",'),
        "bad_json_trailing_garbage": image("{}x"),
        "bad_json_not_object": image("[1,2]"),
        "bad_json_leading_space": image(" {}"),
        "bad_json_invalid_utf8": image(b'{"\xff\xfe":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00"),
        "bad_json_lone_surrogate": image('{"\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x00"),
        "bad_json_deep_nesting": image("{" + '"a":' + "[" * 64 + "]" * 64 + "}"),
        "bad_json_deep_objects": image('{"a":' * 40 + "1" + "}" * 40),
        "bad_json_deep_metadata": image({"__metadata__": {"k": {"x": {"y": {"z": "v"}}}}}),
        "bad_json_number_overflow": image('{"w":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}}', b"\x00"),
        "bad_json_nul_byte": image(b'{"w"\x00:1}'),
        # --- broken entries ---
        "bad_unknown_dtype": image({"w": entry("F8_E9", [2], 0, 2)}, bytes(2)),
        "bad_lowercase_dtype": image({"w": entry("f32", [1], 0, 4)}, bytes(4)),
        "bad_dtype_not_string": image({"w": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}}, bytes(4)),
        "bad_lying_shape": image({"w": entry("F32", [3], 0, 8)}, bytes(8)),
        "bad_shape_not_array": image({"w": {"dtype": "U8", "shape": 1, "data_offsets": [0, 1]}}, b"\x00"),
        "bad_negative_dim": image({"w": entry("U8", [-1], 0, 1)}, b"\x00"),
        "bad_float_dim": image('{"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}', b"\x00"),
        "bad_float_integral_dim": image('{"w":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', b"\x00"),
        "bad_bool_dim": image('{"w":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}', b"\x00"),
        "bad_dim_above_int64": image({"w": entry("U8", [2**63], 0, 1)}, b"\x00"),
        "bad_dim_uint64_max": image({"w": entry("U8", [2**64 - 1], 0, 1)}, b"\x00"),
        "bad_overflowing_shape": image({"w": entry("F32", [2**32, 2**32], 0, 8)}, bytes(8)),
        "bad_overflowing_bytes": image({"w": entry("F64", [2**62], 0, 8)}, bytes(8)),
        "bad_missing_offsets": image({"w": {"dtype": "U8", "shape": [1]}}, b"\x00"),
        "bad_three_offsets": image({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, b"\x00"),
        "bad_negative_offset": image({"w": entry("U8", [1], -1, 0)}, b"\x00"),
        "bad_float_offset": image('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}}', b"\x00"),
        "bad_reversed_offsets": image({"w": entry("U8", [0], 4, 0)}, bytes(4)),
        "bad_offset_past_data": image(
            '{"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}}', b"\x00"),
        "bad_extra_field": image({"w": {**entry("U8", [1], 0, 1), "x": 1}}, b"\x00"),
        "bad_entry_not_object": image({"w": [1, 2]}),
        "bad_metadata_not_object": image({"__metadata__": ["format", "pt"]}),
        "bad_metadata_value": image({"__metadata__": {"k": 1}}),
        # --- broken tiling ---
        "bad_overlap": image({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12)),
        "bad_same_range": image({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 0, 4)}, bytes(4)),
        "bad_gap": image({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, bytes(12)),
        "bad_gap_at_start": image({"a": entry("F32", [1], 4, 8)}, bytes(8)),
        "bad_zero_sized_in_gap": image({"a": entry("U8", [1], 0, 1), "z": entry("U8", [0], 5, 5)}, b"\x00"),
        "bad_duplicate_key": image('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                   '"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)),
        "bad_duplicate_metadata": image('{"__metadata__":{},"__metadata__":{}}'),
        "bad_duplicate_field": image('{"w":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}}',
                                     b"\x00"),
    }


def index_cases():
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"

    def idx(weight_map, **extra):
        return json.dumps({"metadata": {"total_size": 13}, "weight_map": weight_map, **extra}).encode()

    return {
        "valid_two_shards": idx({"a": s1, "b": s1, "c": s2}),
        "valid_one_shard": idx({"c": s2}),
        # Accepted: read_json_file does not detect duplicate keys, so the last mapping of 'a' wins silently
        # (harmless only because the shard contents are cross-checked against the map).
        "quirk_duplicate_key_last_wins": b'{"weight_map":{"a":"' + s2.encode() + b'","a":"' + s1.encode()
        + b'","b":"' + s1.encode() + b'","c":"' + s2.encode() + b'"}}',
        "bad_missing_weight_map": json.dumps({"metadata": {}}).encode(),
        "bad_weight_map_not_object": idx(["a", s1]),
        "bad_empty_weight_map": idx({}),
        "bad_entry_not_string": idx({"a": 1}),
        "bad_parent_dir": idx({"a": "../" + s1}),
        "bad_dotdot": idx({"a": ".."}),
        "bad_dot": idx({"a": "."}),
        "bad_absolute": idx({"a": "/etc/passwd"}),
        "bad_backslash": idx({"a": "..\\" + s1}),
        "bad_empty_name": idx({"a": ""}),
        "bad_missing_shard": idx({"a": "model-00009-of-00009.safetensors"}),
        "bad_shard_is_dir": idx({"a": "sub"}),
        "bad_shard_is_text": idx({"a": "notes.txt"}),
        "bad_shard_is_index": idx({"a": "model.safetensors.index.json"}),
        "bad_wrong_shard": idx({"a": s2, "b": s1, "c": s2}),
        "bad_unlisted_tensor": idx({"a": s1, "c": s2}),
        "bad_listed_not_stored": idx({"a": s1, "b": s1, "c": s2, "d": s2}),
        "bad_not_json": b"{weight_map:",
        "bad_not_object": b"[]",
        "bad_deep_nesting": b'{"weight_map":{},"x":' + b"[" * 2000 + b"]" * 2000 + b"}",
        "bad_duplicate_tensor": b'{"weight_map":{"a":"' + s1.encode() + b'","a":"' + s2.encode() + b'"}}',
        "bad_invalid_utf8": b'{"weight_map":{"\xff":"' + s1.encode() + b'"}}',
        "bad_empty": b"",
    }


# --- LoRA adapters --------------------------------------------------------------------------------------------

def tensors(items, metadata=None):
    """A safetensors image of F32/BF16 tensors: items are (name, dtype, shape, fill value)."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, fill in items:
        count = 1
        for d in shape:
            count *= d
        packed = struct.pack("<q", int(fill)) if dtype == "I64" else struct.pack("<f", fill)
        one = packed[2:] if dtype == "BF16" else packed
        begin = len(data)
        data += one * count
        header[name] = entry(dtype, shape, begin, len(data))
    return image(header, data)


def pair(module, down, up, rank, n_in, n_out, fill=0.01):
    return [(module + down, "F32", [rank, n_in], fill), (module + up, "F32", [n_out, rank], fill)]


def lora_cases():
    """For lora_file_fuzz.cpp's model: FLUX inner dim 32, MLP 128, 2 double + 2 single blocks, 16 input channels;
    CLIP width 32, MLP 37, 2 layers."""
    t = "transformer."
    a, b = ".lora_A.weight", ".lora_B.weight"
    down, up = ".lora_down.weight", ".lora_up.weight"
    diffusers = (pair(t + "transformer_blocks.0.attn.to_q", a, b, 4, 32, 32)
                 + [(t + "transformer_blocks.0.attn.to_q.alpha", "F32", [], 8.0)]
                 + pair(t + "single_transformer_blocks.1.proj_mlp", a, b, 4, 32, 128)
                 + pair(t + "x_embedder", a, b, 2, 16, 32)
                 + pair("text_encoder.text_model.encoder.layers.1.mlp.fc1", a, b, 2, 32, 37))
    kohya = (pair("lora_unet_double_blocks_1_img_attn_qkv", down, up, 6, 32, 96)
             + [("lora_unet_double_blocks_1_img_attn_qkv.alpha", "F32", [], 3.0)]
             + pair("lora_unet_single_blocks_0_linear1", down, up, 4, 32, 224)
             + pair("lora_unet_single_blocks_1_linear2", down, up, 4, 160, 32)
             + pair("lora_unet_double_blocks_0_txt_mod_lin", down, up, 4, 32, 192)
             + pair("lora_unet_img_in", down, up, 4, 16, 32)
             + pair("lora_te1_text_model_encoder_layers_0_self_attn_k_proj", down, up, 4, 32, 32))
    bfl = (pair("diffusion_model.double_blocks.0.txt_attn.qkv", down, up, 4, 32, 96)
           + [("diffusion_model.double_blocks.0.txt_attn.qkv.alpha", "BF16", [], 2.0)]
           + pair("diffusion_model.single_blocks.1.modulation.lin", down, up, 4, 32, 96)
           + pair("text_encoders.clip_l.transformer.text_model.encoder.layers.1.mlp.fc2", down, up, 4, 37, 32))
    q = t + "transformer_blocks.0.attn.to_q"
    truncated = tensors(diffusers)
    return {
        "valid_diffusers": tensors(diffusers),
        "valid_kohya": tensors(kohya),
        "valid_bfl": tensors(bfl),
        "valid_metadata": tensors(pair(t + "proj_out", a, b, 4, 32, 16),
                                  {"lora_adapter_metadata": json.dumps({"transformer.r": 4, "transformer.lora_alpha": 2})}),
        "bad_empty": b"",
        "bad_no_tensors": tensors([]),
        "bad_truncated": truncated[:-7],
        "bad_sdxl_keys": tensors(pair("lora_unet_down_blocks_0_attentions_0_proj_in", down, up, 4, 32, 32)),
        "bad_unknown_keys": tensors([("model.embed.weight", "F32", [4, 4], 0.0)]),
        "bad_missing_up": tensors([(q + a, "F32", [4, 32], 0.0)]),
        "bad_rank_mismatch": tensors([(q + a, "F32", [4, 32], 0.0), (q + b, "F32", [32, 3], 0.0)]),
        "bad_wrong_width": tensors(pair(q, a, b, 4, 64, 64)),
        "bad_block_outside_model": tensors(pair(t + "transformer_blocks.7.attn.to_q", a, b, 4, 32, 32)),
        "bad_nan_alpha": tensors(pair(q, a, b, 4, 32, 32) + [(q + ".alpha", "F32", [], float("nan"))]),
        "bad_int_alpha": tensors(pair(q, a, b, 4, 32, 32) + [(q + ".alpha", "I64", [], 4)]),
        "bad_three_d_factor": tensors([(q + a, "F32", [4, 32, 1], 0.0), (q + b, "F32", [32, 4], 0.0)]),
        "bad_bfl_lora_a": tensors(pair("diffusion_model.double_blocks.0.img_attn.qkv", a, b, 4, 32, 96)),
        "bad_linear1_rows": tensors(pair("lora_unet_single_blocks_0_linear1", down, up, 4, 32, 96)),
        "bad_negative_kohya_alpha": tensors(pair("lora_unet_double_blocks_0_img_mlp_2", down, up, 4, 128, 32)
                                            + [("lora_unet_double_blocks_0_img_mlp_2.alpha", "F32", [], -1.0)]),
        "bad_alpha_and_metadata": tensors(pair(q, a, b, 4, 32, 32) + [(q + ".alpha", "F32", [], 4.0)],
                                          {"lora_adapter_metadata": json.dumps({"transformer.r": 4})}),
        "bad_metadata_rank": tensors(pair(q, a, b, 4, 32, 32),
                                     {"lora_adapter_metadata": json.dumps({"transformer.r": 8})}),
        "bad_xlabs": tensors(pair("double_blocks.0.processor.qkv_lora1", ".down.weight", ".up.weight", 4, 32, 32)),
    }


def write(folder, cases):
    path = os.path.join(HERE, "corpus", folder)
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        # Regenerate our own seeds; keep inputs that the fuzzer found and someone committed.
        if name.startswith(("valid_", "bad_", "quirk_")):
            os.remove(os.path.join(path, name))
    for name, data in sorted(cases.items()):
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    print(f"{path}: {len(cases)} seeds", file=sys.stderr)


# --- PNG text chunks -----------------------------------------------------------------------------------------
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunk(kind, data, crc=None, length=None):
    """One chunk: big-endian length, type, data, CRC over type+data; `crc` / `length` override to lie."""
    import zlib
    n = len(data) if length is None else length
    c = zlib.crc32(kind + data) & 0xffffffff if crc is None else crc
    return struct.pack(">I", n) + kind + data + struct.pack(">I", c)


def png_file(text_chunks, after_idat=(), trailer=b""):
    """A 1x1 RGB PNG with the given chunks before (and after) its image data."""
    import zlib
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
    idat = png_chunk(b"IDAT", zlib.compress(b"\x00\x10\x20\x30"))
    return (PNG_SIGNATURE + ihdr + b"".join(text_chunks) + idat + b"".join(after_idat) + png_chunk(b"IEND", b"")
            + trailer)


def itxt(key, text, flag=0, method=0, language=b"", translated=b""):
    return png_chunk(b"iTXt", key + b"\0" + bytes([flag, method]) + language + b"\0" + translated + b"\0" + text)


def png_text_cases():
    import zlib
    prompt = "a cat on a mat, caf\u00e9 \u732b".encode("utf-8")
    good = png_file([png_chunk(b"tEXt", b"parameters\0a cat\nSteps: 4, Seed: 7"), itxt(b"prompt", prompt)])
    cases = {
        "valid_no_text": png_file([]),
        "valid_text_and_itxt": good,
        "valid_latin1_text": png_file([png_chunk(b"tEXt", b"Comment\0caf\xe9")]),
        "valid_text_after_idat": png_file([], after_idat=[png_chunk(b"tEXt", b"seed\x007")]),
        "valid_ztxt": png_file([png_chunk(b"zTXt", b"Comment\0\0" + zlib.compress(b"hello"))]),
        "valid_itxt_compressed": png_file([itxt(b"prompt", zlib.compress(prompt), flag=1)]),
        "valid_itxt_language": png_file([itxt(b"prompt", prompt, language=b"fr", translated="invite".encode())]),
        "valid_empty_value": png_file([png_chunk(b"tEXt", b"negative_prompt\0")]),
        "bad_empty": b"",
        "bad_signature": b"\x89PNX\r\n\x1a\n" + good[8:],
        "bad_signature_only": PNG_SIGNATURE,
        "bad_truncated_half": good[: len(good) // 2],
        "bad_no_iend": good[: -12],
        "bad_trailing_bytes": png_file([], trailer=b"junk"),
        "bad_crc": png_file([png_chunk(b"tEXt", b"seed\x007", crc=0x12345678)]),
        "bad_flipped_text_byte": good[:60] + bytes([good[60] ^ 0x01]) + good[61:],
        "bad_length_past_end": png_file([png_chunk(b"tEXt", b"seed\x007", length=0x00ffffff)]),
        "bad_length_over_limit": png_file([png_chunk(b"tEXt", b"seed\x007", length=0xfffffff0)]),
        "bad_first_not_ihdr": PNG_SIGNATURE + png_chunk(b"tEXt", b"seed\x007") + good[8:],
        "bad_ihdr_length": PNG_SIGNATURE + png_chunk(b"IHDR", b"\0" * 12) + good[8 + 25:],
        "bad_chunk_type": png_file([png_chunk(b"t3Xt", b"seed\x007")]),
        "bad_text_no_nul": png_file([png_chunk(b"tEXt", b"seed")]),
        "bad_text_nul_in_value": png_file([png_chunk(b"tEXt", b"seed\x007\x008")]),
        "bad_keyword_empty": png_file([png_chunk(b"tEXt", b"\0value")]),
        "bad_keyword_too_long": png_file([png_chunk(b"tEXt", b"k" * 80 + b"\0value")]),
        "bad_keyword_leading_space": png_file([png_chunk(b"tEXt", b" seed\x007")]),
        "bad_keyword_control": png_file([png_chunk(b"tEXt", b"se\x01ed\x007")]),
        "bad_itxt_not_utf8": png_file([itxt(b"prompt", b"caf\xe9")]),
        "bad_itxt_overlong_utf8": png_file([itxt(b"prompt", b"\xc0\xaf")]),
        "bad_itxt_surrogate": png_file([itxt(b"prompt", b"\xed\xa0\x80")]),
        "bad_itxt_truncated_header": png_file([png_chunk(b"iTXt", b"prompt\0\0")]),
        "bad_itxt_no_language_nul": png_file([png_chunk(b"iTXt", b"prompt\0\0\0en")]),
        "bad_itxt_flag": png_file([itxt(b"prompt", prompt, flag=2)]),
        "bad_itxt_method": png_file([itxt(b"prompt", prompt, method=1)]),
        "bad_ztxt_method": png_file([png_chunk(b"zTXt", b"Comment\0\x05abc")]),
        "bad_second_ihdr": png_file([png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))]),
    }
    return cases


# --- tokenizer files -----------------------------------------------------------------------------------------

def bundle(files):
    """Packs name -> bytes into one fuzz input: each file after a "#file NAME" line, files joined by newlines."""
    parts = []
    for name, content in files.items():
        if isinstance(content, (dict, list)):
            content = json.dumps(content, ensure_ascii=False)
        if isinstance(content, str):
            content = content.encode("utf-8")
        parts.append(b"#file " + name.encode() + b"\n" + content)
    return b"\n".join(parts)


def darts_units(entries):
    """A darts-clone double array for byte keys -> values, as sentencepiece's charsmap holds it.

    Unit layout (darts.h): bits 0-7 the label of the edge into the unit, bit 8 "has a value", bits 10-30 the
    XOR offset to the children (child = index ^ offset ^ label; the value sits at label 0), bit 31 marks a
    value unit, whose low 31 bits are the value. Children are placed first-fit, which is all a reader needs;
    the array is padded to whole 256-unit blocks, as darts-clone writes it and sentencepiece requires.
    """
    trie = {}
    for key, value in entries.items():
        node = trie
        for byte in key:
            node = node.setdefault(byte, {})
        node[None] = value
    units, used, queue = {0: 0}, {0}, [(trie, 0)]
    while queue:
        node, index = queue.pop(0)
        labels = sorted(label for label in node if label is not None)
        slots = ([0] if None in node else []) + labels
        base = 1
        while any((base ^ label) in used for label in slots):
            base += 1
        offset = base ^ index
        assert offset < 1 << 21
        units[index] = (offset << 10) | ((1 << 8) if None in node else 0) | (units[index] & 0xFF)
        if None in node:
            units[base] = node[None] | (1 << 31)
            used.add(base)
        for label in labels:
            units[base ^ label] = label
            used.add(base ^ label)
            queue.append((node[label], base ^ label))
    return [units.get(i, 0) for i in range((max(units) // 256 + 1) * 256)]


def charsmap_parts(rules):
    """The trie units and replacement bytes of `rules` (source text -> replacement)."""
    replacements, offsets = b"", {}
    for source, target in sorted(rules.items()):
        offsets[source.encode("utf-8")] = len(replacements)
        replacements += target.encode("utf-8") + b"\0"
    return darts_units(offsets), replacements


def charsmap_blob(rules, trie_size=None, units=None, replacements=None):
    """sentencepiece's precompiled charsmap: uint32 trie size, the trie, NUL-terminated replacements. The
    keyword arguments override the real parts to break it."""
    real_units, real_replacements = charsmap_parts(rules)
    units = real_units if units is None else units
    replacements = real_replacements if replacements is None else replacements
    trie = b"".join(struct.pack("<I", unit) for unit in units)
    return struct.pack("<I", len(trie) if trie_size is None else trie_size) + trie + replacements


# A few of the mappings nmt_nfkc makes, enough to exercise single-character and grapheme lookups.
CHARSMAP_RULES = {
    "\uff21": "A", "\uff22": "B", "\uff43": "c",  # fullwidth letters
    "\ufb01": "fi",                               # ligature
    "\u3000": " ", "\u00a0": " ",                  # ideographic and no-break space
    "\u2122": "TM",
    "e\u0301": "\u00e9",                           # a two-code-point grapheme
    "\u200b": "",                                 # zero-width space removed
}


def precompiled_normalizer(blob):
    return {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(blob).decode()}


def make_tiny_tokenizers(diffpipe):
    """The CLIP (tokenizer/) and T5 (tokenizer_2/) folders `diffpipe make-tiny` writes, as name -> bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "tiny")
        subprocess.run([diffpipe, "make-tiny", "--out", out], check=True, stdout=subprocess.DEVNULL)
        folders = {}
        for folder in ("tokenizer", "tokenizer_2"):
            path = os.path.join(out, folder)
            folders[folder] = {name: open(os.path.join(path, name), "rb").read() for name in sorted(os.listdir(path))}
        return folders


MINI_CLIP_VOCAB = {"a": 0, "b": 1, "c": 2, "a</w>": 3, "b</w>": 4, "c</w>": 5, "ab": 6, "ab</w>": 7, "abc</w>": 8,
                   "<|startoftext|>": 9, "<|endoftext|>": 10}
MINI_CLIP_MERGES = "#version: 0.2\na b\na b</w>\nab c</w>\n"


def clip_tokenizer_json(vocab, merges, added=None):
    added = added if added is not None else [
        {"id": vocab["<|startoftext|>"], "content": "<|startoftext|>", "normalized": True, "special": True},
        {"id": vocab["<|endoftext|>"], "content": "<|endoftext|>", "normalized": False, "special": True}]
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "model": {"type": "BPE", "vocab": vocab, "merges": merges}}


def clip_cases(tiny):
    clip = tiny["tokenizer"]
    vocab = json.loads(clip["vocab.json"])
    merge_lines = [line for line in clip["merges.txt"].decode().split("\n")[1:] if line]
    mini = {"vocab.json": MINI_CLIP_VOCAB, "merges.txt": MINI_CLIP_MERGES}
    mini_json = clip_tokenizer_json(MINI_CLIP_VOCAB, [["a", "b"], ["a", "b</w>"], ["ab", "c</w>"]])

    def with_vocab(**changes):
        return bundle({"vocab.json": {**MINI_CLIP_VOCAB, **changes}, "merges.txt": MINI_CLIP_MERGES})

    def with_config(config, **extra):
        return bundle({**mini, "tokenizer_config.json": config, **extra})

    def with_json(**model_changes):
        doc = json.loads(json.dumps(mini_json))
        doc["model"].update(model_changes)
        return bundle({"tokenizer.json": doc})

    def with_added(added):
        return bundle({"tokenizer.json": clip_tokenizer_json(MINI_CLIP_VOCAB, [["a", "b"]], added)})

    return {
        # --- accepted ---
        "valid_tiny_vocab_merges": bundle(clip),
        "valid_tiny_tokenizer_json": bundle({
            "tokenizer.json": clip_tokenizer_json(vocab, [line.split(" ") for line in merge_lines]),
            "tokenizer_config.json": clip["tokenizer_config.json"]}),
        "valid_tiny_string_merges": bundle({"tokenizer.json": clip_tokenizer_json(vocab, merge_lines)}),
        "valid_mini_vocab_merges": bundle({**mini, "prompt": "abc ab a<|endoftext|>"}),
        "valid_mini_tokenizer_json": bundle({"tokenizer.json": mini_json, "prompt": "cab abc"}),
        "valid_mini_config": with_config({
            "bos_token": {"content": "<|startoftext|>", "normalized": True}, "model_max_length": 8,
            "added_tokens_decoder": {"9": {"content": "<|startoftext|>", "normalized": True},
                                     "10": {"content": "<|endoftext|>", "normalized": False}}},
            **{"special_tokens_map.json": {"eos_token": "<|endoftext|>", "pad_token": "a"}}),
        "valid_no_limit_max_length": with_config({"model_max_length": 1e30}),
        # --- vocab.json ---
        "bad_vocab_not_object": bundle({"vocab.json": ["a", "b"], "merges.txt": ""}),
        "bad_vocab_id_string": with_vocab(a="zero"),
        "bad_vocab_id_float": with_vocab(a=2.7),
        "bad_vocab_id_bool": with_vocab(a=True),
        "bad_vocab_id_negative": with_vocab(a=-1),
        "bad_vocab_id_huge": with_vocab(a=10**15),
        "bad_vocab_id_uint64_max": with_vocab(a=2**64 - 1),
        "bad_vocab_id_sparse": with_vocab(a=11),
        "bad_vocab_not_json": bundle({"vocab.json": b"{\"a\": 0,", "merges.txt": ""}),
        "bad_vocab_invalid_utf8": bundle({"vocab.json": b"{\"\xff\": 0}", "merges.txt": ""}),
        "bad_vocab_deep_nesting": bundle({"vocab.json": b"[" * 3000 + b"]" * 3000, "merges.txt": ""}),
        "bad_vocab_missing_merges": bundle({"vocab.json": MINI_CLIP_VOCAB}),
        # --- merges.txt ---
        "bad_merges_three_symbols": bundle({"vocab.json": MINI_CLIP_VOCAB, "merges.txt": "a b c\n"}),
        "bad_merges_one_symbol": bundle({"vocab.json": MINI_CLIP_VOCAB, "merges.txt": "ab\n"}),
        "bad_merges_unknown_symbol": bundle({"vocab.json": MINI_CLIP_VOCAB, "merges.txt": "a z\n"}),
        "bad_merges_unknown_result": bundle({"vocab.json": MINI_CLIP_VOCAB, "merges.txt": "b c\n"}),
        "bad_merges_invalid_utf8": bundle({"vocab.json": MINI_CLIP_VOCAB, "merges.txt": b"a \xff\n"}),
        # --- tokenizer.json ---
        "bad_json_not_object": bundle({"tokenizer.json": [1, 2]}),
        "bad_json_no_model": bundle({"tokenizer.json": {"added_tokens": []}}),
        "bad_json_model_not_object": bundle({"tokenizer.json": {"model": "BPE"}}),
        "bad_json_wordpiece": with_json(type="WordPiece"),
        "bad_json_type_number": with_json(type=3),
        "bad_json_vocab_array": with_json(vocab=[["a", 0]]),
        "bad_json_no_merges": bundle({"tokenizer.json": {"model": {"type": "BPE", "vocab": MINI_CLIP_VOCAB}}}),
        "bad_json_merges_object": with_json(merges={"a": "b"}),
        "bad_json_merge_three": with_json(merges=[["a", "b", "c"]]),
        "bad_json_merge_number": with_json(merges=[1]),
        "bad_json_merge_symbol_number": with_json(merges=[["a", 1]]),
        "bad_json_merge_string_no_space": with_json(merges=["ab"]),
        "bad_json_added_not_array": with_added({"id": 9}),
        "bad_json_added_not_object": with_added(["<|endoftext|>"]),
        "bad_json_added_no_id": with_added([{"content": "x"}]),
        "bad_json_added_id_string": with_added([{"id": "9", "content": "x"}]),
        "bad_json_added_id_outside": with_added([{"id": 11, "content": "x"}]),
        "bad_json_added_id_negative": with_added([{"id": -1, "content": "x"}]),
        "bad_json_added_empty_content": with_added([{"id": 9, "content": ""}]),
        "bad_json_added_content_number": with_added([{"id": 9, "content": 9}]),
        "bad_json_added_normalized_string": with_added([{"id": 9, "content": "x", "normalized": "yes"}]),
        # --- tokenizer_config.json and special_tokens_map.json ---
        "bad_config_array": with_config([]),
        "bad_config_bos_number": with_config({"bos_token": 9}),
        "bad_config_bos_no_content": with_config({"bos_token": {"normalized": True}}),
        "bad_config_bos_empty": with_config({"bos_token": ""}),
        "bad_config_bos_unknown": with_config({"bos_token": "<s>"}),
        "bad_config_normalized_string": with_config({"bos_token": {"content": "a", "normalized": "no"}}),
        "bad_config_max_length_string": with_config({"model_max_length": "77"}),
        "bad_config_max_length_float": with_config({"model_max_length": 2.7}),
        "bad_config_max_length_negative": with_config({"model_max_length": -1}),
        "bad_config_max_length_one": with_config({"model_max_length": 1}),
        "bad_config_max_length_huge": with_config({"model_max_length": 10**8}),
        "bad_config_decoder_key_text": with_config({"added_tokens_decoder": {"abc": {"content": "a"}}}),
        "bad_config_decoder_key_negative": with_config({"added_tokens_decoder": {"-1": {"content": "a"}}}),
        "bad_config_decoder_key_huge": with_config({"added_tokens_decoder": {"99999999999999999999": {"content": "a"}}}),
        "bad_config_decoder_key_outside": with_config({"added_tokens_decoder": {"11": {"content": "a"}}}),
        "bad_config_decoder_empty_content": with_config({"added_tokens_decoder": {"9": {"content": ""}}}),
        "bad_config_decoder_entry_number": with_config({"added_tokens_decoder": {"9": 9}}),
        "bad_config_not_json": with_config(b"{model_max_length: 77}"),
        "bad_map_not_object": bundle({**mini, "special_tokens_map.json": '"eos"'}),
        "bad_map_eos_unknown": bundle({**mini, "special_tokens_map.json": {"eos_token": {"content": "</s>"}}}),
        "bad_empty": b"",
        "bad_no_files": b"#file notes.txt\nnothing here",
    }


MINI_T5_VOCAB = [["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["\u2581", -2.0], ["a", -3.0], ["b", -3.5],
                 ["c", -4.0], ["\u2581a", -1.5], ["\u2581ab", -1.0], ["A", -4.0], ["fi", -2.5], ["\u00e9", -3.0]]


def t5_tokenizer_json(vocab, normalizer=None, added=None):
    added = added if added is not None else [
        {"id": i, "content": vocab[i][0], "special": True} for i in range(3)]
    return {"version": "1.0", "added_tokens": added, "normalizer": normalizer,
            "model": {"type": "Unigram", "unk_id": 2, "vocab": vocab, "byte_fallback": False}}


def t5_cases(tiny):
    t5 = tiny["tokenizer_2"]
    tiny_doc = json.loads(t5["tokenizer.json"])
    blob = charsmap_blob(CHARSMAP_RULES)
    normalizer = precompiled_normalizer(blob)

    def mini(normalizer=normalizer, vocab=MINI_T5_VOCAB, added=None, **extra):
        return bundle({"tokenizer.json": t5_tokenizer_json(vocab, normalizer, added), **extra})

    def with_blob(broken):
        return mini(precompiled_normalizer(broken))

    def with_base64(text):
        return mini({"type": "Precompiled", "precompiled_charsmap": text})

    units, _ = charsmap_parts(CHARSMAP_RULES)
    leaf = next(i for i, unit in enumerate(units) if unit & (1 << 8) and not unit & (1 << 31))
    value = next(i for i, unit in enumerate(units) if unit & (1 << 31))

    def with_unit(index, unit):
        broken = list(units)
        broken[index] = unit
        return with_blob(charsmap_blob(CHARSMAP_RULES, units=broken))

    # A root whose offset points 4 GB past the units: harmless while the trie size is checked against the blob,
    # a wild read when it is not (the SIGSEGV of issue 13).
    far_root = [(0x3FFFFF << 10) | (1 << 9)]
    tiny_with_charsmap = dict(tiny_doc, normalizer=normalizer)
    return {
        # --- accepted ---
        "valid_tiny": bundle(t5),
        "valid_tiny_precompiled": bundle({"tokenizer.json": tiny_with_charsmap,
                                          "tokenizer_config.json": t5["tokenizer_config.json"]}),
        "valid_mini_precompiled": mini(prompt="\uff21\uff22 \ufb01 cafe\u0301 a\u3000b\u200bc \u2122"),
        "valid_mini_sequence": mini({"type": "Sequence", "normalizers": [
            {"type": "WhitespaceSplit"}, normalizer, {"type": "Replace", "pattern": {"String": " "}, "content": " "}]}),
        "valid_mini_no_normalizer": mini(None),
        "valid_mini_empty_charsmap": with_base64(""),
        "valid_mini_unpadded_base64": with_base64(base64.b64encode(blob).decode().rstrip("=")),
        "valid_mini_from_spiece_sentinels": mini(added=[], **{"tokenizer_config.json": {"extra_ids": 3}}),
        # --- the charsmap: size header, trie units, replacements ---
        "bad_charsmap_trie_larger_than_blob": with_blob(charsmap_blob(CHARSMAP_RULES, trie_size=0xFFFFFFFC)),
        "bad_charsmap_trie_larger_far_root": with_blob(charsmap_blob(CHARSMAP_RULES, trie_size=0xFFFFFFFC,
                                                                     units=far_root)),
        "bad_charsmap_trie_fills_blob": with_blob(struct.pack("<I", 8) + bytes(8)),
        "bad_charsmap_trie_not_multiple_of_4": with_blob(charsmap_blob(CHARSMAP_RULES, trie_size=4 * len(units) - 2)),
        "bad_charsmap_trie_empty": with_blob(struct.pack("<I", 0) + b"x\0"),
        "bad_charsmap_shorter_than_header": with_blob(b"\x01\x02\x03"),
        # Accepted: a root pointing outside the trie matches nothing, so nothing is normalized.
        "quirk_charsmap_root_outside": with_blob(charsmap_blob(CHARSMAP_RULES, units=far_root)),
        "bad_charsmap_leaf_outside": with_unit(leaf, (units[leaf] & 0x3FF) | (0x1FFFFF << 10)),
        "bad_charsmap_value_past_end": with_unit(value, (1 << 31) | 100000),
        "bad_charsmap_not_nul_terminated": with_blob(charsmap_blob(CHARSMAP_RULES)[:-1]),
        "bad_charsmap_replacement_invalid_utf8": with_blob(invalid_utf8_charsmap()),
        "bad_base64_character": with_base64("AAAA*AAA"),
        "bad_base64_padding_inside": with_base64("AA==AAAA"),
        "bad_base64_padding_length": with_base64("AAAAA=="),
        "bad_base64_one_extra_character": with_base64("AAAAA"),
        "bad_charsmap_number": with_base64(12),
        # --- tokenizer.json ---
        "bad_json_not_object": bundle({"tokenizer.json": "Unigram"}),
        "bad_json_no_model": bundle({"tokenizer.json": {"normalizer": normalizer}}),
        "bad_json_bpe": bundle({"tokenizer.json": {"model": {"type": "BPE", "vocab": {}, "merges": []}}}),
        "bad_json_vocab_object": bundle({"tokenizer.json": {"model": {"type": "Unigram", "vocab": {"a": 0}}}}),
        "bad_json_vocab_entry_single": mini(vocab=MINI_T5_VOCAB + [["x"]]),
        "bad_json_vocab_piece_number": mini(vocab=MINI_T5_VOCAB + [[1, -1.0]]),
        "bad_json_vocab_score_string": mini(vocab=MINI_T5_VOCAB + [["x", "-1"]]),
        "bad_json_vocab_score_infinite": bundle({"tokenizer.json": json.dumps(
            t5_tokenizer_json(MINI_T5_VOCAB, None)).replace("-4.0]", "-1e400]", 1)}),
        "bad_json_vocab_too_small": mini(vocab=MINI_T5_VOCAB[:2], added=[], **{"tokenizer_config.json": {"extra_ids": 0}}),
        "bad_json_normalizer_string": mini("Precompiled"),
        "bad_json_normalizers_not_array": mini({"type": "Sequence", "normalizers": normalizer}),
        "bad_json_normalizers_entry_number": mini({"type": "Sequence", "normalizers": [1]}),
        "bad_json_added_id_outside": mini(added=[{"id": len(MINI_T5_VOCAB), "content": "<x>"}]),
        "bad_json_added_id_float": mini(added=[{"id": 1.0, "content": "</s>"}]),
        "bad_json_added_empty_content": mini(added=[{"id": 1, "content": ""}]),
        "bad_json_added_no_content": mini(added=[{"id": 1}]),
        # --- tokenizer_config.json ---
        "bad_config_array": mini(**{"tokenizer_config.json": [1]}),
        "bad_config_extra_ids_float": mini(added=[], **{"tokenizer_config.json": {"extra_ids": 2.7}}),
        "bad_config_extra_ids_negative": mini(added=[], **{"tokenizer_config.json": {"extra_ids": -3}}),
        "bad_config_extra_ids_huge": mini(added=[], **{"tokenizer_config.json": {"extra_ids": 10**12}}),
        "bad_config_eos_unknown": mini(**{"tokenizer_config.json": {"eos_token": "<eos>"}}),
        "bad_config_eos_number": mini(**{"tokenizer_config.json": {"eos_token": 1}}),
        "bad_config_pad_object_no_content": mini(**{"tokenizer_config.json": {"pad_token": {"id": 0}}}),
        "bad_config_max_length_zero": mini(**{"tokenizer_config.json": {"model_max_length": 0}}),
        "bad_config_max_length_bool": mini(**{"tokenizer_config.json": {"model_max_length": True}}),
        "bad_empty": b"",
    }


def invalid_utf8_charsmap():
    """One rule whose replacement is a lone continuation byte."""
    return charsmap_blob({"\uff21": "x"}, replacements=b"\x80\0")


# --- spiece.model: protobuf written by hand (sentencepiece_model.proto) ---------------------------------------

def varint(value):
    out = b""
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field_bytes(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def field_float(number, value):
    return varint(number << 3 | 5) + struct.pack("<f", value)


NORMAL, UNKNOWN, CONTROL = 1, 2, 3


def spiece_model(pieces, charsmap=b"", trainer=None, normalizer_extra=b""):
    """ModelProto: pieces (1), trainer_spec (2: model_type 3 = UNIGRAM, vocab_size 4, unk/bos/eos/pad ids
    40-43), normalizer_spec (3: name 1, precompiled_charsmap 2, add_dummy_prefix 3)."""
    body = b""
    for piece, score, kind in pieces:
        body += field_bytes(1, field_bytes(1, piece.encode("utf-8")) + field_float(2, score) + field_varint(3, kind))
    if trainer is None:
        trainer = (field_varint(3, 1) + field_varint(4, len(pieces)) + field_varint(40, 2) +
                   field_varint(41, 2**64 - 1) + field_varint(42, 1) + field_varint(43, 0))
    body += field_bytes(2, trainer)
    normalizer = field_bytes(1, b"nmt_nfkc" if charsmap else b"identity")
    if charsmap:
        normalizer += field_bytes(2, charsmap)
    body += field_bytes(3, normalizer + field_varint(3, 1) + normalizer_extra)
    return body


MINI_PIECES = [("<pad>", 0.0, CONTROL), ("</s>", 0.0, CONTROL), ("<unk>", 0.0, UNKNOWN)] + [
    (piece, score, NORMAL) for piece, score in MINI_T5_VOCAB[3:]]


def spiece_cases(tiny):
    blob = charsmap_blob(CHARSMAP_RULES)
    valid = spiece_model(MINI_PIECES, blob)
    tiny_vocab = json.loads(tiny["tokenizer_2"]["tokenizer.json"])["model"]["vocab"]
    # The tiny T5 vocabulary without its sentinels, which transformers appends itself for spiece.model.
    tiny_pieces = [(p, s, CONTROL if i < 2 else UNKNOWN if i == 2 else NORMAL)
                   for i, (p, s) in enumerate(tiny_vocab) if not p.startswith("<extra_id_")]
    huge_length = varint(3 << 3 | 2) + varint(2**63)
    return {
        # --- accepted ---
        "valid_mini_charsmap": valid,
        "valid_mini_identity": spiece_model(MINI_PIECES),
        "valid_tiny_charsmap": spiece_model(tiny_pieces, blob),
        # Two normalizer_spec fields merge; the later charsmap wins, as protobuf's parser decides.
        "valid_two_normalizer_specs": valid + field_bytes(3, field_bytes(2, charsmap_blob({"\uff21": "a"}))),
        # Unknown fields of every wire type, a group holding a would-be normalizer_spec among them: skipped.
        "valid_unknown_fields": valid + field_varint(90, 7) + varint(91 << 3 | 1) + bytes(8) + field_float(92, 1.0)
        + varint(93 << 3 | 3) + field_bytes(3, field_bytes(2, b"junk")) + varint(93 << 3 | 4),
        # --- framing ---
        "bad_empty": b"",
        "bad_truncated_half": valid[: len(valid) // 2],
        "bad_truncated_last_byte": valid[:-1],
        "bad_huge_length": valid + huge_length,
        "bad_overlong_varint": valid + b"\xff" * 11 + b"\x01",
        "bad_not_protobuf": b"not a sentencepiece model\n",
        "bad_group_not_closed": valid + varint(9 << 3 | 3) + field_bytes(3, b""),
        "bad_group_end_without_start": valid + varint(9 << 3 | 4),
        "bad_wire_type_7": valid + varint(9 << 3 | 7),
        # --- the model ---
        "bad_no_unknown_piece": spiece_model([(p, s, NORMAL if k == UNKNOWN else k) for p, s, k in MINI_PIECES], blob),
        "bad_duplicate_piece": spiece_model(MINI_PIECES + [("a", -5.0, NORMAL)], blob),
        # sentencepiece's darts-clone throws its own exception type from Load for a piece starting with NUL
        # (found by spiece_fuzz; the loaders' final net turns it into a dp::Error naming the file).
        "bad_piece_starting_with_nul": spiece_model(MINI_PIECES + [("\0\0\0\x80", -1.5, NORMAL)], blob),
        "bad_no_eos_piece": spiece_model([("<pad>", 0.0, CONTROL), ("<unk>", 0.0, UNKNOWN), ("a", -1.0, NORMAL)]),
        # --- the charsmap ---
        "bad_charsmap_trie_larger_than_blob": spiece_model(MINI_PIECES, charsmap_blob(CHARSMAP_RULES, trie_size=0xFFFFFFFC)),
        "bad_charsmap_trie_larger_far_root": spiece_model(
            MINI_PIECES, charsmap_blob(CHARSMAP_RULES, trie_size=0xFFFFFFFC, units=[(0x3FFFFF << 10) | (1 << 9)])),
        "bad_charsmap_replacement_invalid_utf8": spiece_model(MINI_PIECES, invalid_utf8_charsmap()),
        "bad_charsmap_truncated_length": spiece_model(MINI_PIECES, blob, normalizer_extra=huge_length),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(HERE))
    parser.add_argument("--diffpipe", default=os.path.join(root, "build", "diffpipe"),
                        help="the diffpipe binary whose make-tiny writes the tiny tokenizers")
    parser.add_argument("--only", help="write only this corpus (e.g. lora_file)")
    args = parser.parse_args()
    if args.only == "lora_file":
        write("lora_file", lora_cases())
        return
    if args.only == "png_text":
        write("png_text", png_text_cases())
        return
    write("png_text", png_text_cases())
    write("lora_file", lora_cases())
    write("safetensors", safetensors_cases())
    write("index", index_cases())
    tiny = make_tiny_tokenizers(args.diffpipe)
    write("clip_tokenizer", clip_cases(tiny))
    write("t5_tokenizer", t5_cases(tiny))
    write("spiece", spiece_cases(tiny))


if __name__ == "__main__":
    main()
