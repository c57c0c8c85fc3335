#!/usr/bin/env python3
"""The oracle at full size, on a GPU: one FLUX.1-dev transformer forward (random weights written by
`diffpipe make-random --arch flux-dev`), diffpipe against diffusers on the same weights and inputs, both in
bf16 on CUDA. The tiny oracle cases (cases_flux.py) cannot show a mistake that only full width, 19 + 38 blocks,
24 heads of 128 or 512 text tokens bring out; this can. Run by bench/gpu_check.sh (CI has no GPU).

    python3 tests/reference/full_size_gpu_oracle.py --diffpipe build-gpu/diffpipe --model FOLDER

Passes when diffpipe's output is finite and close to diffusers': the largest difference within --tolerance
of the largest magnitude of diffusers' output (as the CUDA oracle tests measure), and the mean difference
within --mean-tolerance of the mean magnitude. Needs torch with CUDA, diffusers and safetensors. Exits
non-zero with a line saying why."""
import argparse
import pathlib
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file

# bf16 keeps 8 bits: one rounding is 2^-8 (0.0039) of the scale. The tiny CUDA oracle allows 8 ulps (3.2e-2) at
# the largest element and measures about one; 57 blocks of residual updates and another kernel order
# (flash SDPA, fused kernels, cuBLASLt epilogues) can add a few more there, so 16 ulps. The mean difference is
# the sharper test: rounding leaves it near one ulp, while an error in the formulas moves most elements (on
# the tiny model, timesteps off by 2x gave 7.9% mean, 7.6% max), so 4 ulps.
DEFAULT_TOLERANCE = 6.4e-2
DEFAULT_MEAN_TOLERANCE = 1.6e-2


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--diffpipe", required=True)
    parser.add_argument("--model", required=True, help="folder written by make-random --arch flux-dev")
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--text-len", type=int, default=512)
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    parser.add_argument("--mean-tolerance", type=float, default=DEFAULT_MEAN_TOLERANCE)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        fail("no CUDA device: this check needs the GPU machine")
    with tempfile.TemporaryDirectory(prefix="full-size-oracle-") as tmp:
        saved = pathlib.Path(tmp) / "diffpipe.safetensors"
        command = [args.diffpipe, "forward", "--model", args.model, "--device", "cuda", "--dtype", "bf16",
                   "--height", str(args.height), "--width", str(args.width), "--text-len", str(args.text_len),
                   "--repeat", "1", "--warmup", "0", "--seed", "0", "--save", str(saved)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            fail(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        tensors = load_file(str(saved))
    ours = tensors["output"].float()

    from diffusers import FluxTransformer2DModel
    model = FluxTransformer2DModel.from_pretrained(args.model, subfolder="transformer", torch_dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    if model.config.num_layers != 19 or model.config.num_single_layers != 38 or model.config.num_attention_heads != 24:
        fail(f"{args.model} is not FLUX.1-dev's architecture: {dict(model.config)}")
    cuda = lambda name, dtype=None: tensors[name].to("cuda", dtype) if name in tensors else None
    with torch.inference_mode():
        # diffpipe casts the three activations to the run dtype and scales timestep and guidance by 1000 after
        # rounding them to it, as diffusers does inside forward.
        theirs = model(hidden_states=cuda("input.hidden_states", torch.bfloat16),
                       encoder_hidden_states=cuda("input.encoder_hidden_states", torch.bfloat16),
                       pooled_projections=cuda("input.pooled_projections", torch.bfloat16),
                       timestep=cuda("input.timestep"), guidance=cuda("input.guidance"),
                       img_ids=cuda("input.img_ids"), txt_ids=cuda("input.txt_ids"), return_dict=False)[0]
    theirs = theirs.float().cpu()
    if ours.shape != theirs.shape:
        fail(f"output shapes differ: diffpipe {tuple(ours.shape)}, diffusers {tuple(theirs.shape)}")
    if not torch.isfinite(ours).all() or not torch.isfinite(theirs).all():
        fail(f"non-finite outputs: diffpipe {int((~torch.isfinite(ours)).sum())}, diffusers "
             f"{int((~torch.isfinite(theirs)).sum())} elements")
    scale = theirs.abs().max().item()
    error = (ours - theirs).abs().max().item() / scale
    mean_error = (ours - theirs).abs().mean().item() / theirs.abs().mean().item()
    print(f"FLUX.1-dev architecture, bf16 on CUDA, {args.height}x{args.width}, {args.text_len} text tokens: "
          f"diffpipe vs diffusers max difference {error:.3g} of the output scale ({scale:.3g}), mean {mean_error:.3g} "
          f"of the mean magnitude; tolerances {args.tolerance:g} and {args.mean_tolerance:g}")
    if not error <= args.tolerance:
        fail(f"diffpipe's full-size output differs from diffusers' by {error:.3g} of the scale (> {args.tolerance:g})")
    if not mean_error <= args.mean_tolerance:
        fail(f"diffpipe's full-size output differs from diffusers' by {mean_error:.3g} on average "
             f"(> {args.mean_tolerance:g})")


if __name__ == "__main__":
    main()
