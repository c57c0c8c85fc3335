#!/usr/bin/env python3
"""Oracle for the CLIP and T5 tokenizers: tiny tokenizers built offline, and transformers' ids on the corpus.

CLIP: a byte-level BPE vocabulary (the 512 base symbols plus merges learned here on the corpus) written in
CLIP's vocab.json/merges.txt format as FLUX.1-dev ships it, and the same tokenizer after save_pretrained.
T5: a sentencepiece unigram model trained on the corpus, in a folder with spiece.model only and in one with
tokenizer.json only (save_pretrained). Expected ids are what FluxPipeline's calls give (padding="max_length",
truncation=True), plus the untruncated ids."""
import argparse
import collections
import io
import json
import pathlib
import shutil

import sentencepiece as spm
from transformers import CLIPTokenizer, T5TokenizerFast

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE.parent / "data" / "prompts_corpus.txt"


def read_corpus() -> list:
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
    prompts = []
    for line in CORPUS.read_text(encoding="utf-8").split("\n"):
        if not line or line.startswith("#"):
            continue
        if line == "\\e":
            prompts.append("")
            continue
        out, i = [], 0
        while i < len(line):
            if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in escapes:
                out.append(escapes[line[i + 1]])
                i += 2
            else:
                out.append(line[i])
                i += 1
        prompts.append("".join(out))
    return prompts


def byte_symbols() -> list:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def clip_words(prompts: list) -> collections.Counter:
    """Pre-tokenized words, via transformers' own CLIP pipeline (normalizer + pre-tokenizer)."""
    symbols = byte_symbols()
    base = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    base.update({"<|startoftext|>": len(base), "<|endoftext|>": len(base) + 1})
    backend = CLIPTokenizer(vocab=base, merges=[]).backend_tokenizer
    words = collections.Counter()
    for prompt in prompts:
        normalized = backend.normalizer.normalize_str(prompt)
        for word, _ in backend.pre_tokenizer.pre_tokenize_str(normalized):
            chars = list(word)
            chars[-1] += "</w>"
            words[tuple(chars)] += 1
    return words


def learn_merges(words: collections.Counter, count: int) -> list:
    merges = []
    words = dict(words)
    for _ in range(count):
        pairs = collections.Counter()
        for word, freq in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += freq
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])
        merges.append(best)
        merged = {}
        for word, freq in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + freq
        words = merged
    return merges


def write_clip_hub_folder(folder: pathlib.Path, prompts: list, raw_eos: bool = False) -> None:
    """vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json, as FLUX.1-dev's tokenizer/.
    raw_eos: <|endoftext|> is an added token with normalized false, matched in the raw text before lower-casing
    and whitespace cleaning (the tokenizer's other path for added tokens)."""
    folder.mkdir(parents=True, exist_ok=True)
    symbols = byte_symbols()
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    merges = learn_merges(clip_words(prompts), 600)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    bos, eos = len(vocab), len(vocab) + 1
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = bos, eos
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n",
                                       encoding="utf-8")
    token = lambda content: {"content": content, "lstrip": False,
                             "normalized": not (raw_eos and content == "<|endoftext|>"), "rstrip": False,
                             "single_word": False}
    config = {"add_prefix_space": False, "bos_token": "<|startoftext|>", "clean_up_tokenization_spaces": True,
              "do_lower_case": True, "eos_token": "<|endoftext|>", "errors": "replace", "model_max_length": 77,
              "pad_token": "<|endoftext|>", "tokenizer_class": "CLIPTokenizer", "unk_token": "<|endoftext|>",
              "added_tokens_decoder": {str(bos): dict(token("<|startoftext|>"), special=True),
                                       str(eos): dict(token("<|endoftext|>"), special=True)}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    special = {"bos_token": token("<|startoftext|>"), "eos_token": token("<|endoftext|>"),
               "pad_token": "<|endoftext|>", "unk_token": token("<|endoftext|>")}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2))


def write_t5_spiece_folder(folder: pathlib.Path, prompts: list) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    sentences = [p for p in prompts if p.strip()] * 4 + ["the quick brown fox jumps over the lazy dog"] * 8
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, vocab_size=320,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   character_coverage=0.995, normalization_rule_name="nmt_nfkc",
                                   hard_vocab_limit=False, minloglevel=2, num_threads=1, seed_sentencepiece_size=5000)
    (folder / "spiece.model").write_bytes(model.getvalue())
    write_t5_config(folder)


def write_t5_config(folder: pathlib.Path) -> None:
    """tokenizer_config.json beside a spiece.model, as FLUX.1-dev's tokenizer_2 has it (100 extra ids)."""
    config = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "extra_ids": 100,
              "additional_special_tokens": [f"<extra_id_{i}>" for i in range(100)], "model_max_length": 512,
              "legacy": True, "tokenizer_class": "T5Tokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def expected(tokenizer, prompts: list, max_lengths: list) -> list:
    cases = []
    for prompt in prompts:
        case = {"prompt": prompt, "untruncated": tokenizer(prompt).input_ids, "padded": {}}
        for max_length in max_lengths:
            case["padded"][str(max_length)] = tokenizer(prompt, padding="max_length", max_length=max_length,
                                                        truncation=True).input_ids
        cases.append(case)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    out = pathlib.Path(parser.parse_args().out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    prompts = read_corpus()
    # Prompts the tokenizers were not trained on: unknown characters, special tokens in upper case.
    extra = prompts + ["ÿ unseen ☃ snowman ⛄ and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "<|ENDOFTEXT|> upper special", "x<|startoftext|>y"]
    results = {}

    write_clip_hub_folder(out / "clip_hub", prompts)
    clip = CLIPTokenizer.from_pretrained(out / "clip_hub")
    assert clip.model_max_length == 77, clip.model_max_length
    results["clip_hub"] = {"kind": "clip", "cases": expected(clip, extra, [77, 20])}
    clip.save_pretrained(out / "clip_saved")
    results["clip_saved"] = {"kind": "clip",
                             "cases": expected(CLIPTokenizer.from_pretrained(out / "clip_saved"), extra, [77])}

    write_clip_hub_folder(out / "clip_raw_eos", prompts, raw_eos=True)
    raw = CLIPTokenizer.from_pretrained(out / "clip_raw_eos")
    assert any(not t.normalized for t in raw.added_tokens_decoder.values()), raw.added_tokens_decoder
    raw_prompts = extra + ["a cat<|endoftext|>a dog", "<|endoftext|><|endoftext|>", "red  <|endoftext|>  Blue",
                           "<|endoftext|"]
    results["clip_raw_eos"] = {"kind": "clip", "cases": expected(raw, raw_prompts, [77, 8])}

    write_t5_spiece_folder(out / "t5_spiece", prompts)
    t5 = T5TokenizerFast.from_pretrained(out / "t5_spiece")
    results["t5_spiece"] = {"kind": "t5", "cases": expected(t5, extra, [512, 256, 16])}
    t5.save_pretrained(out / "t5_json")
    assert not (out / "t5_json" / "spiece.model").exists()
    results["t5_json"] = {"kind": "t5",
                          "cases": expected(T5TokenizerFast.from_pretrained(out / "t5_json"), extra, [512, 16])}
    (out / "cases.json").write_text(json.dumps(results, ensure_ascii=False), encoding="utf-8")
    print("tokenizers:", {name: len(r["cases"]) for name, r in results.items()},
          "folders:", {p.name: sorted(f.name for f in p.iterdir()) for p in out.iterdir() if p.is_dir()})


if __name__ == "__main__":
    main()
