#!/usr/bin/env python3
"""Writes the seed corpora for the fuzz targets in tests/fuzz.

corpus/safetensors/: whole safetensors file images, valid ones (so the fuzzer starts from the success path),
accepted-but-questionable ones (quirk_*), and one per way a file can be broken (so every rejection branch is covered from the first execution, and
the replay test in the g++ build checks each of them cleanly raises dp::Error).
corpus/index/: *.safetensors.index.json bodies for index_fuzz.cpp, which pairs them with two fixed shards
(a, b in model-00001-of-00002.safetensors; c in model-00002-of-00002.safetensors).

Deterministic: rerunning rewrites identical bytes. Files the fuzzer found (crash-*, regression-*) are kept.
Run: python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct
import sys

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
        # --- accepted, but questionable: pinned so a behaviour change shows up in review ---
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


if __name__ == "__main__":
    write("safetensors", safetensors_cases())
    write("index", index_cases())
