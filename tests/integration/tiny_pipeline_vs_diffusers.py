#!/usr/bin/env python3
"""`diffpipe make-tiny` against diffusers: the folder make-tiny writes must load with
FluxPipeline.from_pretrained and give the same packed latents and images as `diffpipe generate`.

Needs DIFFPIPE_BINARY (the built diffpipe) and the pinned venv (torch, diffusers, transformers, h5py, PIL).
DIFFPIPE_LAUNCH, when set, prefixes the generate commands (e.g. "mpirun --oversubscribe -np 3"), so the same
comparison checks a multi-rank run. DIFFPIPE_GENERATE_EXTRA adds generate options (e.g. "--sequence-parallel 3")
and DIFFPIPE_MAKE_TINY_EXTRA make-tiny options (e.g. "--attention-heads 12", a head count K = 3 and 4 divide).
Exits non-zero with a message naming the first check that failed."""
import os
import pathlib
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
from PIL import Image
from diffusers import FluxPipeline

PROMPTS = ["a cat sipping a margarita in a pool in Palm Springs", "cinematic film still, moody, film grain"]
CALL = dict(num_images_per_prompt=2, height=64, width=96, steps=3, seed=5, guidance=3.5, max_sequence_length=64)
LATENT_TOLERANCE = 1e-4  # max abs error relative to the latents' scale; fp32 CPU on both sides
MIN_PSNR_DB = 40.0


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def run(command: list) -> str:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result.stdout + result.stderr


def generate(binary: str, model: pathlib.Path, out: pathlib.Path, output_type: str) -> None:
    command = os.environ.get("DIFFPIPE_LAUNCH", "").split() + [binary, "generate", "--model", str(model), "--dtype", "fp32", "--device", "cpu"]
    for prompt in PROMPTS:
        command += ["--prompt", prompt]
    command += ["--num-images-per-prompt", str(CALL["num_images_per_prompt"]), "--height", str(CALL["height"]),
                "--width", str(CALL["width"]), "--steps", str(CALL["steps"]), "--seed", str(CALL["seed"]),
                "--guidance", str(CALL["guidance"]), "--max-sequence-length", str(CALL["max_sequence_length"]),
                "--output-type", output_type, "--out", str(out)]
    command += os.environ.get("DIFFPIPE_GENERATE_EXTRA", "").split()
    run(command)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def check_tokenizers(pipe: FluxPipeline, binary: str, model: pathlib.Path) -> None:
    # transformers must read the tiny tokenizers as we do; the ids themselves are covered by the
    # tokenizer oracle, so here it is enough that they are sane and encode the prompt words as whole tokens.
    clip = pipe.tokenizer(PROMPTS[0]).input_ids
    if clip[0] != pipe.tokenizer.bos_token_id or clip[-1] != pipe.tokenizer.eos_token_id:
        fail(f"CLIP ids {clip} do not start with bos / end with eos")
    t5 = pipe.tokenizer_2("a cat in a pool").input_ids
    if len(t5) != 6 or t5[-1] != pipe.tokenizer_2.eos_token_id:
        fail(f"T5 ids {t5} are not one id per word plus </s>")
    if len(pipe.tokenizer) != pipe.text_encoder.config.vocab_size:
        fail(f"CLIP tokenizer has {len(pipe.tokenizer)} tokens, text_encoder {pipe.text_encoder.config.vocab_size}")
    if len(pipe.tokenizer_2) != pipe.text_encoder_2.config.vocab_size:
        fail(f"T5 tokenizer has {len(pipe.tokenizer_2)} tokens, text_encoder_2 "
             f"{pipe.text_encoder_2.config.vocab_size}")


def main() -> None:
    binary = os.environ.get("DIFFPIPE_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        fail("set DIFFPIPE_BINARY to the built diffpipe executable")
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="diffpipe-tiny-") as tmp:
        tmp = pathlib.Path(tmp)
        model = tmp / "pipe"
        print(run([binary, "make-tiny", "--out", str(model)] + os.environ.get("DIFFPIPE_MAKE_TINY_EXTRA", "").split()).strip())
        generate(binary, model, tmp / "l.h5", "latent")
        generate(binary, model, tmp / "img.png", "png")

        pipe = FluxPipeline.from_pretrained(model, torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        check_tokenizers(pipe, binary, model)
        call = dict(prompt=PROMPTS, num_images_per_prompt=CALL["num_images_per_prompt"], height=CALL["height"],
                    width=CALL["width"], num_inference_steps=CALL["steps"], guidance_scale=CALL["guidance"],
                    max_sequence_length=CALL["max_sequence_length"])
        with torch.inference_mode():
            expected_latents = pipe(**call, generator=torch.Generator("cpu").manual_seed(CALL["seed"]),
                                    output_type="latent").images.float().numpy()
            expected_images = pipe(**call, generator=torch.Generator("cpu").manual_seed(CALL["seed"]),
                                   output_type="pil").images

        with h5py.File(tmp / "l.h5", "r") as f:
            latents = np.asarray(f["latents"], dtype=np.float32)
        if latents.shape != expected_latents.shape:
            fail(f"latents shape {latents.shape}, diffusers {expected_latents.shape}")
        scale = float(np.abs(expected_latents).max())
        error = float(np.abs(latents - expected_latents).max()) / scale
        print(f"packed latents {latents.shape}: relative max error {error:.3g}")
        if not error <= LATENT_TOLERANCE:
            fail(f"packed latents differ from diffusers: relative max error {error:.3g} > {LATENT_TOLERANCE}")

        for i, expected in enumerate(expected_images):
            path = tmp / f"img-{i}.png"
            if not path.exists():
                fail(f"diffpipe generate did not write {path.name}")
            ours = np.asarray(Image.open(path).convert("RGB"))
            theirs = np.asarray(expected.convert("RGB"))
            if ours.shape != theirs.shape:
                fail(f"{path.name}: shape {ours.shape}, diffusers {theirs.shape}")
            db = psnr(ours, theirs)
            print(f"{path.name}: PSNR {db:.1f} dB, pixel std {ours.std():.1f}")
            if not db >= MIN_PSNR_DB:
                fail(f"{path.name}: PSNR {db:.1f} dB against diffusers < {MIN_PSNR_DB}")
            if ours.std() < 2.0:
                fail(f"{path.name}: the image is (nearly) constant (std {ours.std():.2f})")
    print("OK: make-tiny's pipeline matches diffusers")


if __name__ == "__main__":
    main()
