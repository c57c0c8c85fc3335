#!/usr/bin/env python3
"""The folders `diffpipe make-tiny` and `diffpipe make-random --pipeline` write, loaded by the pinned
diffusers/transformers as a user would load them (from_pretrained, eval mode), with nothing of ours in the
comparison: every weight component must load with no missing, unexpected or mismatched key (and be stored in
the dtype asked for), the tokenizers and the scheduler must load, and FluxPipeline.from_pretrained must assemble the whole
folder. The C++ fixture tests cannot show this: they compare the stored keys with the same shape lists the
writer used.

make-tiny is loaded in full (fp32 and bf16 folders). make-random's full-size folders (FLUX.1-dev and
FLUX.1-schnell, headers only: --sparse) are too large to load here: CLIP and the VAE load in full (zeros from
the sparse files), T5-XXL through transformers' from_pretrained(device_map="meta") (its key matching and shape
checks without reading the data), and the 12B transformer, which diffusers would read in full even onto the
meta device (about 2 minutes and the machine's memory), is built empty by diffusers from the config.json
written and compared key by key and shape by shape with the stored headers.

Needs DIFFPIPE_BINARY (the built diffpipe). Exits non-zero with a line naming the first failed check."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import accelerate
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from safetensors import safe_open
from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5Tokenizer

MODEL_CLASSES = {"text_encoder": CLIPTextModel, "text_encoder_2": T5EncoderModel,
                 "transformer": FluxTransformer2DModel, "vae": AutoencoderKL}
STORED_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")


def stored_tensors(component_dir):
    """name -> (dtype, shape) from the safetensors headers of a component folder (no data read)."""
    tensors = {}
    for path in sorted(component_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                tensors[name] = (piece.get_dtype(), tuple(piece.get_shape()))
    if not tensors:
        fail(f"{component_dir}: no safetensors file")
    return tensors


def load_component(folder, name, on_meta):
    """from_pretrained of one component; fails on any key the loader had to skip, invent or reshape."""
    cls = MODEL_CLASSES[name]
    extra = {"device_map": "meta"} if on_meta else {}
    try:
        model, info = cls.from_pretrained(str(folder / name), output_loading_info=True, **extra)
    except Exception as e:  # a shape mismatch raises; anything else is a failure to load as well
        fail(f"{folder.name}/{name}: {cls.__name__}.from_pretrained raised {type(e).__name__}: {str(e)[:400]}")
    problems = {key: sorted(info[key]) for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
                if info.get(key)}
    if problems:
        fail(f"{folder.name}/{name}: {cls.__name__}.from_pretrained reports {problems}")
    return model.eval()


def empty_model(folder, name):
    """The component as diffusers builds it from the config.json written, before it reads any weight."""
    cls = MODEL_CLASSES[name]
    with accelerate.init_empty_weights():
        return cls.from_config(cls.load_config(str(folder / name))).eval()


def check_component(folder, name, dtype_name, how):
    """how: "load" (from_pretrained), "meta" (from_pretrained onto the meta device) or "empty" (built from the
    config, compared with the headers: every parameter and buffer of the model must be stored)."""
    model = empty_model(folder, name) if how == "empty" else load_component(folder, name, how == "meta")
    stored = stored_tensors(folder / name)
    dtypes = {d for d, _ in stored.values()}
    expected_tag = {"fp32": "F32", "bf16": "BF16"}[dtype_name]
    if dtypes != {expected_tag}:
        fail(f"{folder.name}/{name}: stored dtypes {sorted(dtypes)}, expected only {expected_tag}")
    # Every stored tensor is a parameter or buffer of the model, at the model's shape; the loader said no key
    # is missing, so together the stored keys are exactly the model's (tied copies such as T5's
    # encoder.embed_tokens.weight come from shared.weight).
    state = model.state_dict()
    if how == "empty":
        missing = sorted(set(state) - set(stored))
        if missing:
            fail(f"{folder.name}/{name}: {type(model).__name__} built from config.json has {len(missing)} "
                 f"tensor(s) the folder does not store: {missing[:5]}")
    for key, (_, shape) in stored.items():
        if key not in state:
            fail(f"{folder.name}/{name}: stored tensor {key} is not in {type(model).__name__}")
        if tuple(state[key].shape) != shape:
            fail(f"{folder.name}/{name}: {key} stored as {shape}, the model has {tuple(state[key].shape)}")
    way = {"load": "loads", "meta": "loads (meta device)", "empty": "built empty from config.json matches"}[how]
    print(f"  {name}: {type(model).__name__} {way} {len(stored)} stored tensors, none missing, unexpected or "
          f"mismatched")
    return model


def check_folder(folder, dtype_name, how=None):
    index = json.loads((folder / "model_index.json").read_text())
    components = {}
    for name in MODEL_CLASSES:
        if index.get(name, [None])[1] != MODEL_CLASSES[name].__name__:
            fail(f"{folder.name}/model_index.json: {name} is {index.get(name)}, expected {MODEL_CLASSES[name].__name__}")
        components[name] = check_component(folder, name, dtype_name, (how or {}).get(name, "load"))
    tokenizer = CLIPTokenizer.from_pretrained(str(folder / "tokenizer"))
    tokenizer_2 = T5Tokenizer.from_pretrained(str(folder / "tokenizer_2"))
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(str(folder / "scheduler"))
    if tokenizer("a cat").input_ids[-1] != tokenizer.eos_token_id or tokenizer_2("a cat").input_ids[-1] != tokenizer_2.eos_token_id:
        fail(f"{folder.name}: the tokenizers do not end a prompt with their eos token")
    # The whole folder through FluxPipeline, as a user loads it (the components too large for this machine
    # passed in, checked above).
    passed = {name: components[name] for name in (how or {})}
    pipe = FluxPipeline.from_pretrained(str(folder), dtype=STORED_DTYPES[dtype_name], **passed)
    for name, cls in MODEL_CLASSES.items():
        if not isinstance(getattr(pipe, name), cls):
            fail(f"{folder.name}: FluxPipeline.{name} is {type(getattr(pipe, name)).__name__}")
    print(f"  FluxPipeline.from_pretrained assembles the folder: tokenizers {type(pipe.tokenizer).__name__}, "
          f"{type(pipe.tokenizer_2).__name__}; scheduler {type(pipe.scheduler).__name__} "
          f"(shift {scheduler.config.shift}, dynamic {scheduler.config.use_dynamic_shifting})")
    return pipe


def main():
    binary = os.environ.get("DIFFPIPE_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        fail("set DIFFPIPE_BINARY to the built diffpipe executable")
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="diffpipe-fixtures-") as tmp:
        tmp = pathlib.Path(tmp)
        for dtype_name in ("fp32", "bf16"):
            folder = tmp / f"tiny-{dtype_name}"
            run([binary, "make-tiny", "--out", str(folder), "--dtype", dtype_name])
            print(f"make-tiny --dtype {dtype_name}:")
            check_folder(folder, dtype_name)
        for arch in ("flux-dev", "flux-schnell"):
            folder = tmp / arch
            run([binary, "make-random", "--pipeline", "--sparse", "--arch", arch, "--dtype", "bf16", "--out", str(folder)])
            print(f"make-random --pipeline --sparse --arch {arch} --dtype bf16:")
            pipe = check_folder(folder, "bf16", how={"text_encoder_2": "meta", "transformer": "empty"})
            guidance = pipe.transformer.config.guidance_embeds
            if guidance != (arch == "flux-dev"):
                fail(f"{arch}: transformer guidance_embeds is {guidance}")
    print("every fixture folder loads in diffusers/transformers")


if __name__ == "__main__":
    main()
