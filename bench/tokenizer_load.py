#!/usr/bin/env python3
"""FLUX's tokenizers at full size: load and encode time, diffpipe's C++ tokenizers beside transformers', and
their ids compared (a full-vocabulary check the tiny oracle folders cannot give).

No model can be downloaded here, so the folders are built at FLUX.1-dev's sizes:
  tokenizer/    CLIP's vocab.json (49408 entries) and merges.txt (48894 merges): the 512 byte symbols and
                merges drawn at random over them (each merge's parts already in the vocabulary, at most 12
                characters), written as FLUX.1-dev ships them;
  tokenizer_2/  a sentencepiece unigram model of 32000 pieces trained on this machine's Python sources, saved by
                T5TokenizerFast.save_pretrained (tokenizer.json, spiece.model, 100 extra ids: 32100 tokens).
Both are built once into --work (a few minutes for sentencepiece) and reused.

    python3 bench/tokenizer_load.py --bench build/bench/tokenizer_bench [--work DIR] [--repeat N]

Prints figures only: nothing passes or fails on a time. Exits 1 when the ids differ from transformers'."""
import argparse
import glob
import json
import pathlib
import random
import subprocess
import sys
import time

# The oracle's own helpers: CLIP's byte symbols and T5's tokenizer_config.json.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "reference"))
from cases_tokenizers import byte_symbols, write_t5_config  # noqa: E402

PROMPT = ("a photograph of an astronaut riding a horse across a frozen lake at dawn, ultra detailed, 35mm, "
          "soft light, mist rising from the ice, mountains in the distance")


def write_clip(folder: pathlib.Path, merge_count: int = 48894, seed: int = 0) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    symbols = byte_symbols()
    letters = [s for s in symbols if s.isalpha() and s.isascii()]
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    starts = list(letters)  # pieces a merge may begin with (no end-of-word mark)
    merges = []
    while len(merges) < merge_count:
        a = rng.choice(starts if rng.random() < 0.7 else letters)
        b = rng.choice(letters)
        if rng.random() < 0.5:
            b += "</w>"
        merged = a + b
        if len(merged.replace("</w>", "")) > 12 or merged in vocab:
            continue
        merges.append((a, b))
        vocab[merged] = len(vocab)
        if not merged.endswith("</w>"):
            starts.append(merged)
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n",
                                       encoding="utf-8")
    config = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
              "unk_token": "<|endoftext|>", "do_lower_case": True, "model_max_length": 77,
              "tokenizer_class": "CLIPTokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def write_t5(folder: pathlib.Path, work: pathlib.Path) -> None:
    import sentencepiece as spm
    from transformers import T5TokenizerFast
    corpus = work / "corpus.txt"
    lines = []
    for path in sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True)):
        try:
            lines.extend(l.strip() for l in open(path, encoding="utf-8") if len(l.strip()) > 20)
        except (UnicodeDecodeError, OSError):
            continue
    corpus.write_text("\n".join(lines), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(work / "spiece"), vocab_size=32000,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   normalization_rule_name="nmt_nfkc", input_sentence_size=400000,
                                   shuffle_input_sentence=True, minloglevel=2, num_threads=2)
    # As FLUX.1-dev's tokenizer_2 came to be: the sentencepiece folder read by T5TokenizerFast, then saved.
    spiece_dir = work / "t5_spiece"
    spiece_dir.mkdir(exist_ok=True)
    (spiece_dir / "spiece.model").write_bytes((work / "spiece.model").read_bytes())
    write_t5_config(spiece_dir)
    T5TokenizerFast.from_pretrained(str(spiece_dir)).save_pretrained(str(folder))


def transformers_figures(clip_dir: pathlib.Path, t5_dir: pathlib.Path, repeat: int) -> dict:
    from transformers import CLIPTokenizer, T5TokenizerFast
    out = {}
    for name, cls, folder, length in (("clip", CLIPTokenizer, clip_dir, 77), ("t5", T5TokenizerFast, t5_dir, 512)):
        loads, encodes = [], []
        for _ in range(repeat):
            started = time.perf_counter()
            tokenizer = cls.from_pretrained(str(folder))
            loads.append(time.perf_counter() - started)
            started = time.perf_counter()
            ids = tokenizer(PROMPT, padding="max_length", max_length=length, truncation=True)["input_ids"]
            encodes.append(time.perf_counter() - started)
        out[name] = {"load_s": sorted(loads)[len(loads) // 2], "encode_s": sorted(encodes)[len(encodes) // 2],
                     "ids": ids}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", required=True, help="build/bench/tokenizer_bench")
    parser.add_argument("--work", default="/tmp/diffpipe-fullsize-tokenizers")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    work = pathlib.Path(args.work)
    clip_dir, t5_dir = work / "tokenizer", work / "tokenizer_2"
    if not (clip_dir / "merges.txt").exists():
        started = time.perf_counter()
        write_clip(clip_dir)
        print(f"wrote {clip_dir} in {time.perf_counter() - started:.1f} s", flush=True)
    if not (t5_dir / "tokenizer.json").exists():
        started = time.perf_counter()
        write_t5(t5_dir, work)
        print(f"wrote {t5_dir} in {time.perf_counter() - started:.1f} s", flush=True)
    ours = json.loads(subprocess.run([args.bench, str(clip_dir), str(t5_dir), PROMPT, "--repeat", str(args.repeat)],
                                     check=True, capture_output=True, text=True).stdout)
    theirs = transformers_figures(clip_dir, t5_dir, args.repeat)
    sizes = {"clip": json.loads((clip_dir / "vocab.json").read_text()).__len__(),
             "t5": json.loads((t5_dir / "tokenizer.json").read_text())["model"]["vocab"].__len__()}
    print(f"median of {args.repeat}, files in the page cache; prompt of {len(PROMPT)} characters")
    print("| tokenizer | vocabulary | diffpipe first load | diffpipe load | transformers load | ratio | diffpipe encode "
          "| transformers encode |")
    print("|---|---|---|---|---|---|---|---|")
    status = 0
    for name in ("clip", "t5"):
        a, b = ours[name], theirs[name]
        print(f"| {name} | {sizes[name]} | {a['first_load_s'] * 1e3:.1f} ms | {a['load_s'] * 1e3:.1f} ms | {b['load_s'] * 1e3:.1f} ms | "
              f"{a['load_s'] / b['load_s']:.2f}x | {a['encode_s'] * 1e3:.2f} ms | {b['encode_s'] * 1e3:.2f} ms |")
        if a["ids"] != b["ids"]:
            print(f"{name}: ids differ from transformers':\n  ours   {a['ids'][:40]}\n  theirs {b['ids'][:40]}")
            status = 1
    print("ids identical to transformers'" if status == 0 else "IDS DIFFER")
    return status


if __name__ == "__main__":
    sys.exit(main())
