#!/usr/bin/env python3
"""The seed guide's FLUX.1-dev workflow in diffusers on two GPUs, timed per phase (bench/gpu_two.sh runs it).

The guide's five steps, as it writes them, with max_memory {0: "16GB", 1: "16GB"}:
  1. encode: FluxPipeline.from_pretrained(transformer=None, vae=None, device_map="balanced"), encode_prompt;
  2. free the text encoders;
  3. denoise: FluxTransformer2DModel.from_pretrained(device_map="auto"), a pipeline around it without encoders
     or VAE, called on the prompt embeddings with output_type="latent";
  4. free the transformer;
  5. decode: AutoencoderKL on cuda, unpack and unscale the latents, vae.decode, postprocess, save.
Each phase is timed with its loading (device synchronised around it) and reports the peak allocated bytes of
every GPU; steps 2 and 4 (freeing) are timed together, apart. The interpreter's start-up (python3 plus the imports) is reported apart: `startup_seconds` is from
the process start (given by the caller as --started-at, `date +%s.%N` before python3) to the imports' end.
Figures only; nothing passes or fails on a time.

    python3 bench/seed_diffusers_two_gpu.py --model DIR --out seed-diffusers.png --json seed-diffusers.json \\
        --started-at "$(date +%s.%N)"
"""
import argparse
import json
import sys
import time

imports_started = time.time()
import gc  # noqa: E402

import torch  # noqa: E402
from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel  # noqa: E402
from diffusers.image_processor import VaeImageProcessor  # noqa: E402

PROMPT = ("cinematic film still of a cat sipping a margarita in a pool in Palm Springs, California highly "
          "detailed, high budget hollywood movie, cinemascope, moody, epic, gorgeous, film grain")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--width", type=int, default=1360)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--guidance", type=float, default=3.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-memory", default="16GB", help="per GPU, as the guide's max_memory")
    parser.add_argument("--started-at", type=float, default=None, help="the process start (time.time() units)")
    args = parser.parse_args()
    imported = time.time()
    gpus = torch.cuda.device_count()
    if gpus < 2:
        print(f"needs two GPUs, found {gpus}", file=sys.stderr)
        return 1
    max_memory = {0: args.max_memory, 1: args.max_memory}
    dtype = torch.bfloat16
    phases = {}

    def sync():
        for g in range(gpus):
            torch.cuda.synchronize(g)

    class Phase:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            sync()
            for g in range(gpus):
                torch.cuda.reset_peak_memory_stats(g)
            self.started = time.perf_counter()
            return self

        def __exit__(self, *exc):
            sync()
            phases[self.name] = {"seconds": time.perf_counter() - self.started,
                                 "peak_bytes_per_gpu": [torch.cuda.max_memory_allocated(g) for g in range(gpus)]}

    def flush():
        gc.collect()
        torch.cuda.empty_cache()
        for g in range(gpus):
            torch.cuda.reset_peak_memory_stats(g)

    maps = {}
    run_started = time.perf_counter()
    with torch.inference_mode():
        with Phase("encode"):  # steps 1 and 2
            pipeline = FluxPipeline.from_pretrained(args.model, transformer=None, vae=None, device_map="balanced",
                                                    max_memory=max_memory, torch_dtype=dtype)
            maps["encode"] = {k: str(v) for k, v in (pipeline.hf_device_map or {}).items()}
            prompt_embeds, pooled_prompt_embeds, _ = pipeline.encode_prompt(prompt=PROMPT, prompt_2=None,
                                                                            max_sequence_length=512)
        # Freeing is outside the phases so that each phase's peak is read before flush() resets the counters.
        freeing = time.perf_counter()
        del pipeline.text_encoder, pipeline.text_encoder_2, pipeline.tokenizer, pipeline.tokenizer_2, pipeline
        flush()
        with Phase("denoise"):  # steps 3 and 4
            transformer = FluxTransformer2DModel.from_pretrained(args.model, subfolder="transformer", device_map="auto",
                                                                 max_memory=max_memory, torch_dtype=dtype)
            maps["denoise"] = {k: str(v) for k, v in (getattr(transformer, "hf_device_map", None) or {}).items()}
            pipeline = FluxPipeline.from_pretrained(args.model, text_encoder=None, text_encoder_2=None, tokenizer=None,
                                                    tokenizer_2=None, vae=None, transformer=transformer,
                                                    torch_dtype=dtype)
            pipeline.set_progress_bar_config(disable=True)
            latents = pipeline(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled_prompt_embeds,
                               num_inference_steps=args.steps, guidance_scale=args.guidance, height=args.height,
                               width=args.width, generator=torch.Generator("cpu").manual_seed(args.seed),
                               output_type="latent").images
        del pipeline.transformer, pipeline, transformer
        flush()
        free_seconds = time.perf_counter() - freeing - phases["denoise"]["seconds"]
        with Phase("decode"):  # step 5
            vae = AutoencoderKL.from_pretrained(args.model, subfolder="vae", torch_dtype=dtype).to("cuda")
            maps["decode"] = {"vae": "cuda:0"}
            vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
            image_processor = VaeImageProcessor(vae_scale_factor=vae_scale_factor)
            z = FluxPipeline._unpack_latents(latents, args.height, args.width, vae_scale_factor)
            z = (z / vae.config.scaling_factor) + vae.config.shift_factor
            image = vae.decode(z, return_dict=False)[0]
            image_processor.postprocess(image, output_type="pil")[0].save(args.out)
    run_seconds = time.perf_counter() - run_started
    startup = imported - args.started_at if args.started_at else imported - imports_started
    result = {"phases": phases, "hf_device_map": maps, "run_seconds": run_seconds, "startup_seconds": startup,
              "free_seconds": free_seconds,
              "end_to_end_seconds": run_seconds + startup, "torch": torch.__version__,
              "gpus": [torch.cuda.get_device_name(g) for g in range(gpus)]}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"diffusers seed workflow: start-up {startup:.2f} s, run {run_seconds:.2f} s "
          f"(freeing between the phases {free_seconds:.2f} s), end to end {run_seconds + startup:.2f} s")
    for name, p in phases.items():
        peaks = " / ".join(f"{b / 1e9:.2f}" for b in p["peak_bytes_per_gpu"])
        print(f"  {name:8s} {p['seconds']:7.2f} s  peak GB per GPU {peaks}  hf_device_map {json.dumps(maps.get(name))[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
